"""Signals of one trajectory after each of its steps, and the stall rule that reads them (the
trajectory gate, beyond the paper: DESIGN.md, "Trajectory gate").

A trajectory's observations are o_1 (the initial observation, before any action) and then the
one each step returns: step t's ``steps.observation`` is o_{t+1}. Two observations are **the same**
when their texts are equal after :func:`normalise_observation`: leading and trailing whitespace
removed and every run of whitespace (spaces, tabs, newlines) made one space; case, punctuation
and digits are kept, so "drawer 1" and "drawer 2" differ.

=========================  =========================================================================
signal, after step t       definition
=========================  =========================================================================
``steps_since_new``        t − (the last step s <= t whose returned observation o_{s+1} was new to
                           the trajectory: equal to none of o_1..o_s), or t if no step's was new.
                           0 right after a step that saw something new.
``rejected_run``           the number of steps ending at t, t included, whose action the
                           environment rejected (``valid`` false); 0 when step t's was valid.
=========================  =========================================================================

The **stall rule** (W, k0) ends a trajectory after the first step t >= k0 with
``steps_since_new`` >= W: none of its last W observations was new to it. W >= 1, k0 >= 1.

Shapes: a trajectory of T steps gives lists of length T, element t−1 the value after step t.

Example (hand-worked in tests/unit/test_trajectory_signals.py)::

    initial = "room: desk 1, drawer 1"
    obs = ["on desk 1: a pen", "nothing happens.", "on desk 1: a pen", "drawer 1 is closed"]
    steps_since_new(initial, obs)      # [0, 0, 1, 0]
    rejected_run([True, False, False, True])  # [0, 1, 2, 0]
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

_SPACE = re.compile(r"\s+")


class TrajectoryState(NamedTuple):
    """One trajectory's signals after step ``step``: what a trajectory gate decides on."""

    step: int
    since_new: int
    rejected_run: int


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


def rejected_run(valid: Sequence[bool]) -> list[int]:
    """``rejected_run`` after each step: [T] validity flags -> [T] counts."""
    out, run = [], 0
    for ok in valid:
        run = 0 if ok else run + 1
        out.append(run)
    return out


def stall_step(since_new: Sequence[int], W: int, k0: int) -> int | None:
    """The step (1-based) after which the stall rule (W, k0) ends the trajectory, or None if it
    never fires: the first t >= k0 with since_new[t-1] >= W."""
    for t in range(max(k0, 1), len(since_new) + 1):
        if since_new[t - 1] >= W:
            return t
    return None


def longest_stall(since_new: Sequence[int], k0: int) -> int | None:
    """The longest run without a new observation the stall gate saw in a trajectory of
    n = len(since_new) steps: max since_new[t-1] over the steps t in [k0, n-1] after which it
    went on (the gate is not asked after its last step); None when there is none. The stall
    rule (W, k0) fires on it iff this is >= W: the score the trajectory gate's audit reads."""
    seen = since_new[max(k0, 1) - 1 : len(since_new) - 1]
    return max(seen) if len(seen) else None
