"""A gate kind of another package (examples/custom_gate), installed for real with pip into a
folder on PYTHONPATH: a gate.json of its kind loads through the entry point group
``srollout.gates`` and cuts in ``srollout collect`` without a change to srollout."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import polars as pl

ROOT = Path(__file__).resolve().parents[2]
# the planner with half its actions random: no LM, seconds; signals at K = 4
COLLECT = ["collect", "--policy", "noisy-expert", "--eps", "0.5", "--groups", "8", "--G", "4"]
COLLECT += ["--T-max", "10", "--signal-K", "4"]


def _srollout(*args: str | Path, site: Path | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "COLUMNS": "200"}
    if site is not None:
        env["PYTHONPATH"] = os.pathsep.join([str(site), env.get("PYTHONPATH", "")])
    cmd = [sys.executable, "-m", "srollout.cli.app", *map(str, args)]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env, cwd=ROOT)


def install_example(name: str, tmp_path: Path) -> Path:
    """examples/<name> installed as pip would for a user, into a folder (a copy: pip builds in
    the tree); the folder, to put on PYTHONPATH."""
    src, site = tmp_path / name, tmp_path / "site"
    shutil.copytree(ROOT / "examples" / name, src)
    pip = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation"]
    subprocess.run([*pip, "--target", str(site), str(src)], check=True, capture_output=True)
    return site


def test_a_gate_kind_of_another_package_loads_by_its_entry_point_and_cuts(tmp_path):
    site = install_example("custom_gate", tmp_path)
    assert (site / "distinct_gate.py").exists()

    gate = tmp_path / "gate.json"
    gate.write_text(json.dumps({"kind": "distinct", "version": 1, "K": 4, "max_ratio": 0.8}))
    # without the package the kind is unknown: one line, nothing written
    res = _srollout(*COLLECT, "--gate", gate, "--out", tmp_path / "no-package")
    assert res.returncode == 2 and "unknown gate kind 'distinct'" in res.stderr
    assert "srollout.gates" in res.stderr and len(res.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "no-package").exists()

    # the same seeds without a gate: the unique-action ratios at K 4 the gate will read (hand
    # check of this run: 1.0 for groups 0, 2, 3, 5, 7 and 0.75 for 1, 4 and 6)
    res = _srollout(*COLLECT, "--out", tmp_path / "ungated")
    assert res.returncode == 0, res.stderr[-2000:]
    ratio = pl.read_parquet(tmp_path / "ungated" / "signals.parquet").filter(pl.col("K") == 4)
    ratio = dict(zip(ratio["group_id"], ratio["unique_action_ratio"], strict=True))
    expected = sorted(g for g, r in ratio.items() if r <= 0.8)
    assert expected == ["g00001", "g00004", "g00006"] and len(ratio) == 8

    res = _srollout(*COLLECT, "--gate", gate, "--out", tmp_path / "gated", site=site)
    assert res.returncode == 0, res.stderr[-2000:]
    groups = pl.read_parquet(tmp_path / "gated" / "groups.parquet").sort("group_id")
    assert groups.filter(pl.col("cut"))["group_id"].to_list() == expected
    assert set(groups.filter(pl.col("cut"))["cut_step"].to_list()) == {4}
    steps = pl.read_parquet(tmp_path / "gated" / "steps.parquet")
    cut_steps = steps.filter(pl.col("group_id").is_in(expected))["step"]
    assert cut_steps.max() == 4  # nothing generated after the cut
    manifest = json.loads((tmp_path / "gated" / "manifest.json").read_text())
    assert manifest["gate"]["kind"] == "distinct" and manifest["gate"]["max_ratio"] == 0.8
