"""The trajectory signals and the stall rule, on hand-made trajectories worked on paper."""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from srollout.core.trajectory_signals import (
    NoveltyTracker,
    normalise_observation,
    rejected_run,
    stall_fires,
    steps_since_new,
)


def test_the_docstring_example():
    initial = "room: desk 1, drawer 1"
    obs = ["on desk 1: a pen", "nothing happens.", "on desk 1: a pen", "drawer 1 is closed"]
    # new, new, seen at step 1 (1 step without news), new
    assert steps_since_new(initial, obs) == [0, 0, 1, 0]
    assert rejected_run([True, False, False, True]) == [0, 1, 2, 0]


def test_the_same_observation_is_the_same_text_up_to_whitespace_only():
    assert normalise_observation("  Nothing \t happens.\n\n") == "Nothing happens."
    # case, digits and punctuation are kept
    obs = ["Nothing happens.", "Nothing  happens.\n", "nothing happens.", "drawer 2", "drawer 1"]
    assert steps_since_new("drawer 1", obs) == [0, 1, 0, 0, 1]


def test_the_initial_observation_counts_as_seen():
    # going back to where it started is no news; a loop of two places stalls from its second lap
    start = "You are in the middle of a room."
    obs = [start, "at desk 1", start, "at desk 1", start, "at shelf 1"]
    assert steps_since_new(start, obs) == [1, 0, 1, 2, 3, 0]


def test_a_stall_counts_steps_since_the_last_news_not_repeats_of_one_text():
    # A B A B ... after seeing A and B: every later step is old, so the count grows by one each
    assert steps_since_new("o", ["A", "B", "A", "B", "A", "B"]) == [0, 0, 1, 2, 3, 4]


def test_the_tracker_is_the_function_one_step_at_a_time():
    obs = ["x", "y", "x", " x ", "z", "z"]
    tracker = NoveltyTracker("x")
    assert [tracker.step(o) for o in obs] == steps_since_new("x", obs) == [1, 0, 1, 2, 0, 1]


def _first_firing(since: list[int], W: int, k0: int) -> int | None:
    t = np.arange(1, len(since) + 1)
    hits = np.flatnonzero(stall_fires(t, np.array(since, dtype=np.int64), W, k0)) + 1
    return int(hits[0]) if hits.size else None


def test_the_stall_rule_fires_at_the_first_step_from_k0_with_W_steps_without_news():
    since = [0, 1, 2, 3, 0, 1, 2, 3, 4]
    assert _first_firing(since, W=3, k0=1) == 4
    assert _first_firing(since, W=3, k0=5) == 8  # steps 5-7 have 0, 1, 2
    assert _first_firing(since, W=4, k0=1) == 9
    assert _first_firing(since, W=5, k0=1) is None
    assert _first_firing(since, W=1, k0=10) is None  # the trajectory has 9 steps
    assert _first_firing([], W=1, k0=1) is None


def test_the_stall_rule_is_one_body_for_a_step_and_for_an_array():
    since = [0, 1, 2, 3, 0, 1, 2, 3, 4]
    array = stall_fires(np.arange(1, 10), np.array(since), 3, 5)
    scalar = [stall_fires(t, s, 3, 5) for t, s in enumerate(since, start=1)]
    assert array.tolist() == scalar == [False] * 7 + [True, True]
    assert all(type(x) is bool for x in scalar)  # plain Python in, plain Python out


@given(st.lists(st.sampled_from(["a", "b", "c", "d"]), max_size=40))
def test_since_new_grows_by_one_or_drops_to_zero(obs):
    since = steps_since_new("a", obs)
    for t, (before, after) in enumerate(zip([0, *since], since, strict=False)):
        assert after in (0, before + 1)
        assert after <= t + 1
    # at most 3 new observations after the initial "a": at most 3 zeros
    assert since.count(0) <= 3


@given(st.lists(st.booleans(), max_size=40))
def test_rejected_run_counts_the_current_run_of_invalid_actions(valid):
    runs = rejected_run(valid)
    for t, ok in enumerate(valid):
        expected = 0
        while t - expected >= 0 and not valid[t - expected]:
            expected += 1
        assert runs[t] == expected and (runs[t] == 0) == ok
