"""The loop detector (gate kind ``loop``) and the one-body stall rule, on hand-made trajectories
worked on paper: each of the loop detector's three conditions firing and not firing, at and before
k0, its gate file, and the scalar gate, the offline arrays and the audit's score agreeing."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from srollout.core.gate import load_gate
from srollout.core.stall_sweep import Trajectories, first_stops, loop_stops, stall_stops
from srollout.core.trajectory_gate import LoopGate, StallGate
from srollout.core.trajectory_signals import (
    LoopCounts,
    LoopTracker,
    TrajectoryState,
    longest_stall,
    loop_counts,
    loop_fires,
    steps_since_new,
)
from srollout.errors import SrolloutError


def counts(pairs: list[tuple[str, str]], valid: list[bool] | None = None) -> list[LoopCounts]:
    valid = [True] * len(pairs) if valid is None else valid
    return loop_counts([a for a, _ in pairs], [o for _, o in pairs], valid)


def gate_stops(pairs, valid=None, k0=1) -> list[int]:
    """The steps after which LoopGate(k0) says stop (asked after every step)."""
    gate = LoopGate(k0=k0)
    return [
        t
        for t, c in enumerate(counts(pairs, valid), start=1)
        if gate.stops(TrajectoryState(t, 0, 0, c))
    ]


A, B, C = ("go to desk 1", "on desk 1: a pen"), ("go to shelf 1", "on shelf 1: a cd"), ("look", "x")


def test_the_tracker_is_the_function_one_step_at_a_time():
    pairs = [A, B, A, B, A, B, B]
    valid = [True, False, False, True, False, False, False]
    tracker = LoopTracker()
    stepped = [tracker.step(a, o, v) for (a, o), v in zip(pairs, valid, strict=True)]
    assert stepped == counts(pairs, valid)
    assert stepped[-1] == LoopCounts(2, 2, 1)


def test_the_docstring_example():
    assert loop_counts(["go", "go", "go"], ["x", "x", "y"], [True, True, True]) == [
        LoopCounts(1, 0, 1),
        LoopCounts(2, 0, 1),
        LoopCounts(1, 0, 2),
    ]


# --- 1. the last 4 (action, observation) pairs identical ---------------------------------------


def test_four_identical_pairs_fire_at_the_fourth_not_the_third():
    assert [c.same_pair_run for c in counts([A] * 5)] == [1, 2, 3, 4, 5]
    assert gate_stops([A] * 3) == []
    assert gate_stops([A] * 4) == [4]
    assert gate_stops([A] * 5) == [4, 5]  # (the engine ends it at the first)


def test_identical_pairs_are_counted_up_to_whitespace_in_the_observation():
    obs = ["Nothing happens.", "Nothing  happens.\n", " Nothing happens.", "Nothing happens."]
    assert gate_stops([("look", o) for o in obs]) == [4]
    # case is kept: a different observation breaks the run
    obs[2] = "nothing happens."
    assert [c.same_pair_run for c in counts([("look", o) for o in obs])] == [1, 2, 1, 1]
    assert gate_stops([("look", o) for o in obs]) == []


def test_the_same_action_with_a_new_observation_is_no_repeat():
    pairs = [("open drawer 1", o) for o in ("closed", "closed", "closed", "open", "open")]
    assert [c.same_pair_run for c in counts(pairs)] == [1, 2, 3, 1, 2]
    assert gate_stops(pairs) == []


def test_k0_holds_the_rule_back_until_step_k0():
    # the pairs repeat from step 1; with k0 6 the first question that may fire is after step 6
    assert gate_stops([A] * 7, k0=4) == [4, 5, 6, 7]
    assert gate_stops([A] * 7, k0=6) == [6, 7]
    assert gate_stops([A] * 5, k0=6) == []
    # before k0 nothing fires even when the counts say so; at k0 it does
    assert not LoopGate(k0=6).stops(TrajectoryState(5, 0, 0, LoopCounts(5, 0, 0)))
    assert LoopGate(k0=6).stops(TrajectoryState(6, 0, 0, LoopCounts(4, 0, 0)))


# --- 2. the last 3 actions identical and each rejected ----------------------------------------


def test_three_identical_rejected_actions_fire_at_the_third():
    pairs = [("take cd 1", "Nothing happens.")] * 3
    assert [c.rejected_repeat_run for c in counts(pairs, [False] * 3)] == [1, 2, 3]
    assert gate_stops(pairs, [False] * 3) == [3]  # 3 identical pairs alone would not fire
    assert gate_stops(pairs, [True] * 3) == []  # accepted: only 3 identical pairs
    assert gate_stops(pairs[:2], [False] * 2) == []
    assert gate_stops(pairs, [False] * 3, k0=4) == []


def test_a_valid_step_or_another_action_breaks_the_rejected_run():
    pairs = [("take cd 1", "Nothing happens.")] * 3
    assert [c.rejected_repeat_run for c in counts(pairs, [False, True, False])] == [1, 0, 1]
    assert gate_stops(pairs, [False, True, False]) == []
    other = [("take cd 1", "no"), ("take pen 1", "no"), ("take pen 1", "no"), ("take pen 1", "n")]
    # rejected every time: the run counts the same action only (the observation may differ)
    assert [c.rejected_repeat_run for c in counts(other, [False] * 4)] == [1, 1, 2, 3]
    assert gate_stops(other, [False] * 4) == [4]


# --- 3. the last 6 pairs alternate A, B, A, B, A, B with A != B --------------------------------


def test_six_alternating_pairs_fire_at_the_sixth_not_the_fifth():
    pairs = [A, B] * 3
    assert [c.alternation_run for c in counts(pairs)] == [1, 2, 3, 4, 5, 6]
    assert gate_stops(pairs[:5]) == []
    assert gate_stops(pairs) == [6]
    assert gate_stops(pairs, k0=7) == []
    assert gate_stops([*pairs, A], k0=7) == [7]  # 7 alternating pairs by step 7


def test_alternation_of_a_pair_with_itself_is_no_alternation():
    # A == B: six equal pairs are no alternation (its run stays 1); the pair rule fires instead,
    # at the fourth
    assert [c.alternation_run for c in counts([A] * 6)] == [1] * 6
    assert gate_stops([A] * 6, k0=5) == [5, 6]
    assert not loop_fires(6, LoopCounts(0, 0, 1), 1)


def test_a_broken_alternation_starts_again():
    pairs = [A, B, A, B, B, A, B, A, B, A]  # step 5 repeats B: the run restarts at 1
    assert [c.alternation_run for c in counts(pairs)] == [1, 2, 3, 4, 1, 2, 3, 4, 5, 6]
    assert gate_stops(pairs) == [10]
    assert gate_stops([A, B, A, B, A, C]) == []  # a third pair ends it: 2 at step 6
    assert counts([A, B, A, B, A, C])[-1].alternation_run == 2


# --- the gate file ------------------------------------------------------------------------------


def test_a_loop_gate_file_loads_and_refuses_a_missing_or_non_integer_k0(tmp_path):
    path = tmp_path / "gate-loop.json"
    path.write_text(json.dumps({"kind": "loop", "k0": 3}))
    gate = load_gate(path)
    assert gate == LoopGate(k0=3) and gate.scope == "trajectory" and gate.kind == "loop"
    assert LoopGate(k0=3).to_dict() == {"kind": "loop", "version": 1, "k0": 3}
    for body, says in (
        ({"kind": "loop"}, "missing 'k0'"),
        ({"kind": "loop", "k0": 1.5}, "loop k0 must be an integer >= 1, got 1.5"),
        ({"kind": "loop", "k0": "2"}, "loop k0 must be an integer >= 1, got '2'"),
        ({"kind": "loop", "k0": True}, "loop k0 must be an integer >= 1, got True"),
        ({"kind": "loop", "k0": 0}, "loop k0 must be an integer >= 1, got 0"),
        ({"kind": "loop", "k0": 2, "W": 4}, "'W'"),
    ):
        path.write_text(json.dumps(body))
        with pytest.raises(SrolloutError, match=str(path)) as err:
            load_gate(path)
        assert says in str(err.value)
    with pytest.raises(SrolloutError, match="^loop k0=12 is larger than T_max=10$"):
        LoopGate(k0=12).check(10)


# --- one body: the gate after one step, the offline arrays, the audit's score ------------------


def _arrays(seqs: list[list[LoopCounts]]) -> LoopCounts:
    T = max(len(s) for s in seqs)
    out = np.zeros((3, len(seqs), T), dtype=np.int64)
    for i, s in enumerate(seqs):
        if s:
            out[:, i, : len(s)] = np.array(s).T
    return LoopCounts(*out)


trajectory = st.lists(
    st.tuples(st.sampled_from("ab"), st.sampled_from("xy"), st.booleans()), min_size=1, max_size=14
)


@settings(max_examples=200, deadline=None)
@given(st.lists(trajectory, min_size=1, max_size=5), st.integers(1, 8))
def test_the_loop_gate_and_the_offline_stops_agree(trajs, k0):
    seqs = [loop_counts(*map(list, zip(*t, strict=True))) for t in trajs]
    n_steps = np.array([len(t) for t in trajs])
    gate = LoopGate(k0=k0)
    # the engine asks after every step but the last and ends the trajectory at the first "yes"
    asked = [[TrajectoryState(t, 0, 0, c) for t, c in enumerate(s[:-1], start=1)] for s in seqs]
    online = [next((state.step for state in a if gate.stops(state)), 0) for a in asked]
    assert loop_stops(_arrays(seqs), n_steps, k0).tolist() == online


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.sampled_from("abcd"), min_size=1, max_size=16), st.integers(1, 6), st.integers(1, 8)
)
def test_the_stall_gate_the_offline_stops_and_the_audit_score_agree(obs, W, k0):
    since = steps_since_new("a", obs)
    n = len(since)
    trajs = Trajectories(
        group=np.array([0]), n_steps=np.array([n]), success=np.array([False]),
        since_new=np.array([since]), step_reward=np.zeros((1, n)),
        step_tokens=np.zeros((1, n), dtype=np.int64),
    )  # fmt: skip
    gate = StallGate(W=W, k0=k0)
    asked = range(1, n)  # not after the last step
    online = next((t for t in asked if gate.stops(TrajectoryState(t, since[t - 1], 0))), 0)
    assert stall_stops(trajs, W, k0).tolist() == [online]
    longest = longest_stall(since, k0)
    assert (online > 0) == (longest is not None and longest >= W)


def test_first_stops_never_stops_at_or_after_the_last_step():
    fire = np.array([[False, True, True], [False, False, True], [True, False, False]])
    assert first_stops(fire, np.array([3, 3, 1])).tolist() == [2, 0, 0]
