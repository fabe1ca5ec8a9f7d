"""An arm part of another package (examples/custom_arm), installed for real with pip into a
folder on PYTHONPATH: the arm ``cooldown`` is found through the entry point group
``srollout.arms`` and runs in ``srollout ab-rollout`` without a change to srollout."""

from __future__ import annotations

import polars as pl

from srollout.schemas import AB, AB_ARMS, read
from tests.integration.test_custom_gate import _srollout, install_example

# the planner with half its actions random: no LM, seconds
AB_RUN = ["ab-rollout", "--policy", "noisy-expert", "--eps", "0.5", "--groups", "6", "--G", "3"]
AB_RUN += ["--T-max", "8", "--repeats", "2", "--n-boot", "50", "--arms", "baseline,cooldown"]


def test_an_arm_part_of_another_package_loads_by_its_entry_point_and_skips(tmp_path):
    site = install_example("custom_arm", tmp_path)
    assert (site / "cooldown_arm.py").exists()

    # without the package the arm is unknown: one line that names the entry point group
    res = _srollout(*AB_RUN, "--out", tmp_path / "no-package")
    assert res.returncode == 2 and "unknown arm 'cooldown'" in res.stderr
    assert "srollout.arms" in res.stderr and len(res.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "no-package").exists()

    res = _srollout(*AB_RUN, "--out", tmp_path / "ab", site=site)
    assert res.returncode == 0, res.stderr[-2000:]
    ab = read(tmp_path / "ab" / "ab.parquet", AB).filter(pl.col("arm") == "cooldown")
    first = ab.filter(pl.col("repeat") == 0).sort("group_id")
    second = ab.filter(pl.col("repeat") == 1).sort("group_id")
    # repeat 0 has no history: nothing skipped; repeat 1 rests exactly the tasks whose group of
    # repeat 0 gave no gradient (zero variance), each at zero cost
    assert not first["skipped"].any()
    no_gradient = first.filter(pl.col("zero_var"))["task_id"].to_list()
    assert second.filter(pl.col("skipped"))["task_id"].to_list() == no_gradient
    assert (second.filter(pl.col("skipped"))["n_steps"] == 0).all()
    arms = read(tmp_path / "ab" / "arms.parquet", AB_ARMS).filter(pl.col("arm") == "cooldown")
    assert arms["skipped"].to_list() == [len(no_gradient)]
    assert "cooldown" in (tmp_path / "ab" / "report.md").read_text()
