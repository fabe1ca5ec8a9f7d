"""Scoring the stall rule offline, on four hand-made trajectories worked on paper."""

from __future__ import annotations

import math

import numpy as np
import pytest

from srollout.core.stall_sweep import (
    Trajectories,
    choose_rule,
    crossfit,
    random_stops,
    score_stops,
    stall_stops,
)

# group 0: A fails (5 steps), B wins at step 3; group 1: C fails (5 steps), D wins at step 5
SINCE = [[0, 1, 2, 3, 4], [0, 0, 1, -1, -1], [0, 0, 1, 2, 3], [0, 1, 2, 0, 0]]
REWARD = [[0, 0, 0, 0, 0], [0, 0, 1, 0, 0], [0, 0, 0, 0, 0], [0, 0, 0, 0, 1]]


def _trajs(copies: int = 1) -> Trajectories:
    n_steps = np.array([5, 3, 5, 5] * copies)
    return Trajectories(
        group=np.repeat(np.arange(2 * copies), 2),
        n_steps=n_steps,
        success=np.array([False, True, False, True] * copies),
        since_new=np.array(SINCE * copies),
        step_reward=np.array(REWARD * copies, dtype=float),
        step_tokens=np.where(np.arange(1, 6)[None, :] <= n_steps[:, None], 10, 0),
    )


def test_the_rule_fires_from_k0_and_only_before_the_trajectory_ends():
    trajs = _trajs()
    # W 2: A at 3, C at 4, D at 3 (a winner: a false stop); B never has 2 steps without news
    assert stall_stops(trajs, W=2, k0=1).tolist() == [3, 0, 4, 3]
    # W 3 from step 4: A at 4; C reaches 3 only at step 5, its last step: nothing to stop
    assert stall_stops(trajs, W=3, k0=4).tolist() == [4, 0, 0, 0]


def test_a_score_by_the_full_outcome():
    trajs = _trajs()
    s = score_stops(trajs, stall_stops(trajs, W=2, k0=1))
    assert (s.n_stops, s.n_false) == (3, 1) and s.precision == pytest.approx(2 / 3)
    # 18 real steps; saved: A 5-3, C 5-4, D 5-3 = 5; every step made 10 tokens
    assert s.step_savings == pytest.approx(5 / 18) and s.token_savings == pytest.approx(50 / 180)
    # D keeps the reward earned by step 3, 0: group 1 goes from [0, 1] to [0, 0]
    assert (s.to_zero_var, s.to_mixed) == (1, 0)
    # advantages (-1, 1) become (0, 0) in group 1 and stay in group 0: 2 of 4 moves
    assert s.adv_l2_moved == pytest.approx(0.5, abs=1e-5)
    # group 0 ends at step 3 (was 5), group 1 at step 4 (was 5)
    assert s.groups_ended_early == 2


def test_no_stop_scores_nothing():
    trajs = _trajs()
    s = score_stops(trajs, np.zeros(4, dtype=np.int64))
    assert s.n_stops == 0 and math.isnan(s.precision)
    assert (s.step_savings, s.to_zero_var, s.adv_l2_moved, s.groups_ended_early) == (0, 0, 0, 0)


def test_a_stop_that_turns_an_all_succeed_group_mixed():
    trajs = Trajectories(
        group=np.array([0, 0]),
        n_steps=np.array([4, 4]),
        success=np.array([True, True]),
        since_new=np.array([[0, 1, 2, 0], [0, 0, 0, 0]]),
        step_reward=np.array([[0, 0, 0, 1.0], [0, 0, 0, 1.0]]),
        step_tokens=np.full((2, 4), 3),
    )
    s = score_stops(trajs, stall_stops(trajs, W=2, k0=1))
    assert (s.n_stops, s.n_false, s.precision) == (1, 1, 0.0)
    assert (s.to_zero_var, s.to_mixed) == (0, 1)
    assert s.step_savings == pytest.approx(1 / 8)
    assert s.adv_l2_moved == 0.0  # ||A||² of a zero-variance batch is 0: reported as 0


def test_random_stops_match_the_steps_on_live_trajectories():
    trajs = _trajs(copies=3)
    stop = stall_stops(trajs, W=2, k0=1)
    for seed in range(10):
        r = random_stops(trajs, stop, seed)
        assert sorted(r[r > 0].tolist()) == sorted(stop[stop > 0].tolist())
        assert np.all(trajs.n_steps[r > 0] > r[r > 0])
    assert not np.array_equal(random_stops(trajs, stop, 0), random_stops(trajs, stop, 1))


def test_the_rule_chosen_is_the_largest_saving_above_the_floor():
    trajs = _trajs()
    grid = [(2, 1), (3, 4)]
    scores = {rule: score_stops(trajs, stall_stops(trajs, *rule)) for rule in grid}
    assert choose_rule(scores, floor=0.6) == (2, 1)  # precision 2/3, saves 5/18
    assert choose_rule(scores, floor=0.9) == (3, 4)  # precision 1, saves 1/18
    assert choose_rule({(5, 1): score_stops(trajs, np.zeros(4, dtype=np.int64))}, 0.0) is None


def test_crossfit_holds_every_group_out_once_with_a_rule_chosen_elsewhere():
    trajs = _trajs(copies=4)  # 8 groups, 4 of each kind
    held = crossfit(trajs, [(2, 1), (3, 4)], floor=0.9, n_folds=2, seed=0)
    assert sorted(np.bincount(held.fold_of_group).tolist()) == [4, 4]
    assert held.rules == [(3, 4), (3, 4)]  # (2, 1) is 2/3 precise on any fold
    assert held.stop.tolist() == stall_stops(trajs, 3, 4).tolist()
    none = crossfit(trajs, [(2, 1)], floor=0.9, n_folds=2, seed=0)
    assert none.rules == [None, None] and not none.stop.any()
