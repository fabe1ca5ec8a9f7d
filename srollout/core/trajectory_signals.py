"""Signals of one trajectory after each of its steps, and the two trajectory rules that read them:
the stall rule and the loop detector. Each rule is ONE elementwise function (:func:`stall_fires`,
:func:`loop_fires`) of Python scalars (a gate asked after one step) or numpy arrays of one shape
([N, T], offline); every other form calls it. The signals, what "the same observation" means and
the rules are defined in docs/artifacts.md (steps.parquet) and docs/gates.md ("The trajectory
gate", "The loop detector"); examples hand-worked in tests/unit/test_trajectory_signals.py.
Shapes: a trajectory of T steps gives lists of length T, element t−1 the value after step t.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import accumulate
from typing import NamedTuple

_SPACE = re.compile(r"\s+")


class LoopCounts(NamedTuple):
    """The loop detector's three signals after one step (docs/gates.md); ints, or [N, T] int
    arrays offline (0 past a trajectory's end)."""

    same_pair_run: int = 0
    rejected_repeat_run: int = 0
    alternation_run: int = 0


class TrajectoryState(NamedTuple):
    """One trajectory's signals after step ``step``: what a trajectory gate decides on."""

    step: int
    since_new: int
    rejected_run: int
    loop: LoopCounts = LoopCounts()


def normalise_observation(text: str) -> str:
    """An observation's text as compared: stripped, each whitespace run made one space."""
    return _SPACE.sub(" ", text).strip()


@dataclass
class NoveltyTracker:
    """``steps_since_new`` one step at a time, for an engine that holds a live trajectory:
    ``NoveltyTracker(initial).step(observation)`` after each step returns the value after it."""

    initial: str
    seen: set[str] = field(default_factory=set)
    since_new: int = 0

    def __post_init__(self) -> None:
        self.seen.add(normalise_observation(self.initial))

    def step(self, observation: str) -> int:
        key = normalise_observation(observation)
        if key in self.seen:
            self.since_new += 1
        else:
            self.seen.add(key)
            self.since_new = 0
        return self.since_new


def steps_since_new(initial: str, observations: Sequence[str]) -> list[int]:
    """``steps_since_new`` after each step: [T] observations o_2..o_{T+1} -> [T] counts."""
    tracker = NoveltyTracker(initial)
    return [tracker.step(o) for o in observations]


def next_rejected_run(run: int, valid: bool) -> int:
    """``rejected_run`` after a step, from the count before it (0 at the start) and whether the
    environment took the step's action: the one body the engine (one step at a time) and
    :func:`rejected_run` (a whole trajectory) share."""
    return 0 if valid else run + 1


def rejected_run(valid: Sequence[bool]) -> list[int]:
    """``rejected_run`` after each step: [T] validity flags -> [T] counts."""
    return list(accumulate(valid, next_rejected_run, initial=0))[1:]


@dataclass
class LoopTracker:
    """:class:`LoopCounts` one step at a time: ``LoopTracker().step(action, observation, valid)``
    after each step returns the counts after it (the one body of the loop detector's signals)."""

    last: tuple[tuple[str, str], ...] = ()  # the last two (action, observation) pairs, oldest first
    counts: LoopCounts = LoopCounts()

    def step(self, action: str, observation: str, valid: bool) -> LoopCounts:
        pair = (action, normalise_observation(observation))
        prev = self.last[-1] if self.last else None
        before = self.last[-2] if len(self.last) == 2 else None
        same, rejected, alternation = self.counts
        same = same + 1 if pair == prev else 1
        if valid:
            rejected = 0
        else:  # the previous step's action equal and rejected too (its run > 0 says rejected)
            rejected = rejected + 1 if prev is not None and action == prev[0] else 1
        if prev is None or pair == prev:
            alternation = 1
        else:  # A, B, A: the run ending at the previous step alternates between these two
            alternation = alternation + 1 if pair == before else 2
        self.last = (*self.last[-1:], pair)
        self.counts = LoopCounts(same, rejected, alternation)
        return self.counts


def loop_counts(
    actions: Sequence[str], observations: Sequence[str], valid: Sequence[bool]
) -> list[LoopCounts]:
    """:class:`LoopCounts` after each step: [T] actions, [T] returned observations o_2..o_{T+1}
    and [T] validity flags -> [T] counts."""
    tracker = LoopTracker()
    return [tracker.step(a, o, v) for a, o, v in zip(actions, observations, valid, strict=True)]


# --- the rules: one elementwise body each (scalars or numpy arrays of one shape) ----------------


def stall_score(step, since_new, k0):
    """The stall rule's score after step ``step``: ``since_new`` from step k0 on, −1 before it;
    the rule (W, k0) fires iff score >= W (the form the trajectory gate's audit moves W in).
    Elementwise: ints, or int arrays that broadcast together ([N, T] offline)."""
    return (step >= k0) * (since_new + 1) - 1


def stall_fires(step, since_new, W, k0):
    """The stall rule (W, k0) after step ``step``: none of the last W observations was new
    (``since_new`` >= W), from step k0 on. Elementwise as :func:`stall_score`; bool(s)."""
    return stall_score(step, since_new, k0) >= W


LOOP_SAME_PAIRS = 4  # identical (action, observation) pairs in a row
LOOP_REJECTED_REPEATS = 3  # the same action rejected in a row
LOOP_ALTERNATION = 6  # pairs alternating A, B, A, B, A, B


def loop_fires(step, counts: LoopCounts, k0):
    """The loop detector (k0) after step ``step``, from its :class:`LoopCounts`: 4 identical
    pairs, or 3 identical rejected actions, or 6 pairs alternating between two, from step k0 on.
    Elementwise: ints, or int arrays of one shape ([N, T] offline); bool(s)."""
    same, rejected, alternation = counts
    looping = (
        (same >= LOOP_SAME_PAIRS)
        | (rejected >= LOOP_REJECTED_REPEATS)
        | (alternation >= LOOP_ALTERNATION)
    )
    return (step >= k0) & looping


def longest_stall(since_new: Sequence[int], k0: int) -> int | None:
    """The longest run without a new observation the stall gate saw in a trajectory of
    n = len(since_new) steps: the largest :func:`stall_score` over the steps t in [k0, n-1]
    after which it went on (the gate is not asked after its last step); None when there is
    none. The stall rule (W, k0) fires on it iff this is >= W: the score the trajectory gate's
    audit reads."""
    asked = range(1, len(since_new))  # steps 1..n-1
    best = max((stall_score(t, since_new[t - 1], k0) for t in asked), default=-1)
    return best if best >= 0 else None
