"""The A/B's scoring (srollout.core.ab_scoring) on hand-made numbers: wall-clock attribution,
ABBA schedule, cuts judged by the baseline arm, step-based savings, the seed-match proof."""

from __future__ import annotations

import math

import numpy as np
import polars as pl
import pytest

from srollout.core.ab_scoring import (
    Mismatch,
    SeedMatch,
    attribute_wall,
    compare_arms,
    judge_cuts,
    merge_matches,
    run_pairs,
    seed_match,
    tokens_through_step,
    with_seed_match,
)
from srollout.core.arms import parse_arm
from srollout.envs.base import Task
from srollout.rollout.engine import make_specs
from srollout.stages.ab_rollout.schedule import make_schedule, split_blocks


def test_attribution_charges_measured_time_and_shares_the_rest_by_env_steps():
    # two groups: measured 3+1+0.5 = 4.5 s and 1+1+0.5 = 2.5 s; the run took 10 s, so 3 s of
    # overhead is shared 30:10 by env steps -> 2.25 s and 0.75 s
    wall, over = attribute_wall(
        np.array([3.0, 1.0]), np.array([1.0, 1.0]), np.array([0.5, 0.5]), np.array([30, 10]), 10.0
    )
    assert over == pytest.approx([2.25, 0.75])
    assert wall == pytest.approx([6.75, 3.25])
    assert wall.sum() == pytest.approx(10.0)
    # no steps at all: the rest is shared evenly
    wall, over = attribute_wall(
        np.zeros(2), np.zeros(2), np.array([1.0, 1.0]), np.array([0, 0]), 3.0
    )
    assert over == pytest.approx([0.5, 0.5]) and wall == pytest.approx([1.5, 1.5])


def _specs(n):
    return make_specs([Task(f"t/{i}", "pick_and_place_simple", "x", "") for i in range(n)], n)


def test_schedule_is_abba_over_blocks_and_repeats():
    arms = (parse_arm("baseline"), parse_arm("gated"))
    two_blocks = make_schedule(arms, _specs(4), repeats=1, n_blocks=2)
    assert [(b.arm.name[0], b.block) for b in two_blocks] == [
        ("b", 0),
        ("g", 0),
        ("g", 1),
        ("b", 1),
    ]
    assert [s.index for s in two_blocks[2].specs] == [2, 3]
    two_repeats = make_schedule(arms, _specs(3), repeats=2, n_blocks=1)
    assert [(b.arm.name[0], b.repeat) for b in two_repeats] == [
        ("b", 0),
        ("g", 0),
        ("g", 1),
        ("b", 1),
    ]
    assert [b.order for b in two_repeats] == [0, 1, 2, 3]
    # every arm sees every group exactly once per repeat
    sizes = [len(c) for c in split_blocks(_specs(7), 3)]
    assert sum(sizes) == 7 and max(sizes) - min(sizes) <= 1


def test_cuts_are_judged_by_the_baseline_not_by_the_truncated_rewards():
    # 5 tasks, T_max 30, K 10. Three cuts; the gated arm's truncated rewards call all three
    # zero-variance (own precision 1), but the baseline had variance in task 1: TP 2, FP 1.
    rows = pl.DataFrame(
        {
            "cut": [True, True, True, False, False],
            "cut_step": [10, 10, 10, None, None],
            "zero_var": [True, True, True, False, True],
            "baseline_zero_var": [True, False, True, True, False],
        }
    )
    c = judge_cuts(rows, T_max=30)
    assert (c.n, c.cut, c.tp, c.fp, c.zero_var) == (5, 3, 2, 1, 3)
    assert c.precision == pytest.approx(2 / 3) and c.recall == pytest.approx(2 / 3)
    assert c.own_precision == 1.0
    # safe = TP (T-K) / (N T) = 2*20/150; raw = cut (T-K) / (N T) = 3*20/150
    assert c.safe == pytest.approx(40 / 150) and c.raw == pytest.approx(0.4)
    none = judge_cuts(rows.with_columns(pl.lit(False).alias("cut")), T_max=30)
    assert math.isnan(none.precision) and none.recall == 0.0 and none.raw == 0.0


def test_tokens_through_step_ends_at_the_kth_response():
    ids = list(range(1, 10))
    mask = [False, False, True, True, False, True, False, True, True]
    assert tokens_through_step(ids, mask, 1) == [1, 2, 3, 4]
    assert tokens_through_step(ids, mask, 2) == [1, 2, 3, 4, 5, 6]
    assert tokens_through_step(ids, mask, 3) == ids
    assert tokens_through_step(ids, mask, 5) == ids


def _arm(trajs, cut_step, observations=None):
    """trajs: {(group_id, traj_idx): (actions, token_ids, action_mask)} -> the three tables;
    observations: {(group_id, traj_idx): [o_1, ...]} where they differ from "after <action>"."""
    observations = observations or {}
    steps = [
        {
            "group_id": g,
            "traj_idx": i,
            "step": t,
            "action": a,
            "response": f"Action: {a}",
            "observation": observations.get((g, i), {}).get(t, f"after {a}"),
        }
        for (g, i), (acts, _, _) in trajs.items()
        for t, a in enumerate(acts, start=1)
    ]
    tr = [
        {"group_id": g, "traj_idx": i, "token_ids": ids, "action_mask": m}
        for (g, i), (_, ids, m) in trajs.items()
    ]
    groups = pl.DataFrame(
        {"group_id": list(cut_step), "cut_step": list(cut_step.values())},
        schema={"group_id": pl.Utf8, "cut_step": pl.Int64},
    )
    return {
        "steps": pl.DataFrame(steps),
        "trajectories": pl.DataFrame(
            tr,
            schema={
                "group_id": pl.Utf8,
                "traj_idx": pl.Int64,
                "token_ids": pl.List(pl.Int64),
                "action_mask": pl.List(pl.Boolean),
            },
        ),
        "groups": groups,
    }


def test_seed_match_compares_up_to_K_actions_responses_and_tokens():
    M = [True, False, True, False, True]  # 3 responses: tokens 0, 2, 4
    base = _arm(
        {
            ("g0", 0): (["a", "b", "c"], [1, 9, 2, 9, 3], M),
            ("g0", 1): (["a", "b", "c"], [1, 9, 2, 9, 3], M),
            ("g1", 0): (["x", "y", "z"], [5, 9, 6, 9, 7], M),
            ("g1", 1): (["x", "y", "z"], [5, 9, 6, 9, 7], M),
        },
        {"g0": None, "g1": None},
    )
    arm = _arm(
        {
            ("g0", 0): (["a", "b"], [1, 9, 2], M[:3]),  # cut at 2: identical prefix -> match
            ("g0", 1): (["a", "q"], [1, 9, 8], M[:3]),  # differs at step 2 -> mismatch at 2
            ("g1", 0): (["x", "y", "w"], [5, 9, 6, 9, 4], M),  # not cut, differs after K=2 -> match
            ("g1", 1): (
                ["x", "y", "z"],
                [5, 9, 0, 9, 7],
                M,
            ),  # same actions, token 2 differs -> tokens only
        },
        {"g0": 2, "g1": None},
    )
    m = seed_match(base, arm, gate_K=2)
    assert (m.n_traj, m.n_match) == (4, 2) and m.share == 0.5 and m.tokens_checked
    assert [(x.group_id, x.traj_idx, x.step) for x in m.mismatches] == [
        ("g0", 1, 2),
        ("g1", 1, None),
    ]


def test_seed_match_compares_what_the_game_answered():
    """The same actions and responses, but at step 2 the game of ("g0", 1) answered otherwise
    in the arm (a game drawing from a generator it shares): a mismatch at step 2; a different
    answer after K does not count."""
    M = [True, False, True, False, True]
    same = {
        ("g0", 0): (["a", "b", "c"], [1, 9, 2, 9, 3], M),
        ("g0", 1): (["a", "b", "c"], [1, 9, 2, 9, 3], M),
    }
    base = _arm(same, {"g0": None})
    arm = _arm(same, {"g0": None}, {("g0", 1): {2: "a mine!"}, ("g0", 0): {3: "later"}})
    m = seed_match(base, arm, gate_K=2)
    assert (m.n_traj, m.n_match) == (2, 1)
    assert [(x.group_id, x.traj_idx, x.step) for x in m.mismatches] == [("g0", 1, 2)]


def test_seed_match_column_counts_each_groups_identical_trajectories():
    from types import SimpleNamespace

    table = pl.DataFrame(
        {
            "arm": ["baseline", "gated", "gated", "gated"],
            "repeat": [0, 0, 0, 1],
            "group_id": ["g0", "g0", "g1", "g0"],
        }
    )
    c = SimpleNamespace(
        arm="gated",
        match=SimpleNamespace(
            mismatches=[
                Mismatch(0, "g0", 1, 3),
                Mismatch(0, "g0", 2, None),
                Mismatch(1, "g0", 0, 1),
            ]
        ),
    )
    assert with_seed_match(table, [c], G=4)["n_traj_matched"].to_list() == [None, 2, 4, 3]


def _ab_rows():
    """Two tasks, baseline and gated. Task 0: the gate cuts at K=5 of T_max=10 and the baseline
    group was zero-variance (a TP); task 1: not cut, both arms did the same work."""
    base = {
        "arm": "baseline",
        "wall_s": 10.0,
        "n_gen_tokens": 100,
        "n_prompt_tokens": 300,
        "n_steps": 20,
        "gen_s": 6.0,
        "env_s": 2.0,
        "reset_s": 1.0,
        "overhead_s": 1.0,
        "cut": False,
        "cut_step": None,
    }
    rows = [
        {
            **base,
            "group_index": 0,
            "group_id": "g0",
            "task_id": "t0",
            "zero_var": True,
            "baseline_zero_var": True,
        },
        {
            **base,
            "group_index": 1,
            "group_id": "g1",
            "task_id": "t1",
            "zero_var": False,
            "baseline_zero_var": False,
        },
        {
            **base,
            "arm": "gated",
            "group_index": 0,
            "group_id": "g0",
            "task_id": "t0",
            "zero_var": True,
            "baseline_zero_var": True,
            "wall_s": 4.0,
            "n_gen_tokens": 40,
            "n_prompt_tokens": 120,
            "n_steps": 8,
            "gen_s": 2.0,
            "env_s": 0.5,
            "overhead_s": 0.5,
            "cut": True,
            "cut_step": 5,
        },
        {
            **base,
            "arm": "gated",
            "group_index": 1,
            "group_id": "g1",
            "task_id": "t1",
            "zero_var": False,
            "baseline_zero_var": False,
        },
    ]
    blocks = pl.DataFrame(
        {
            "arm": ["baseline", "gated", "gated", "baseline"],
            "repeat": [0, 0, 0, 0],
            "block": [0, 0, 1, 1],
            "wall_s": [10.0, 4.0, 10.0, 10.0],
            "workers": [1, 1, 1, 1],
        }
    )
    return pl.DataFrame(rows), blocks


def test_compare_arms_on_a_hand_made_table():
    table, blocks = _ab_rows()
    match = SeedMatch(4, 4, 1.0, True, [])
    c = compare_arms(
        table,
        blocks,
        "gated",
        match,
        gate={"rule": "r1", "K": 5},
        T_max=10,
        repeats=1,
        n_boot=50,
        seed=0,
    )
    # every cost: baseline 2 x (10 s, 100 tokens, 300 prompt tokens, 20 steps), gated 14 s, 140,
    # 420, 28: 30 % saved
    for col, (b, a) in {
        "wall_s": (20, 14),
        "n_gen_tokens": (200, 140),
        "n_prompt_tokens": (600, 420),
        "n_steps": (40, 28),
    }.items():
        s = c.savings[col]
        assert (s.baseline, s.arm) == (b, a) and s.saving == pytest.approx(0.3)
    # the wall-clock CI is over the 2 timed-run pairs (10, 4) and (10, 10), not over tasks
    assert c.savings["wall_s"].ci_over == "2 timed-run pair(s)"
    assert c.savings["wall_s"].low < 0.3 < c.savings["wall_s"].high
    assert run_pairs(blocks, "gated").rows() == [(0, 0, 10.0, 4.0), (0, 1, 10.0, 10.0)]
    # wall saving / token saving = 0.3 / 0.3
    assert c.ratio[0] == pytest.approx(1.0)
    # 6 s saved: generation 12 - 8, environment (4 + 2) - (2.5 + 2), overhead 2 - 1.5
    assert c.decomposition == pytest.approx(
        {"baseline_wall": 20.0, "generation": 4.0, "environment": 1.5, "overhead": 0.5}
    )
    # one cut, a TP; safe = raw = (10 - 5) / (2 * 10)
    conf = c.confusion
    assert (conf.n, conf.cut, conf.tp, conf.fp, conf.precision, conf.recall) == (
        2,
        1,
        1,
        0,
        1.0,
        1.0,
    )
    assert conf.safe == conf.raw == pytest.approx(0.25)
    assert (c.arm, c.n_tasks, c.repeats, c.match, c.gate) == (
        "gated",
        2,
        1,
        match,
        {"rule": "r1", "K": 5},
    )
    assert c.headline()["seed_match"] == {"n_traj": 4, "n_match": 4, "share": 1.0}


def test_compare_arms_without_tokens_has_no_token_saving():
    table, blocks = _ab_rows()
    table = table.with_columns(pl.lit(0).alias("n_gen_tokens"))
    c = compare_arms(
        table,
        blocks,
        "gated",
        SeedMatch(0, 0, math.nan, False, []),
        gate=None,
        T_max=10,
        repeats=1,
        n_boot=20,
        seed=0,
    )
    assert math.isnan(c.savings["n_gen_tokens"].saving) and all(math.isnan(x) for x in c.ratio)
    assert c.savings["wall_s"].saving == pytest.approx(0.3)


def test_merge_matches_sums_the_repeats():
    first = SeedMatch(2, 1, 0.5, True, [Mismatch(0, "g0", 1, 3)])
    second = SeedMatch(2, 2, 1.0, False, [])
    m = merge_matches([first, second])
    assert (m.n_traj, m.n_match, m.share, m.tokens_checked, m.mismatches) == (
        4,
        3,
        0.75,
        True,
        first.mismatches,
    )
    assert math.isnan(merge_matches([]).share)
