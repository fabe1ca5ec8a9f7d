"""End to end: `srollout collect` and `ab-rollout` with `--env` (your own environment), run as a
user runs them: the installed `srollout` script from the directory that holds the module, no
PYTHONPATH. The environment is examples/your_own_environment.py's key room; the planner expert
(no LM) makes every outcome a pure function of the seeds."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import polars as pl
import pytest

ROOT = Path(__file__).resolve().parents[2]
KEY_ROOM = "examples.your_own_environment:KEY_ROOM"


def srollout(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    for name in ("SROLLOUT_DEBUG", "PYTHONPATH"):
        env.pop(name, None)
    return subprocess.run(
        [str(Path(sys.executable).with_name("srollout")), *args],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        cwd=cwd,
    )


def test_collect_plays_your_env_by_module_attr(tmp_path):
    """3 eval tasks of the key room, G=2, the expert: every trajectory wins by putting the keychain
    in the safe, never faster than the shortest plan (eval/000: the keychain on the open shelf,
    go-take-go-open-move = 5 steps; eval/001 and 002: in a closed drawer, 6 steps); the expert's
    exploration (seeded) makes the rest: 12+5, 9+6, 7+6 = 45 steps."""
    out = tmp_path / "run"
    proc = srollout(
        "collect", "--env", KEY_ROOM, "--policy", "expert", "--groups", "3", "--G", "2",
        "--T-max", "12", "--signal-K", "2", "--out", str(out),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    trajs = pl.read_parquet(out / "trajectories.parquet").sort("group_id", "traj_idx")
    assert trajs["task_id"].to_list() == ["eval/000"] * 2 + ["eval/001"] * 2 + ["eval/002"] * 2
    assert trajs["task_type"].to_list()[::2] == ["key_on_shelf", "key_in_drawer", "key_in_drawer"]
    assert trajs["n_steps"].to_list() == [12, 5, 9, 6, 7, 6]
    assert trajs["reward"].to_list() == [1.0] * 6 and set(trajs["ended_by"]) == {"done"}
    steps = pl.read_parquet(out / "steps.parquet").sort("group_id", "traj_idx", "step")
    last = steps.group_by("group_id", "traj_idx", maintain_order=True).agg(pl.col("action").last())
    assert set(last["action"]) == {"move keychain 1 to safe 1"}
    groups = pl.read_parquet(out / "groups.parquet")
    assert groups["label"].to_list() == ["all_succeed"] * 3
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["config"]["env"] == KEY_ROOM and manifest["env"] == KEY_ROOM
    assert (
        f"environment `{KEY_ROOM}`, task set `eval`, policy `expert`"
        in (out / "report.md").read_text()
    )


def test_ab_rollout_plays_your_env(tmp_path):
    """Both arms roll the same 2 tasks with the same seeds; the gate at K=2 with d_L=1 cuts every
    group whose two prefixes are not entirely different, judged by the baseline arm."""
    out = tmp_path / "ab"
    proc = srollout(
        "ab-rollout", "--env", KEY_ROOM, "--policy", "noisy-expert", "--groups", "2", "--G",
        "2", "--T-max", "8", "--K", "2", "--d-L", "1.0", "--repeats", "1", "--blocks", "1",
        "--n-boot", "20", "--no-figures", "--no-warmup", "--out", str(out),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    ab = pl.read_parquet(out / "ab.parquet")
    assert ab.height == 4 and set(ab["arm"]) == {"baseline", "gated"}
    assert set(ab["task_id"]) == {"eval/000", "eval/001"}
    assert json.loads((out / "manifest.json").read_text())["env"] == KEY_ROOM


BROKEN = textwrap.dedent(
    """
    from srollout.envs.base import StepResult, Task
    from srollout.envs.registry import EnvSpec

    class NoStep:
        def reset(self, task, seed):
            return "o", StepResult("o", 0.0, False, True, ())
        def close(self):
            pass

    class ResetGivesText(NoStep):
        def step(self, action):
            return StepResult("o", 0.0, False, True, ())
        def reset(self, task, seed):
            return "o"

    TASKS = {"eval": [Task("e/0", "t", "win", "")]}
    NO_STEP = EnvSpec("no-step", NoStep, TASKS)
    BAD_RESET = EnvSpec("bad-reset", ResetGivesText, TASKS)
    """
)


@pytest.mark.parametrize(
    ("env", "line"),
    [
        (
            "no-such-env",
            "error: --env 'no-such-env': no such environment (known: alfworld, gem:<game id>, "
            "textarena:<game id>; or give package.module:attr)",
        ),
        (
            "broken_env:NO_STEP",
            "error: environment 'no-step': NoStep does not implement the TextEnv protocol (no "
            "step; see srollout.envs.base.TextEnv)",
        ),
        (
            "broken_env:BAD_RESET",
            "error: environment 'bad-reset': reset(task, seed) must return (observation: str, "
            "StepResult), got str",
        ),
    ],
)
@pytest.mark.parametrize("command", ["collect", "ab-rollout"])
def test_an_unknown_env_or_one_off_the_protocol_is_one_line_and_nothing_written(
    tmp_path, env, line, command
):
    (tmp_path / "broken_env.py").write_text(BROKEN)
    out = tmp_path / "run"
    proc = srollout(
        command, "--env", env, "--policy", "expert", "--groups", "1", "--G", "2", "--out",
        str(out), cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [line]
    assert not out.exists()


@pytest.mark.parametrize(
    ("env", "sets", "line"),
    [
        (
            "no-such-env",
            (),
            "error: --env 'no-such-env': no such environment (known: alfworld, gem:<game id>, "
            "textarena:<game id>; or give package.module:attr)",
        ),
        (
            "broken_env:NO_STEP",
            ("--train-set", "eval", "--eval-set", "eval"),
            "error: environment 'no-step': NoStep does not implement the TextEnv protocol (no "
            "step; see srollout.envs.base.TextEnv)",
        ),
        (
            "broken_env:BAD_RESET",
            ("--train-set", "eval"),
            "error: environment 'bad-reset' has no task set 'heldout' (it has: eval)",
        ),
    ],
)
def test_train_onpolicy_refuses_a_bad_env_before_writing(tmp_path, env, sets, line):
    """train-onpolicy --env checks the same way, with its --train-set / --eval-set (the tiny
    preset's held-out set is `heldout`, which the broken module lacks)."""
    (tmp_path / "broken_env.py").write_text(BROKEN)
    out = tmp_path / "run"
    proc = srollout(
        "train-onpolicy", "--preset", "tiny", "--env", env, "--seeds", "7", *sets, "--out",
        str(out), cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [line]
    assert not out.exists()
