"""End to end: `srollout train-onpolicy --preset tiny` with the shipped default policy on the
real ALFWorld engine (both arms, one seed), and the one-line errors of bad options."""

from __future__ import annotations

import json
import re
from pathlib import Path

import polars as pl
import pytest
import torch

from srollout import schemas

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def real_model(default_model) -> Path:
    """The default policy the package ships."""
    return default_model


def test_train_onpolicy_tiny_preset_end_to_end(run_cli, real_model, tmp_path):
    out = tmp_path / "run"
    res = run_cli(
        "train-onpolicy",
        "--preset",
        "tiny",
        "--seeds",
        "7",
        "--model",
        real_model,
        "--iterations",
        "2",
        "--n-eval",
        "2",
        "--no-interleave",
        "--out",
        out,
    )
    assert res.exit_code == 0, res.stderr[-2000:]
    m = schemas.read(out / "metrics.parquet", schemas.METRICS)
    ev = schemas.read(out / "eval.parquet", schemas.EVAL)
    # tiny preset: 2 prompts x G=4 per iteration, T_max 4, gate at K=2; eval at 0 and at the end
    assert sorted(m["arm"].unique().to_list()) == ["baseline", "gated"] and m.height == 4
    assert (m["rollout/groups"] == 2).all()
    assert (m.filter(pl.col("arm") == "baseline")["gate/cuts"] == 0).all()
    assert (m["train/trajectories"] == 4 * m["gate/kept"]).all()
    assert sorted(ev["iteration"].unique().to_list()) == [0, 2] and ev.height == 2 * 2 * 2
    assert ev["task_id"].str.starts_with("heldout/").all()
    # iteration 0 is the same base policy in both arms
    e0 = ev.filter(pl.col("iteration") == 0).sort("arm", "task_id")
    assert (
        e0.filter(pl.col("arm") == "baseline")["success"].to_list()
        == e0.filter(pl.col("arm") == "gated")["success"].to_list()
    )
    for name in (
        "onpolicy.png",
        "mechanism.png",
        "report.md",
        "summary.json",
        "summary_per_seed.parquet",
        "tests.parquet",
    ):
        assert (out / name).exists(), name
    for arm in ("baseline", "gated"):
        assert (out / "adapters" / f"seed7-{arm}" / "adapter_config.json").exists()
        assert (out / "checkpoints" / f"seed7-{arm}" / "state.pt").exists()
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["status"] == "complete" and manifest["config"]["preset"] == "tiny"
    assert manifest["config"]["lora_r"] == 16 and manifest["config"]["G"] == 4
    assert "dilution prediction" in (out / "report.md").read_text()
    # resuming a finished run changes nothing and trains nothing
    again = run_cli(
        "train-onpolicy",
        "--preset",
        "tiny",
        "--seeds",
        "7",
        "--model",
        real_model,
        "--iterations",
        "2",
        "--n-eval",
        "2",
        "--out",
        out,
        "--resume",
    )  # interleaved now: must not matter
    assert again.exit_code == 0, again.stderr[-2000:]
    m2 = schemas.read(out / "metrics.parquet", schemas.METRICS)
    assert m2.equals(m)


def test_train_onpolicy_dapo_and_greso_arms_end_to_end(run_cli, real_model, tmp_path):
    """One seed, arms gated+dapo and greso on the real engine: DAPO's rounds and GRESO's skips are
    logged, the per-arm table is written and printed."""
    out = tmp_path / "run"
    res = run_cli(
        "train-onpolicy",
        "--preset",
        "tiny",
        "--seeds",
        "7",
        "--model",
        real_model,
        "--iterations",
        "2",
        "--n-eval",
        "1",
        "--arms",
        "gated+dapo,greso",
        "--dapo-max-rounds",
        "1",
        "--out",
        out,
    )
    assert res.exit_code == 0, res.stderr[-2000:]
    m = schemas.read(out / "metrics.parquet", schemas.METRICS)
    assert sorted(m["arm"].unique().to_list()) == ["gated+dapo", "greso"] and m.height == 4
    d = m.filter(pl.col("arm") == "gated+dapo")
    assert d["gate/dapo_rounds"].is_between(1, 2).all()
    assert (d["gate/kept"] == d["gate/useful"]).all() and (d["gate/kept"] <= 2).all()
    assert ((d["gate/kept"] == 2) | d["gate/dapo_hit_cap"] | (d["rollout/groups"] == 4)).all()
    g = m.filter(pl.col("arm") == "greso")
    assert (g["rollout/groups"] + g["gate/skipped"] == 2).all()
    assert (g["gate/dapo_rounds"] == 1).all()
    arms = pl.read_parquet(out / "summary_arms.parquet")
    assert arms["arm"].to_list() == ["gated+dapo", "greso"] and (arms["n_seeds"] == 1).all()
    assert "useful groups / s" in (out / "report.md").read_text() and "arms (mean" in res.stdout
    assert (out / "checkpoints" / "seed7-greso" / "greso.json").exists()


@pytest.mark.parametrize(
    "args, message",
    [
        (["--seeds", "7,x"], "--seeds"),
        (["--seeds", "7,7"], "--seeds"),
        (["--seeds", "-1"], "--seeds"),
        (["--seeds", ""], "--seeds"),
        (["--preset", "huge"], "--preset"),
        (["--K", "9", "--T-max", "4"], "larger than --T-max"),
        (["--arms", "baseline,other"], "--arms"),
        (["--arms", "dapo,dapo"], "--arms"),
        (["--arm", "gated+dapo", "--dapo-max-rounds", "-1"], "--dapo-max-rounds"),
        (["--arm", "greso", "--greso-p-explore", "1.5"], "--greso-p-explore"),
        (["--G", "1"], "--G must be >= 2"),
        (["--resume"], "--resume"),
    ],
)
def test_bad_options_are_one_line_and_exit_2(run_cli, tmp_path, args, message):
    res = run_cli("train-onpolicy", "--preset", "tiny", *args)
    assert res.exit_code == 2, res.stdout[-500:]
    assert message in res.stderr and "Traceback" not in res.stderr


@pytest.mark.slow
def test_kill_9_then_resume_equals_an_uninterrupted_run(run_cli, real_model, tmp_path):
    """A real SIGKILL mid-run (after iteration 2 of the first arm is checkpointed), then
    --resume."""
    import os
    import signal
    import subprocess
    import sys
    import time

    root = Path(__file__).resolve().parents[2]
    args = [
        "train-onpolicy",
        "--preset",
        "tiny",
        "--seeds",
        "7",
        "--model",
        str(real_model),
        "--iterations",
        "4",
        "--n-eval",
        "2",
    ]
    killed = tmp_path / "killed"
    env = {**os.environ, "PYTHONPATH": str(root), "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "srollout.cli.app", *args, "--out", str(killed)],
        cwd=root,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    state = killed / "checkpoints" / "seed7-baseline" / "state.pt"
    deadline = time.time() + 240
    try:
        while time.time() < deadline and proc.poll() is None:
            if state.exists() and torch.load(state, weights_only=False)["iteration"] >= 2:
                break
            time.sleep(0.2)
        assert proc.poll() is None, "the run ended before it could be killed"
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert json.loads((killed / "manifest.json").read_text())["status"] == "partial"
    res = run_cli(*args, "--out", killed, "--resume")
    assert res.exit_code == 0, res.stderr[-2000:]
    # the resumed run's bar counts only what the kill left: 8 arm-iterations less those done
    closing = [ln for ln in res.stdout.splitlines() if ln.startswith("train-onpolicy: ")][-1]
    done, total = map(int, re.match(r"train-onpolicy: (\d+)/(\d+)", closing).groups())
    assert done == total and 0 < total <= 8 - 2
    full = tmp_path / "full"
    res = run_cli(*args, "--out", full)
    assert res.exit_code == 0, res.stderr[-2000:]
    timing = [c for c in pl.read_parquet(full / "metrics.parquet").columns if c.startswith("time/")]
    assert len(timing) == 7
    a = pl.read_parquet(killed / "metrics.parquet").drop(timing)
    b = pl.read_parquet(full / "metrics.parquet").drop(timing)
    assert a.height == 8 and a.equals(b)
    assert pl.read_parquet(killed / "eval.parquet").equals(pl.read_parquet(full / "eval.parquet"))


def test_presets_and_paper_defaults():
    from srollout.config import TrainOffpolicyConfig, TrainOnpolicyConfig

    assert TrainOnpolicyConfig() == TrainOnpolicyConfig.from_preset("default")
    default = TrainOnpolicyConfig()
    assert (default.iterations, default.prompts_per_iter, default.G, default.T_max) == (
        40,
        8,
        8,
        20,
    )
    assert (default.eval_every, default.n_eval, default.eval_set, default.lr) == (
        10,
        100,
        "eval",
        2e-4,
    )
    assert (
        default.denominator == "seq_mean"
    )  # the paper's sum-of-log-probs denominator diverged here
    paper = TrainOnpolicyConfig.from_preset("paper", seeds=(7, 13, 23, 42))
    assert (paper.iterations, paper.prompts_per_iter, paper.G, paper.T_max) == (60, 10, 8, 30)
    assert (paper.eval_every, paper.n_eval, paper.K, paper.d_L, paper.lr) == (
        10,
        50,
        10,
        0.12,
        5e-5,
    )
    assert (paper.lora_r, paper.lora_alpha, len(paper.lora_targets)) == (16, 32, 7)
    assert paper.denominator == "paper" and paper.clip_eps is None and paper.kl_coef == 0.0
    assert paper.eval_set == "eval"  # the paper's held-out split: valid_seen task instances
    assert TrainOnpolicyConfig.from_preset("tiny", G=6).G == 6  # an explicit option wins
    off = TrainOffpolicyConfig(buffer=Path("."))
    assert (off.steps, off.groups_per_step, off.turns_per_traj, off.max_items) == (20, 4, 8, 128)
    assert (off.lora_r, off.lora_alpha, off.lora_targets, off.lr, off.seed) == (
        8,
        16,
        ("q_proj", "v_proj"),
        5e-5,
        42,
    )
