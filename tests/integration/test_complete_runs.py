"""analyze, sweep and what-if judge only complete runs, through one definition
(`srollout.rundir.require_complete`): a run whose trajectories a gate stopped is refused in one
line naming the count and the ungated alternative, and its ungated twin (same seed, no --stall)
still works. The bad inputs of issue 59 are one line, exit 2, nothing written: a truncated
steps.parquet under what-if, a stall grid beyond T_max, more folds than groups (what-if and
sweep alike)."""

from __future__ import annotations

import shutil

import polars as pl
import pytest
from test_cli_collect import srollout

RUN = ["--policy", "noisy-expert", "--eps", "0.6", "--groups", "6", "--G", "4", "--T-max", "12"]
RUN += ["--seed", "3", "--signal-K", "5"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("complete")
    ungated, stalled = root / "ungated", root / "stalled"
    proc = srollout("collect", *RUN, "--out", str(ungated))
    assert proc.returncode == 0, proc.stderr[-2000:]
    proc = srollout("collect", *RUN, "--stall", "3", "--stall-from", "5", "--out", str(stalled))
    assert proc.returncode == 0, proc.stderr[-2000:]
    return ungated, stalled


def _one_line(proc, out, *fragments: str) -> str:
    assert proc.returncode == 2, (proc.returncode, proc.stdout[-500:], proc.stderr[-2000:])
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:"), proc.stderr
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])
    assert not out.exists()
    return lines[0]


@pytest.mark.parametrize(
    "command",
    [
        ("analyze", "--K", "5"),
        ("sweep", "--K", "5", "--n-boot", "50"),
        ("sweep", "--K", "5", "--n-boot", "50", "--stall"),
        ("what-if", "--K", "5", "--n-boot", "50", "--n-folds", "3"),
    ],
    ids=["analyze", "sweep", "sweep-stall", "what-if"],
)
def test_a_stalled_run_is_refused_and_its_ungated_twin_is_judged(runs, tmp_path, command):
    ungated, stalled = runs
    n_stalled = int(
        (pl.read_parquet(stalled / "trajectories.parquet")["ended_by"] == "stalled").sum()
    )
    assert n_stalled > 0  # the stall rule fired: the refusal below is about something
    stage, *options = command
    out = tmp_path / "refused"
    _one_line(
        srollout(stage, str(stalled), *options, "--out", str(out)),
        out,
        f"a gate stopped or cut {n_stalled} of its 24 trajectories "
        f"(ended_by 'stalled': {n_stalled})",
        "rerun collect without --stall",
    )
    # a steps file of the run is judged with the run's trajectories
    if stage == "analyze":
        steps = str(stalled / "steps.parquet")
        _one_line(srollout(stage, steps, *options, "--out", str(out)), out, "ended_by 'stalled'")
    twin = tmp_path / "twin"
    proc = srollout(stage, str(ungated), *options, "--out", str(twin))
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert (twin / "manifest.json").exists()


def test_what_if_on_a_truncated_steps_table_is_one_line(runs, tmp_path):
    ungated, _ = runs
    broken = tmp_path / "broken"
    shutil.copytree(ungated, broken)
    data = (broken / "steps.parquet").read_bytes()
    (broken / "steps.parquet").write_bytes(data[: len(data) // 2])
    out = tmp_path / "w"
    proc = srollout("what-if", str(broken), "--K", "5", "--out", str(out))
    _one_line(proc, out, f"{broken / 'steps.parquet'}: not a readable Parquet file")


def test_a_stall_grid_beyond_T_max_is_one_line(runs, tmp_path):
    ungated, _ = runs
    out = tmp_path / "s"
    proc = srollout("sweep", str(ungated), "--K", "5", "--stall", "--stall-from-grid", "5,99",
                    "--out", str(out))  # fmt: skip
    _one_line(proc, out, "--stall-from-grid 99 is larger than --T-max 12")
    # the default grid (k0 up to 15) is cut to the run's T_max 12, not refused
    proc = srollout("sweep", str(ungated), "--K", "5", "--n-boot", "50", "--stall",
                    "--out", str(out))  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    froms = sorted(set(pl.read_parquet(out / "stall.parquet")["k0"].to_list()))
    assert froms == [1, 5, 8, 10, 12]


def test_what_if_with_more_folds_than_groups_is_one_line(runs, tmp_path):
    ungated, _ = runs
    out = tmp_path / "w"
    proc = srollout("what-if", str(ungated), "--K", "5", "--n-folds", "50", "--out", str(out))
    _one_line(proc, out, "--n-folds 50 is more than the 6 groups of", "--n-folds 6 or fewer")


def test_sweep_with_more_folds_than_groups_is_one_line(runs, tmp_path):
    ungated, _ = runs
    out = tmp_path / "s"
    # (--learned: test_cli_sweep_gates.py; this run has too few mixed groups for it)
    proc = srollout(
        "sweep", str(ungated), "--K", "5", "--stall", "--n-folds", "7", "--out", str(out)
    )
    _one_line(proc, out, "--n-folds 7 is more than the 6 groups of", "--n-folds 6 or fewer")


def test_a_stall_W_grid_beyond_T_max_is_one_line(runs, tmp_path):
    ungated, _ = runs
    out = tmp_path / "s"
    proc = srollout("sweep", str(ungated), "--K", "5", "--stall", "--stall-W-grid", "4,13",
                    "--out", str(out))  # fmt: skip
    _one_line(proc, out, "--stall-W-grid 13 is larger than --T-max 12")
