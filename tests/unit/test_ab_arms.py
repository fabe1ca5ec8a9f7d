"""ab-rollout's DAPO and GRESO arms on the corridor env (tests/unit/corridor_env.py) with a
policy whose outcome is known by hand, and the one-line error of --workers without Ray.

The policy acts ``forward`` on even trajectories and ``wait`` on odd ones (1 and 2 generated
tokens). With G=2 and T_max=3, a corridor of length 1 is a *mixed* (useful) group: trajectory 0
wins at step 1, trajectory 1 waits 3 steps (4 env steps, 1 + 3·2 = 7 tokens); a corridor of
length 9 can never be won: zero variance (3 + 3 = 6 steps, 3·1 + 3·2 = 9 tokens).
"""

from __future__ import annotations

import json
import math
import re
import sys

import polars as pl
import pytest
from corridor_env import Corridor, tasks

from srollout.config import AbRolloutConfig
from srollout.core.arms import ArmSpec, parse_arm, skip_part
from srollout.errors import SrolloutError
from srollout.policy.base import ActResponse
from srollout.rollout.engine import make_specs
from srollout.schemas import AB, AB_ARMS, read
from srollout.stages.ab_rollout import load_greso_history, run_ab_rollout
from srollout.stages.ab_rollout.schedule import Block, extra_start

TIMING = ["wall_s", "gen_s", "env_s", "reset_s", "overhead_s", "group_wall_s"]


class Parity:
    """forward on even traj_idx (1 token), wait on odd (2 tokens)."""

    name = "parity"

    def act(self, requests):
        return [
            ActResponse("Action: forward", 3, 1)
            if r.key.traj_idx % 2 == 0
            else ActResponse("Action: wait", 3, 2)
            for r in requests
        ]

    def finish(self, key):
        return None


def _ab(tmp_path, lengths, groups, arms, name="ab", **kw):
    cfg = AbRolloutConfig(
        policy="noisy-expert",
        groups=groups,
        G=2,
        T_max=3,
        blocks=kw.pop("blocks", 1),
        repeats=kw.pop("repeats", 1),
        arms=arms,
        n_boot=20,
        figures=False,
        warmup=False,
        concurrency=4,
        out=tmp_path / name,
        **kw,
    )
    return run_ab_rollout(
        cfg, progress=False, policy=Parity(), env_factory=Corridor, tasks=tasks(lengths)
    )


def _arm(result, arm):
    return read(result.paths["ab"], AB).filter(pl.col("arm") == arm).sort("group_index")


def _arms(result):
    return {r["arm"]: r for r in read(result.paths["arms"], AB_ARMS).iter_rows(named=True)}


def test_dapo_at_its_cap_reports_it_and_keeps_what_it_has(tmp_path):
    # every corridor is 9 long: every group is zero-variance, so DAPO never fills its 2 useful
    # groups: round 0 (groups 0, 1) + 2 extra rounds of 2 groups (2, 3 then 4, 5), then the cap
    result = _ab(tmp_path, [9] * 6, groups=2, arms=("baseline", "dapo"), dapo_max_rounds=2)
    dapo = _arm(result, "dapo")
    assert dapo["group_index"].to_list() == [0, 1, 2, 3, 4, 5]
    assert dapo["dapo_round"].to_list() == [0, 0, 1, 1, 2, 2]
    assert not dapo["useful"].any()
    assert dapo["baseline_zero_var"].to_list() == [
        True,
        True,
        None,
        None,
        None,
        None,
    ]  # extra groups have no twin
    # 6 steps and 9 tokens per group: DAPO paid 3x the baseline's work for nothing
    summary = _arms(result)
    assert (summary["baseline"]["n_steps"], summary["dapo"]["n_steps"]) == (12, 36)
    assert (summary["baseline"]["gen_tokens"], summary["dapo"]["gen_tokens"]) == (18, 54)
    d = summary["dapo"]
    assert (
        d["groups"],
        d["useful_groups"],
        d["extra_rounds"],
        d["extra_groups"],
        d["cap_hits"],
    ) == (6, 0, 2, 4, 1)
    assert d["useful_per_s"] == 0.0
    block = json.loads((result.run_dir / "dapo" / "r0" / "block-0.json").read_text())
    assert block["hit_cap"] is True
    assert [(r["n_requested"], r["n_generated"], r["n_useful"]) for r in block["rounds"]] == [
        (2, 2, 0)
    ] * 3
    assert (
        result.comparisons == []
    )  # a DAPO arm's savings are in arms.parquet, not a per-task comparison
    report = (result.run_dir / "report.md").read_text()
    assert "**1 timed block(s) hit the cap** (`--dapo-max-rounds 2`)" in report
    assert json.loads((result.run_dir / "manifest.json").read_text())["status"] == "complete"


def test_dapo_rolls_the_next_tasks_until_the_block_is_full(tmp_path):
    # tasks 0..2 (lengths 9, 1, 9): 1 useful of 3. Extra round 1 asks for 2: groups 3, 4
    # (lengths 9, 1) -> 1 useful; round 2 asks for 1: group 5 (length 1) -> full at 3 useful
    result = _ab(tmp_path, [9, 1, 9, 9, 1, 1], groups=3, arms=("baseline", "dapo"))
    dapo = _arm(result, "dapo")
    assert dapo["group_index"].to_list() == [0, 1, 2, 3, 4, 5]
    assert dapo["dapo_round"].to_list() == [0, 0, 0, 1, 1, 2]
    assert dapo["useful"].to_list() == [False, True, False, False, True, True]
    s = _arms(result)
    assert (s["baseline"]["useful_groups"], s["dapo"]["useful_groups"]) == (1, 3)
    # steps 6 + 4 + 6 = 16 in the baseline; DAPO adds 6 + 4 + 4; tokens 9 + 7 + 9 = 25, + 9 + 7 + 7
    assert (s["baseline"]["n_steps"], s["dapo"]["n_steps"]) == (16, 30)
    assert (s["baseline"]["gen_tokens"], s["dapo"]["gen_tokens"]) == (25, 48)
    assert (s["dapo"]["extra_rounds"], s["dapo"]["extra_groups"], s["dapo"]["cap_hits"]) == (
        2,
        3,
        0,
    )
    assert s["dapo"]["useful_per_s"] == pytest.approx(3 / s["dapo"]["wall_s"])
    # the round-0 groups are the baseline's own (same seeds): identical outcomes and steps
    base = _arm(result, "baseline")
    cols = ["group_id", "n_steps", "n_gen_tokens", "reward_mean", "zero_var"]
    assert dapo.filter(pl.col("dapo_round") == 0).select(cols).equals(base.select(cols))
    assert s["dapo"]["traj_matched"] == s["dapo"]["traj_compared"] == 6


def test_a_blocks_extra_groups_do_not_depend_on_other_blocks():
    cfg = AbRolloutConfig(policy="noisy-expert", groups=24, dapo_max_rounds=3)
    specs = make_specs(tasks([1] * 30), 24)
    second = Block(3, 0, 1, parse_arm("dapo"), tuple(specs[12:]))
    # block 1 (tasks 12..23) owns 24 + 3*12 = 60 .. 95; block 0 owns 24 .. 59
    assert extra_start(cfg, second) == 60
    assert extra_start(cfg, second._replace(specs=tuple(specs[:12]))) == 24


def _history(path):
    # t/0: z=1; t/1: z=2; t/2: its last group had variance (z=0); t/3: never seen; t/4: one cut
    # group (no gradient, though its truncated rewards varied): z=1; t/5: useful, then 2 zero: z=2
    rows = [
        ("t/0", True, False),
        ("t/1", True, False),
        ("t/1", True, False),
        ("t/2", True, False),
        ("t/2", False, False),
        ("t/4", False, True),
        ("t/5", False, False),
        ("t/5", True, False),
        ("t/5", True, False),
    ]
    pl.DataFrame(
        rows, schema={"task_id": pl.Utf8, "zero_var": pl.Boolean, "cut": pl.Boolean}, orient="row"
    ).write_parquet(path)
    return path


@pytest.mark.parametrize(
    "p, skipped",
    [
        # seed 32: u(t/i, 0) = blake2b("32|t/i|0") / 2^64
        #   = .7597, .1059, .9037, .6373, .2073, .9987;
        # skip iff z >= 1 and u >= p^z: t/0 (z=1, .76 >= .5) and t/5 (z=2, .9987 >= .25);
        # t/1 (z=2, .11 < .25) and t/4 (z=1, .21 < .5) are explored;
        # t/2's u = .90 does not matter (z=0)
        (0.5, [0, 5]),
        (0.0, [0, 1, 4, 5]),  # every task with z >= 1
        (1.0, []),  # never
    ],
)
def test_greso_skips_by_history_with_a_seeded_draw(tmp_path, p, skipped):
    history = _history(tmp_path / "groups.parquet")
    result = _ab(
        tmp_path,
        [1] * 6,
        groups=6,
        arms=("baseline", "greso"),
        seed=32,
        greso_p_explore=p,
        greso_history=history,
    )
    greso = _arm(result, "greso")
    assert [i for i, s in zip(greso["group_index"], greso["skipped"], strict=True) if s] == skipped
    rows = greso.filter(pl.col("skipped"))
    assert (
        (rows["n_steps"] == 0).all()
        and (rows["wall_s"] == 0.0).all()
        and rows["n_traj_matched"].is_null().all()
    )
    s = _arms(result)["greso"]
    # every group of length 1 is useful: each skip loses one (a false positive by the baseline)
    n = len(skipped)
    assert (s["groups"], s["useful_groups"], s["skipped"], s["skip_tp"], s["skip_fp"]) == (
        6 - n,
        6 - n,
        n,
        0,
        n,
    )
    c = result.comparisons[0]
    assert c.arm == "greso" and c.savings["n_steps"].saving == pytest.approx(
        n / 6
    )  # 4 steps per task


def test_greso_learns_from_the_earlier_repeat_and_resumes_the_same(tmp_path):
    # p = 0: repeat 1 skips every task whose repeat-0 group was zero-variance (t/0, t/2: length 9)
    result = _ab(
        tmp_path,
        [9, 1, 9],
        groups=3,
        arms=("baseline", "greso", "dapo"),
        repeats=2,
        greso_p_explore=0.0,
    )
    table = (
        read(result.paths["ab"], AB).filter(pl.col("arm") == "greso").sort("repeat", "group_index")
    )
    assert table["skipped"].to_list() == [False, False, False, True, False, True]
    s = _arms(result)["greso"]
    assert (s["skipped"], s["skip_tp"], s["skip_fp"]) == (2, 2, 0)
    before = read(result.paths["ab"], AB).drop(TIMING)
    for arm in ("greso", "dapo"):  # lose repeat 1 of both, resume
        (result.run_dir / arm / "r1" / "block-0.json").unlink()
    cfg = json.loads((result.run_dir / "manifest.json").read_text())["config"]
    again = run_ab_rollout(
        AbRolloutConfig(
            policy="noisy-expert",
            groups=3,
            G=2,
            T_max=3,
            blocks=1,
            arms=("baseline", "greso", "dapo"),
            n_boot=20,
            figures=False,
            warmup=False,
            concurrency=4,
            repeats=2,
            greso_p_explore=0.0,
            out=result.run_dir,
            resume=True,
        ),
        progress=False,
        policy=Parity(),
        env_factory=Corridor,
        tasks=tasks([9, 1, 9]),
    )
    assert cfg["arms"] == ["baseline", "greso", "dapo"]
    assert read(again.paths["ab"], AB).drop(TIMING).equals(before)


def test_an_arm_part_of_another_package_runs_where_greso_does(tmp_path, cooldown_arm):
    assert parse_arm("Gated+Cooldown") == ArmSpec(
        "gated+cooldown", gate=True, dapo=False, greso=True, skip="cooldown"
    )
    assert parse_arm("stall+cooldown").stall and parse_arm("cooldown").skip == "cooldown"
    assert parse_arm("greso") == ArmSpec("greso", gate=False, dapo=False, greso=True, skip="greso")
    for name in ("cooldown+dapo", "greso+cooldown", "cooldown+nap"):  # no greso+dapo arm either
        with pytest.raises(SrolloutError, match=f"unknown arm '{re.escape(name)}'"):
            parse_arm(name)
    for taken in ("gated", "greso"):
        with pytest.raises(SrolloutError, match="srollout's own arms"):
            skip_part(taken)
    # corridors 9, 1, 9: t/0 and t/2 are zero-variance every time, t/1 always useful. cooldown
    # rests t/0 and t/2 in repeat 1 and rolls them out again in repeat 2; GRESO with p = 0 skips
    # them in repeats 1 and 2 (a skip records nothing, so its streak stays)
    result = _ab(
        tmp_path,
        [9, 1, 9],
        groups=3,
        arms=("baseline", "greso", "cooldown"),
        repeats=3,
        greso_p_explore=0.0,
    )
    table = read(result.paths["ab"], AB).sort("repeat", "group_index")
    skipped = {
        a: table.filter(pl.col("arm") == a)["skipped"].to_list() for a in ("greso", cooldown_arm)
    }
    F, T = False, True
    assert skipped["cooldown"] == [F, F, F, T, F, T, F, F, F]
    assert skipped["greso"] == [F, F, F, T, F, T, T, F, T]
    s = _arms(result)
    cool = s["cooldown"]
    assert (cool["skipped"], cool["skip_tp"], cool["skip_fp"]) == (2, 2, 0)
    assert (s["greso"]["skipped"], s["greso"]["skip_tp"]) == (4, 4)
    manifest = json.loads((result.run_dir / "manifest.json").read_text())
    assert manifest["config"]["arms"] == ["baseline", "greso", "cooldown"]


def test_an_arm_that_skips_a_whole_block_costs_nothing_and_is_scored(tmp_path, cooldown_arm):
    # corridors 9, 9: both groups zero-variance in repeat 0, so cooldown rests both in repeat 1:
    # a timed run of 0 s. Baseline: 2 repeats x 2 tasks x 6 steps = 24; cooldown: 12
    result = _ab(tmp_path, [9, 9], groups=2, arms=("baseline", "cooldown"), repeats=2)
    runs = pl.read_parquet(result.paths["blocks"]).filter(pl.col("arm") == "cooldown")
    assert runs.sort("repeat")["wall_s"][1] == 0.0
    (c,) = result.comparisons
    assert c.savings["n_steps"].saving == pytest.approx(0.5)
    wall = c.savings["wall_s"]
    assert 0 < wall.saving < 1 and math.isnan(wall.low) and math.isnan(wall.high)


def test_history_file_checks_and_order(tmp_path):
    path = _history(tmp_path / "groups.parquet")
    t5 = [
        o for o in load_greso_history(tmp_path) if o.prompt_id == "t/5"
    ]  # a directory holding groups.parquet
    assert [(o.iteration, o.zero_var) for o in t5] == [(-3, False), (-2, True), (-1, True)]
    pl.DataFrame({"task_id": ["t/0"]}).write_parquet(path)
    with pytest.raises(SrolloutError, match="missing column 'zero_var'"):
        load_greso_history(path)


def test_arms_are_checked_and_baseline_goes_first():
    assert AbRolloutConfig(arms=("dapo", "baseline")).arms == ("baseline", "dapo")
    with pytest.raises(SrolloutError, match="must include baseline"):
        AbRolloutConfig(arms=("gated", "dapo"))
    with pytest.raises(SrolloutError, match="unknown arm 'dapo2'"):
        AbRolloutConfig(arms=("baseline", "dapo2"))
    with pytest.raises(SrolloutError, match="--dapo-max-rounds"):
        AbRolloutConfig(dapo_max_rounds=-1)


def test_workers_without_ray_is_one_line_before_the_run_directory(run_cli, monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray -> ImportError, as without the extra
    monkeypatch.delenv("SROLLOUT_DEBUG", raising=False)
    out = tmp_path / "run"
    res = run_cli(
        "ab-rollout", "--policy", "noisy-expert", "--groups", "2", "--workers", "2", "--out", out
    )
    assert res.exit_code == 2
    assert (
        "error: --workers 2 runs on Ray, which is not installed: pip install 'srollout[dist]'"
        in res.stderr
    )
    assert "Traceback" not in res.stderr and len(res.stderr.strip().splitlines()) == 1
    assert not out.exists()


def test_wall_clock_interval_is_over_timed_run_pairs(tmp_path):
    # 2 repeats x 2 blocks: 4 (baseline, gated) run pairs; the wall-clock CI is the t interval of
    # those pairs' measured clocks (blocks.parquet), while token counts keep the task bootstrap
    from srollout.core.stats import relative_saving_ci, run_pair_saving_ci

    result = _ab(
        tmp_path,
        [1, 9, 1, 9],
        groups=4,
        arms=("baseline", "gated"),
        blocks=2,
        repeats=2,
        K=1,
        d_L=0.99,
    )
    (c,) = result.comparisons
    runs = pl.read_parquet(result.paths["blocks"])
    base = runs.filter(pl.col("arm") == "baseline").sort("repeat", "block")["wall_s"].to_numpy()
    gated = runs.filter(pl.col("arm") == "gated").sort("repeat", "block")["wall_s"].to_numpy()
    want = run_pair_saving_ci(base, gated)
    w = c.savings["wall_s"]
    assert want.n_pairs == 4 and w.ci_over == "4 timed-run pair(s)"
    assert (w.low, w.high) == pytest.approx((want.low, want.high))
    assert w.saving == pytest.approx(want.estimate)  # the task attribution sums to the runs' clocks
    b, a = _arm(result, "baseline"), _arm(result, "gated")
    tok = c.savings["n_gen_tokens"]
    assert tok.ci_over == "tasks"
    per_task = relative_saving_ci(
        b.group_by("group_index")
        .agg(pl.col("n_gen_tokens").mean())
        .sort("group_index")["n_gen_tokens"],
        a.group_by("group_index")
        .agg(pl.col("n_gen_tokens").mean())
        .sort("group_index")["n_gen_tokens"],
        n_resamples=20,
    )
    assert (tok.low, tok.high) == pytest.approx((per_task.low, per_task.high))
