"""The A/B's scoring on hand-made numbers: wall-clock attribution, ABBA schedule, cuts judged by
the baseline arm, step-based savings, the seed-match proof."""

from __future__ import annotations

import math

import numpy as np
import polars as pl
import pytest

from srollout.envs.base import Task
from srollout.rollout.engine import make_specs
from srollout.stages.ab_rollout import (
    ArmSpec,
    attribute_wall,
    judge_cuts,
    make_schedule,
    seed_match,
    split_blocks,
    tokens_through_step,
)


def test_attribution_charges_measured_time_and_shares_the_rest_by_env_steps():
    # two groups: measured 3+1+0.5 = 4.5 s and 1+1+0.5 = 2.5 s; the run took 10 s, so 3 s of
    # overhead is shared 30:10 by env steps -> 2.25 s and 0.75 s
    wall, over = attribute_wall(np.array([3.0, 1.0]), np.array([1.0, 1.0]), np.array([0.5, 0.5]), np.array([30, 10]), 10.0)
    assert over == pytest.approx([2.25, 0.75])
    assert wall == pytest.approx([6.75, 3.25])
    assert wall.sum() == pytest.approx(10.0)
    # no steps at all: the rest is shared evenly
    wall, over = attribute_wall(np.zeros(2), np.zeros(2), np.array([1.0, 1.0]), np.array([0, 0]), 3.0)
    assert over == pytest.approx([0.5, 0.5]) and wall == pytest.approx([1.5, 1.5])


def _specs(n):
    return make_specs([Task(f"t/{i}", "pick_and_place_simple", "x", "") for i in range(n)], n)


def test_schedule_is_abba_over_blocks_and_repeats():
    arms = (ArmSpec("baseline"), ArmSpec("gated"))
    two_blocks = make_schedule(arms, _specs(4), repeats=1, n_blocks=2)
    assert [(b.arm.name[0], b.block) for b in two_blocks] == [("b", 0), ("g", 0), ("g", 1), ("b", 1)]
    assert [s.index for s in two_blocks[2].specs] == [2, 3]
    two_repeats = make_schedule(arms, _specs(3), repeats=2, n_blocks=1)
    assert [(b.arm.name[0], b.repeat) for b in two_repeats] == [("b", 0), ("g", 0), ("g", 1), ("b", 1)]
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


def _arm(trajs, cut_step):
    """trajs: {(group_id, traj_idx): (actions, token_ids, action_mask)} -> the three tables."""
    steps = [
        {"group_id": g, "traj_idx": i, "step": t, "action": a, "response": f"Action: {a}"}
        for (g, i), (acts, _, _) in trajs.items()
        for t, a in enumerate(acts, start=1)
    ]
    tr = [{"group_id": g, "traj_idx": i, "token_ids": ids, "action_mask": m} for (g, i), (_, ids, m) in trajs.items()]
    groups = pl.DataFrame({"group_id": list(cut_step), "cut_step": list(cut_step.values())}, schema={"group_id": pl.Utf8, "cut_step": pl.Int64})
    return {"steps": pl.DataFrame(steps), "trajectories": pl.DataFrame(tr, schema={"group_id": pl.Utf8, "traj_idx": pl.Int64, "token_ids": pl.List(pl.Int64), "action_mask": pl.List(pl.Boolean)}), "groups": groups}


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
            ("g1", 1): (["x", "y", "z"], [5, 9, 0, 9, 7], M),  # same actions, token 2 differs -> tokens only
        },
        {"g0": 2, "g1": None},
    )
    m = seed_match(base, arm, gate_K=2)
    assert (m.n_traj, m.n_match) == (4, 2) and m.share == 0.5 and m.tokens_checked
    assert [(x.group_id, x.traj_idx, x.step) for x in m.mismatches] == [("g0", 1, 2), ("g1", 1, None)]


def test_seed_match_column_counts_each_groups_identical_trajectories():
    from types import SimpleNamespace

    from srollout.stages.ab_rollout import Mismatch, with_seed_match

    table = pl.DataFrame({"arm": ["baseline", "gated", "gated", "gated"], "repeat": [0, 0, 0, 1], "group_id": ["g0", "g0", "g1", "g0"]})
    c = SimpleNamespace(arm="gated", match=SimpleNamespace(mismatches=[Mismatch(0, "g0", 1, 3), Mismatch(0, "g0", 2, None), Mismatch(1, "g0", 0, 1)]))
    assert with_seed_match(table, [c], G=4)["n_traj_matched"].to_list() == [None, 2, 4, 3]
