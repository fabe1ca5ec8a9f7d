"""The loop detector (gate kind ``loop``) end to end on the embedded default (the shipped policy
on the real ALFWorld engine, tiny settings): `collect` with a loop gate file ends exactly the
trajectories, at exactly the steps, where the rule re-applied to its own steps.parquet fires, and
where the offline evaluator finds it in the ungated twin; `what-if` and `sweep --stall` show the
loop row, judged by the full outcomes; bad input is one line and exit 2, nothing written."""

from __future__ import annotations

import json
import shutil

import numpy as np
import polars as pl
import pytest
from test_cli_collect import srollout

from srollout.core.stall_sweep import loop_stops
from srollout.core.trajectory_signals import LoopTracker, loop_fires
from srollout.stages.sweep_stall import load_loop_counts, load_trajectories

RUN = ["--groups", "3", "--G", "4", "--T-max", "16", "--seed", "0", "--signal-K", "5,10"]
KEYS = ["group_id", "traj_idx"]


def first_firing(steps: pl.DataFrame, k0: int) -> dict[tuple[str, int], int]:
    """The rule re-applied in plain Python: per trajectory, the first step t >= k0 at which it
    fires (0: never), from the steps' action, observation and valid."""
    out = {}
    for (g, i), d in steps.sort(*KEYS, "step").group_by(KEYS, maintain_order=True):
        tracker, fired = LoopTracker(), 0
        for t, (a, o, v) in enumerate(d.select("action", "observation", "valid").iter_rows(), 1):
            if loop_fires(t, tracker.step(a, o, v), k0) and not fired:
                fired = t
        out[(g, i)] = fired
    return out


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("loop")
    gate = root / "gate-loop.json"
    gate.write_text(json.dumps({"kind": "loop", "k0": 1}))
    out = {"gate": gate}
    for name, extra in (("ungated", []), ("looped", ["--gate", str(gate)])):
        out[name] = root / name
        proc = srollout("collect", *RUN, *extra, "--out", str(out[name]))
        assert proc.returncode == 0, proc.stderr[-2000:]
    return out


def test_collect_ends_exactly_where_the_rule_re_applied_to_its_steps_fires(runs):
    looped = runs["looped"]
    trajs = pl.read_parquet(looped / "trajectories.parquet").sort(KEYS)
    fired = first_firing(pl.read_parquet(looped / "steps.parquet"), k0=1)
    stalled = trajs["ended_by"] == "stalled"
    assert 0 < stalled.sum() < trajs.height  # some stop, not all: the test can fail both ways
    for r in trajs.iter_rows(named=True):
        first = fired[(r["group_id"], r["traj_idx"])]
        if r["ended_by"] == "stalled":  # stopped after the first step the rule fires at
            assert first == r["n_steps"], r
        else:  # the rule never fired while it went on (it may fire at its last step)
            assert first == 0 or first == r["n_steps"], r
    manifest = json.loads((looped / "manifest.json").read_text())
    assert manifest["traj_gate"] == {"kind": "loop", "version": 1, "k0": 1}


def test_the_stops_are_the_offline_rules_on_the_ungated_twin(runs):
    ungated, looped = runs["ungated"], runs["looped"]
    trajs = load_trajectories(ungated)
    expected = loop_stops(
        load_loop_counts(ungated, trajs.since_new.shape, "test"), trajs.n_steps, 1
    )
    cut = pl.read_parquet(looped / "trajectories.parquet").sort(KEYS)
    assert np.array_equal((cut["ended_by"] == "stalled").to_numpy(), expected > 0)
    assert np.array_equal(
        cut["n_steps"].to_numpy(), np.where(expected > 0, expected, trajs.n_steps)
    )


def test_what_if_and_sweep_show_the_loop_detector_judged_by_full_outcomes(runs, tmp_path):
    ungated = runs["ungated"]
    steps = pl.read_parquet(ungated / "steps.parquet")
    trajs = pl.read_parquet(ungated / "trajectories.parquet").sort(KEYS)
    fired = first_firing(steps, k0=1)
    stops = right = saved = 0
    for r in trajs.iter_rows(named=True):
        t = fired[(r["group_id"], r["traj_idx"])]
        if 0 < t < r["n_steps"]:  # asked only while it goes on
            stops, right, saved = stops + 1, right + (not r["success"]), saved + r["n_steps"] - t
    assert stops > 0
    proc = srollout("what-if", str(ungated), "--n-folds", "3", "--out", str(tmp_path / "w"))
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "loop detector" in proc.stdout
    row = pl.read_parquet(tmp_path / "w" / "what-if.parquet").filter(
        pl.col("method") == "loop detector"
    )
    assert row["setting"].to_list() == ["loop from 1"]
    assert (row["decisions"][0], row["right"][0]) == (stops, right)
    assert row["steps_saved"][0] == pytest.approx(saved / trajs["n_steps"].sum())
    proc = srollout(
        "sweep", str(ungated), "--stall", "--n-folds", "3", "--out", str(tmp_path / "s")
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    table = pl.read_parquet(tmp_path / "s" / "stall.parquet")
    loops = table.filter(pl.col("rule") == "loop")
    assert loops["k0"].to_list() == [1, 5, 8, 10, 12, 15] and loops["W"].null_count() == 6
    first = loops.row(0, named=True)
    assert (first["n_stops"], first["n_stops"] - first["n_false"]) == (stops, right)
    assert not loops["chosen"].any()  # a fixed baseline, never the chosen stall rule
    assert "loop detector from k0 1" in proc.stdout


def test_what_if_without_the_valid_column_names_it(runs, tmp_path):
    bare = tmp_path / "novalid"
    shutil.copytree(runs["ungated"], bare)
    steps = pl.read_parquet(bare / "steps.parquet").drop("valid")
    steps.write_parquet(bare / "steps.parquet")
    proc = srollout("what-if", str(bare), "--n-folds", "3", "--out", str(tmp_path / "w"))
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "no column(s) valid" in lines[0], proc.stderr
    assert "rejected actions" in lines[0]
    assert not (tmp_path / "w").exists()


@pytest.mark.parametrize(
    "body, message",
    [
        ({"kind": "loop"}, "gate is missing 'k0'"),
        ({"kind": "loop", "k0": 2.5}, "loop k0 must be an integer >= 1, got 2.5"),
        ({"kind": "loop", "k0": "3"}, "loop k0 must be an integer >= 1, got '3'"),
    ],
)
def test_a_bad_loop_gate_file_is_one_line(tmp_path, body, message):
    gate = tmp_path / "gate-loop.json"
    gate.write_text(json.dumps(body))
    out = tmp_path / "run"
    proc = srollout("collect", *RUN, "--gate", str(gate), "--out", str(out))
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0] and str(gate) in lines[0], proc.stderr
    assert not out.exists()


def test_the_loop_flag_is_the_gate_file(runs, tmp_path):
    out = tmp_path / "flag"
    proc = srollout("collect", *RUN, "--loop", "1", "--out", str(out))
    assert proc.returncode == 0, proc.stderr[-2000:]
    cols = ["group_id", "traj_idx", "ended_by", "n_steps", "reward", "n_gen_tokens"]
    by_flag = pl.read_parquet(out / "trajectories.parquet").select(cols).sort(KEYS)
    by_file = pl.read_parquet(runs["looped"] / "trajectories.parquet").select(cols).sort(KEYS)
    assert by_flag.equals(by_file)
    assert json.loads((out / "manifest.json").read_text())["traj_gate"]["kind"] == "loop"


def test_ab_rollout_loop_arm_stops_what_the_rule_finds_in_its_baseline_twin(tmp_path):
    out = tmp_path / "ab"
    args = ["--groups", "3", "--G", "4", "--T-max", "16", "--repeats", "1", "--blocks", "1"]
    args += ["--no-warmup", "--n-boot", "50", "--no-figures"]
    proc = srollout(
        "ab-rollout", *args, "--arms", "baseline,loop", "--loop", "2", "--out", str(out)
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    baseline, looped = out / "baseline" / "r0", out / "loop" / "r0"
    trajs = load_trajectories(baseline)
    counts = load_loop_counts(baseline, trajs.since_new.shape, "test")
    expected = loop_stops(counts, trajs.n_steps, 2)
    assert expected.any()
    cut = pl.read_parquet(looped / "trajectories.parquet").sort(KEYS)
    assert np.array_equal((cut["ended_by"] == "stalled").to_numpy(), expected > 0)
    # each stop judged by its baseline twin: right iff the twin failed
    arm = pl.read_parquet(out / "arms.parquet").filter(pl.col("arm") == "loop").row(0, named=True)
    assert arm["stalls"] == int((expected > 0).sum())
    assert arm["stall_fp"] == int(((expected > 0) & trajs.success).sum())
    assert arm["stall_tp"] + arm["stall_fp"] == arm["stalls"]
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["traj_gates"] == {"loop": {"kind": "loop", "version": 1, "k0": 2}}


@pytest.mark.parametrize(
    "args, message",
    [
        (["ab-rollout", "--arms", "baseline,loop", "--stall", "4"], "--stall is a stall arm's"),
        (["ab-rollout", "--arms", "baseline,loop", "--stall-from", "5"], "--stall-from is a stall"),
        (
            ["ab-rollout", "--arms", "baseline,stall", "--loop", "3"],
            "--loop sets the loop detector",
        ),
        (
            ["ab-rollout", "--arms", "baseline,loop", "--audit", "0.5"],
            "the loop arm's loop detector",
        ),
        (["collect", "--loop", "2", "--stall", "4"], "give either --stall W or --loop K0"),
        (["collect", "--loop", "40", "--T-max", "30"], "--loop 40 is larger than --T-max 30"),
        (["train-onpolicy", "--arms", "baseline,loop"], "--arms loop: the loop detector's arm"),
    ],
)
def test_bad_loop_options_are_one_line(tmp_path, args, message):
    out = tmp_path / "run"
    proc = srollout(*args, "--out", str(out))
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], proc.stderr
    assert not out.exists()
