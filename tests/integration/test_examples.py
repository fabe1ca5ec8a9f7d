"""The examples CI runs on tiny settings: they must keep working as the library changes."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_gate_in_your_trainer_cuts_only_zero_variance_groups_and_saves_steps():
    out = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "gate_in_your_trainer.py"), "--groups", "30"],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout
    found = re.search(r"cut (\d+) \(of which (\d+) had reward variance\)", out)
    cut, wrong = map(int, found.groups())
    full, gated = map(int, re.search(r"steps: (\d+) without the gate, (\d+) with it", out).groups())
    assert cut > 0 and wrong == 0
    assert gated < full


@pytest.mark.slow  # ~21 s: TRL trains the shipped policy for two steps
def test_trl_example_trains_two_steps_with_the_gate(tmp_path):
    """examples/trl_grpo_alfworld.py on tiny settings: real TRL, the shipped policy, ALFWorld. A
    gate at K=2 with d_L=1 cuts every group whose prefixes are not all different; the summary's
    totals are the sums of what TRL logged per step."""
    import json

    out = tmp_path / "trl"
    subprocess.run(
        [
            sys.executable,
            str(ROOT / "examples" / "trl_grpo_alfworld.py"),
            "--steps",
            "2",
            "--groups",
            "2",
            "--G",
            "4",
            "--T-max",
            "4",
            "--K",
            "2",
            "--d-L",
            "1.0",
            "--tasks",
            "4",
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        check=True,
    )
    summary = json.loads((out / "srollout-summary.json").read_text())
    assert summary["groups"] == 4 and len(summary["per_step"]) == 2
    assert sum(s["gate/groups_cut"] for s in summary["per_step"]) == summary["groups_cut"]
    assert sum(s["rollout/gen_tokens"] for s in summary["per_step"]) == summary["gen_tokens"]
    # a cut group stops at K=2: at most G x K steps; a kept one plays up to T_max=4
    cut = summary["groups_cut"]
    assert summary["env_steps"] <= cut * 4 * 2 + (4 - cut) * 4 * 4
    assert summary["groups_cut"] >= 1  # d_K < 1 unless all 4 prefixes differ at every position
    assert 0 < summary["steps_saved_max"] <= summary["groups_cut"] * 4 * (4 - 2)


@pytest.mark.slow  # ~20 s: the demo script twice (collect, analyze, sweep, what-if; its resume)
def test_demo_pipeline_quick_runs_collect_analyze_sweep_what_if(tmp_path):
    """`make demo`'s script on the real engine, quick settings, noisy expert (no model build)."""
    import os

    import polars as pl

    env = dict(
        os.environ,
        DEMO_QUICK="1",
        DEMO_POLICY="noisy-expert",
        SROLLOUT=str(Path(sys.executable).with_name("srollout")),
    )
    out = tmp_path / "demo"
    subprocess.run(
        ["bash", str(ROOT / "examples" / "demo.sh"), str(out)],
        env=env,
        check=True,
        capture_output=True,
        text=True,
        timeout=900,
    )
    groups = pl.read_parquet(out / "collect" / "groups.parquet")
    assert groups.height == 8 and groups["G"].to_list() == [8] * 8
    corr = pl.read_parquet(out / "analyze" / "correlation.parquet")
    assert set(corr["metric"]) >= {"prefix_edit_distance_mean", "termination_fraction"}
    sweep = pl.read_parquet(out / "sweep" / "sweep.parquet")
    assert (sweep["K"] == 10).any()
    # what-if on the collect just made: every method on its 8 groups; DAPO discards exactly the
    # zero-variance ones
    what_if = {
        r["method"]: r for r in pl.read_parquet(out / "what-if" / "what-if.parquet").to_dicts()
    }
    assert {"group gate", "trajectory gate", "DAPO", "GRESO"} <= set(what_if)
    assert what_if["DAPO"]["decisions"] == groups["zero_var"].sum()
    for stage in ("collect", "analyze", "sweep", "what-if"):
        assert (out / stage / "report.md").exists()
    # a second run continues the finished collect instead of refusing or redoing it
    subprocess.run(
        ["bash", str(ROOT / "examples" / "demo.sh"), str(out)],
        env=env,
        check=True,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert pl.read_parquet(out / "collect" / "groups.parquet").equals(groups)


def _own_env(tmp_path, *args: str) -> dict:
    import json

    out = tmp_path / "own"
    subprocess.run(
        [
            sys.executable,
            str(ROOT / "examples" / "your_own_environment.py"),
            "--out",
            str(out),
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=600,
        check=True,
    )
    return json.loads((out / "summary.json").read_text())


def test_your_own_environment_with_the_expert_wins_every_episode(tmp_path):
    """examples/your_own_environment.py with the planner expert (no LM, seeded): 4 eval tasks of
    the key room, G=2; every trajectory wins, so every group is all_succeed, and a gate at K=2
    with d_L=1 would cut exactly the groups whose two prefixes are not entirely different."""
    summary = _own_env(
        tmp_path, "--policy", "expert", "--groups", "4", "--G", "2", "--T-max", "12", "--K", "2",
        "--d-L", "1.0",
    )["collect"]  # fmt: skip
    assert summary["env"] == "key-room" and summary["groups"] == 4
    assert summary["labels"] == {"all_fail": 0, "mixed": 0, "all_succeed": 4}
    assert summary["wins"] == summary["trajectories"] == 8
    # eval/000-003 need at least 5, 6, 6, 5 steps (the shortest plans): 2 x 22 = 44 at the least;
    # the expert's seeded exploration (pure Python random) adds 17
    assert summary["env_steps"] == 61 and summary["would_cut_mixed"] == 0


@pytest.mark.slow  # ~75 s on 2 loaded cores: the shipped policy rolls out, TRL trains a step
def test_your_own_environment_with_the_shipped_policy_and_trl(tmp_path):
    """The shipped ALFWorld policy in the key room (tiny settings), then one TRL GRPO step through
    GatedRollout.from_env: the policy wins some episodes, and the tables agree with themselves."""
    summary = _own_env(
        tmp_path, "--groups", "4", "--G", "4", "--T-max", "12", "--K", "3", "--trl-steps", "1",
    )  # fmt: skip
    c = summary["collect"]
    assert c["env"] == "key-room" and c["groups"] == 4 and c["trajectories"] == 16
    assert sum(c["labels"].values()) == 4 and c["wins"] > 0
    assert c["labels"]["all_succeed"] * 4 <= c["wins"] <= 16 - 4 * c["labels"]["all_fail"]
    assert c["env_steps"] <= 16 * 12
    trl = summary["trl"]
    assert trl["steps"] == 1 and trl["groups"] == 2 and 0 <= trl["cut"] <= 2
    assert 0 < trl["env_steps"] <= 2 * 4 * 12


def test_your_own_signal_prototypes_a_signal_beside_the_registered_ones():
    """examples/your_own_signal.py: its signal by hand, then the script on a real collect."""
    import importlib.util

    from srollout.core.signals import AGREEMENT_SIGNALS, group_at_K

    spec = importlib.util.spec_from_file_location("own", ROOT / "examples" / "your_own_signal.py")
    own = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(own)
    # steps 1-2 alike, step 3 not: 2 of K = 3; an ended trajectory's END differs from acting
    assert own.shared_opening(group_at_K([["a", "b", "c"], ["a", "b", "d"]], 3)) == 2 / 3
    assert own.shared_opening(group_at_K([["a", "b"], ["a", "b"]], 2)) == 1.0
    assert own.shared_opening(group_at_K([["a"], ["a", "b"]], 2, done=[True, False])) == 1 / 2

    out = subprocess.run(
        [
            sys.executable,
            str(ROOT / "examples" / "your_own_signal.py"),
            "--groups",
            "8",
            "--K",
            "4",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    ).stdout
    assert re.search(r"^8 groups at K = 4, \d+ zero-variance$", out, re.M)
    rows = dict(re.findall(r"^(\w+)\s+([0-9.]+)\s", out, re.M))
    assert set(rows) == {*AGREEMENT_SIGNALS, "shared_opening"}
    assert all(0.0 <= float(v) <= 1.0 for v in rows.values())  # every signal's mean in [0, 1]
