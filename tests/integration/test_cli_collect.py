"""End to end: `srollout collect` on the real ALFWorld engine with the noisy expert (fast, no
LM)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest

from srollout.schemas import GROUPS, SIGNAL_NAMES, SIGNALS, STEPS, TRAJECTORIES, read

ROOT = Path(__file__).resolve().parents[2]


def srollout(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    env.pop("SROLLOUT_DEBUG", None)
    return subprocess.run(
        [sys.executable, "-m", "srollout.cli.app", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        cwd=ROOT,
    )


def test_quick_collect_with_the_noisy_expert(tmp_path):
    out = tmp_path / "run"
    proc = srollout("collect", "--policy", "noisy-expert", "--quick", "--G", "4", "--out", str(out))
    assert proc.returncode == 0, proc.stderr[-2000:]
    # --quick: 8 groups, T_max 15, so signals at 5, 10, 15 (20 > T_max is dropped)
    groups = read(out / "groups.parquet", GROUPS)
    trajs = read(out / "trajectories.parquet", TRAJECTORIES)
    steps = read(out / "steps.parquet", STEPS)
    signals = read(out / "signals.parquet", SIGNALS)
    assert groups["group_id"].to_list() == [f"g{i:05d}" for i in range(8)]
    assert trajs.height == 32 and steps.height == trajs["n_steps"].sum()
    assert signals.height == 8 * 3 and sorted(set(signals["K"])) == [5, 10, 15]
    assert steps["step"].max() <= 15
    # per trajectory: n_steps rows numbered 1..n; ended_by consistent with success and T_max
    per = steps.group_by("group_id", "traj_idx").agg(
        pl.len().alias("n"), pl.col("step").max().alias("last"), pl.col("reward").sum().alias("r")
    )
    joined = trajs.join(per, on=["group_id", "traj_idx"])
    assert (joined["n"] == joined["n_steps"]).all() and (joined["last"] == joined["n_steps"]).all()
    assert (joined["r"] == joined["reward"]).all()
    assert ((joined["ended_by"] == "done") == joined["success"]).all()
    assert (joined.filter(pl.col("ended_by") == "max_steps")["n_steps"] == 15).all()
    assert not groups["cut"].any() and groups["cut_step"].null_count() == 8
    # labels and variance from the trajectories' rewards (population variance)
    agg = trajs.group_by("group_id").agg(
        pl.col("reward").mean().alias("m"), pl.col("reward").var(ddof=0).alias("v")
    )
    check = groups.join(agg, on="group_id")
    assert (check["reward_mean"] - check["m"]).abs().max() < 1e-12
    assert (check["reward_var"] - check["v"]).abs().max() < 1e-12
    expected = [
        ("mixed" if v > 0 else ("all_succeed" if m >= 0.5 else "all_fail"))
        for m, v in zip(check["m"], check["v"], strict=True)
    ]
    assert check["label"].to_list() == expected
    assert all(signals[name].is_between(0.0, 1.0).all() for name in SIGNAL_NAMES)
    # the expert with eps=0.3 noise mostly succeeds, and its noise makes invalid actions rare
    assert trajs["success"].mean() > 0.5
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["status"] == "complete" and manifest["config"]["groups"] == 8
    assert manifest["config"]["T_max"] == 15
    assert "zero-variance rate" in (out / "report.md").read_text()
    assert "label all_fail" in proc.stdout and str(out) in proc.stdout
    # a second run into the same directory is refused without --overwrite
    again = srollout("collect", "--policy", "noisy-expert", "--quick", "--out", str(out))
    assert again.returncode == 2 and "--overwrite" in again.stderr


@pytest.mark.parametrize(
    "args, message",
    [
        (["--K", "20", "--T-max", "15"], "larger than --T-max"),
        (["--d-L", "1.5"], "--d-L"),
        (["--G", "1"], "--G must be >= 2"),
        (["--tasks", "no-such-set"], "no-such-set"),
        (["--model", "/no/such/model"], "/no/such/model"),
        (["--signal-K", "5,x"], "--signal-K"),
        (["--resume"], "--resume"),
        (["--difficulty", "huge"], "--difficulty: expected one of small, medium, large, full"),
        (["--tasks", "valid_seen", "--difficulty", "medium"], "has its own rooms"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(tmp_path, args, message):
    proc = srollout(
        "collect", "--policy", "noisy-expert", "--quick", "--out", str(tmp_path / "r"), *args
    )
    if args == ["--resume"]:
        proc = srollout("collect", "--policy", "noisy-expert", "--resume")
    assert proc.returncode == 2, proc.stderr
    assert message in proc.stderr
    assert "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


def test_gate_json_cuts_every_group_at_its_K(tmp_path):
    from srollout.core.gate import FixedGate

    gate = FixedGate(cut=True, K=3).save(tmp_path / "gate.json")
    out = tmp_path / "gated"
    proc = srollout(
        "collect",
        "--policy",
        "noisy-expert",
        "--groups",
        "3",
        "--G",
        "3",
        "--T-max",
        "8",
        "--signal-K",
        "2,3,5",
        "--gate",
        str(gate),
        "--out",
        str(out),
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    groups = read(out / "groups.parquet", GROUPS)
    trajs = read(out / "trajectories.parquet", TRAJECTORIES)
    assert (
        groups["cut"].all() and (groups["cut_step"] == 3).all() and (groups["arm"] == "gated").all()
    )
    # trajectories the expert finished before step 3 keep ended_by=done; the rest were stopped
    assert ((trajs["ended_by"] == "gate") == (trajs["n_steps"] == 3) & ~trajs["success"]).all()
    assert trajs["n_steps"].max() == 3
    signals = read(out / "signals.parquet", SIGNALS)
    assert sorted(set(signals["K"])) == [2, 3]  # K=5 is after the cut


def test_difficulty_picks_the_rooms_and_is_part_of_the_resume_key(tmp_path):
    args = [
        "collect",
        "--policy",
        "expert",
        "--groups",
        "2",
        "--G",
        "2",
        "--T-max",
        "3",
        "--signal-K",
        "2",
    ]
    runs = {}
    for difficulty in ("small", "medium"):
        runs[difficulty] = out = tmp_path / difficulty
        proc = srollout(*args, "--difficulty", difficulty, "--out", str(out))
        assert proc.returncode == 0, proc.stderr[-2000:]
        assert json.loads((out / "manifest.json").read_text())["config"]["difficulty"] == difficulty
        assert f"task set `eval` ({difficulty} rooms)" in (out / "report.md").read_text()
    # the same tasks and seeds, other games: the expert sees other rooms
    small, medium = (
        read(runs[d] / "steps.parquet", STEPS).sort("group_id", "traj_idx", "step")
        for d in ("small", "medium")
    )
    assert set(small["task_id"]) == set(medium["task_id"])
    assert small["observation"].to_list() != medium["observation"].to_list()
    # a medium run resumes only as a medium run
    refused = srollout(*args, "--out", str(runs["medium"]), "--resume")
    assert refused.returncode == 2 and "difficulty" in refused.stderr
    # a run made before --difficulty existed (no such key in its manifest) played small rooms
    # and still resumes without it
    path = runs["small"] / "manifest.json"
    manifest = json.loads(path.read_text())
    del manifest["config"]["difficulty"]
    path.write_text(json.dumps(manifest))
    resumed = srollout(*args, "--out", str(runs["small"]), "--resume")
    assert resumed.returncode == 0, resumed.stderr[-2000:]


def test_a_collect_resolves_each_input_once(run_cli, tmp_path, monkeypatch):
    """Follow one `collect --gate gate-stall.json` with the default LM: the model is resolved
    (and its files checked) once, the environment and its task set once, gate.json read once;
    the stage is handed the one plan (srollout.stages.rollout_setup.RolloutPlan)."""
    import srollout.core.gate as core_gate
    import srollout.envs.registry as registry
    import srollout.policy as policy
    import srollout.policy.model_files as model_files
    from srollout.core.trajectory_gate import StallGate

    calls: dict[str, int] = {}

    def counted(owner, name):
        real = getattr(owner, name)

        def wrapper(*args, **kwargs):
            calls[name] = calls.get(name, 0) + 1
            return real(*args, **kwargs)

        monkeypatch.setattr(owner, name, wrapper)

    for owner, name in [
        (policy, "resolve_model"),
        (model_files, "check_model_dir"),
        (registry, "resolve_env"),
        (registry.EnvSpec, "task_set"),
        (core_gate, "load_gate"),
    ]:
        counted(owner, name)
    gate = StallGate(W=2, k0=3).save(tmp_path / "gate-stall.json")
    out = tmp_path / "run"
    result = run_cli("collect", "--groups", "2", "--G", "2", "--T-max", "6", "--gate", gate,
                     "--workers", "1", "--out", out)  # fmt: skip
    assert result.exit_code == 0, result.stderr[-2000:]
    assert calls == {
        "resolve_model": 1,
        "check_model_dir": 1,
        "resolve_env": 1,
        "task_set": 1,
        "load_gate": 1,
    }
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["traj_gate"] == {"kind": "stall", "version": 1, "W": 2, "k0": 3}
    assert manifest["gate"] is None  # a stall gate.json turns no group gate on
