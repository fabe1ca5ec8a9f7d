"""kill -9 during `srollout collect`, then --resume: exactly the groups and rows of an
uninterrupted run with the same seed (timing columns aside). A real process, a real SIGKILL, at an
exact point (frozen_run: the process stops itself there, no polling)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest
from frozen_run import signal_when_frozen

from srollout.rollout.records import TIMING_COLUMNS

ROOT = Path(__file__).resolve().parents[2]
ARGS = [
    "collect",
    "--policy",
    "noisy-expert",
    "--groups",
    "10",
    "--G",
    "3",
    "--T-max",
    "8",
    "--concurrency",
    "6",
    "--seed",
    "7",
    "--signal-K",
    "3,5",
]
TABLES = ("steps", "trajectories", "groups", "signals")


def _env() -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    env.pop("SROLLOUT_DEBUG", None)
    return env


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "srollout.cli.app", *args],
        capture_output=True,
        text=True,
        timeout=300,
        env=_env(),
        cwd=ROOT,
    )


def _finished(run: Path) -> list[str]:
    parts = run / "parts"
    return [p.name for p in parts.iterdir() if not p.name.startswith(".")] if parts.exists() else []


def _table(run: Path, name: str) -> pl.DataFrame:
    df = pl.read_parquet(run / f"{name}.parquet")
    return df.drop([c for c in df.columns if c in TIMING_COLUMNS])


def _kill_then_resume(tmp_path: Path, args: list[str], n_groups: int) -> Path:
    """Run ``args`` to the end; run them again, SIGKILL once 2 parts exist, --resume; compare."""
    ref, cut = tmp_path / "ref", tmp_path / "cut"
    done = _run(*args, "--out", str(ref))
    assert done.returncode == 0, done.stderr[-2000:]

    # frozen right after its second group's part was written, then killed: exactly 2 parts
    after_two_parts = ("srollout.stages.collect", "write_part", 2)
    rc = signal_when_frozen([*args, "--out", str(cut)], after_two_parts, _env(), ROOT)
    assert rc == -signal.SIGKILL and len(_finished(cut)) == 2 < n_groups, rc
    assert not (cut / "groups.parquet").exists()

    resumed = _run(*args, "--out", str(cut), "--resume")
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert "kept from the interrupted run" in resumed.stdout
    for name in TABLES:
        a, b = _table(ref, name), _table(cut, name)
        assert a.height == b.height and a.equals(b), name
    groups = pl.read_parquet(cut / "groups.parquet")
    assert groups["group_id"].to_list() == [f"g{i:05d}" for i in range(n_groups)]
    return cut


@pytest.mark.slow  # ~9 s: three collects in real processes
def test_kill_9_then_resume_equals_an_uninterrupted_run(tmp_path):
    cut = _kill_then_resume(tmp_path, ARGS, 10)
    # resuming a finished run changes nothing; a different config is refused
    again = _run(*ARGS, "--out", str(cut), "--resume")
    assert again.returncode == 0 and _table(cut, "steps").equals(_table(tmp_path / "ref", "steps"))
    other = _run(*[a if a != "7" else "8" for a in ARGS], "--out", str(cut), "--resume")
    assert other.returncode == 2 and "seed" in other.stderr


@pytest.mark.slow
def test_kill_9_then_resume_with_the_lm(tmp_path):
    """The same with the shipped default policy through the transformers backend (batch
    composition differs after the resume; per-trajectory seeds and per-row KV caches keep the
    tokens equal)."""
    args = [
        "collect",
        "--policy",
        "lm",
        "--model",
        "default",
        "--groups",
        "6",
        "--G",
        "3",
        "--T-max",
        "6",
        "--concurrency",
        "6",
        "--seed",
        "3",
        "--signal-K",
        "3,5",
        "--temperature",
        "1.0",
    ]
    cut = _kill_then_resume(tmp_path, args, 6)
    trajs = pl.read_parquet(cut / "trajectories.parquet")
    assert (trajs["token_ids"].list.len() > 0).all()
