"""The trajectory gate: a rule asked after every step of one trajectory that ends that trajectory
alone (``ended_by="stalled"``), beside the group gate that ends a whole group at K. Two kinds,
each a pure rule of :mod:`srollout.core.trajectory_signals`: the **stall** rule (W, k0) and the
**loop** detector (k0). Definitions, files and use: docs/gates.md ("The trajectory gate", "The
loop detector").

Inside your own loop, one tracker per trajectory::

    gate = StallGate(W=8, k0=10)
    tracker = NoveltyTracker(initial_observation)  # LoopTracker() for the loop detector
    ...  # after step t of this trajectory, if the episode is not over:
    if gate.stops(TrajectoryState(step=t, since_new=tracker.step(observation), rejected_run=0)):
        ...  # end this trajectory now; it keeps its reward so far
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar

from srollout.core.gate import Gate, check_step, gate_kind
from srollout.core.trajectory_signals import TrajectoryState, loop_fires, stall_fires
from srollout.errors import SrolloutError


def _as_count(value: Any, name: str) -> int:
    if isinstance(value, float) and math.isnan(value):
        raise SrolloutError(f"{name} is NaN; it must be an integer >= 1")
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise SrolloutError(f"{name} must be an integer >= 1, got {value!r}")
    return int(value)


class TrajectoryRule(Gate):
    """What the trajectory kinds share: asked after every step (:meth:`stops`), never shown a
    group, from step ``k0`` on (an integer >= 1, which must lie within T_max)."""

    k0: int
    scope: ClassVar[str] = "trajectory"

    def __post_init__(self) -> None:
        object.__setattr__(self, "k0", _as_count(self.k0, f"{self.kind} k0"))

    def check_steps(self, T_max: int | None = None) -> tuple[int, ...]:
        return ()  # asked after every step (stops), never shown a group

    def check(self, T_max: int) -> None:
        """Refuse a rule that can never fire within T_max steps."""
        check_step(self.k0, T_max, of=f"{self.kind} k0")


@gate_kind("stall")
@dataclass(frozen=True)
class StallGate(TrajectoryRule):
    """End a trajectory after step t >= k0 once its last W observations were all seen before.

    W: steps without a new observation (>= 1); k0: the first step the rule may fire at (>= 1).
    """

    W: int = 8
    k0: int = 10
    required_keys: ClassVar[tuple[str, ...]] = ("W", "k0")  # in a gate.json

    def __post_init__(self) -> None:
        object.__setattr__(self, "W", _as_count(self.W, "stall W"))
        super().__post_init__()

    def stops(self, state: TrajectoryState) -> bool:
        """End this trajectory now, after step ``state.step``? (Asked only while it goes on.)"""
        return bool(stall_fires(state.step, state.since_new, self.W, self.k0))


@gate_kind("loop")
@dataclass(frozen=True)
class LoopGate(TrajectoryRule):
    """The loop detector: end a trajectory after step t >= k0 when it loops
    (:func:`srollout.core.trajectory_signals.loop_fires`). k0: the first step it may fire at
    (>= 1; default 1, the field's rule has none)."""

    k0: int = 1
    required_keys: ClassVar[tuple[str, ...]] = ("k0",)  # in a gate.json

    def stops(self, state: TrajectoryState) -> bool:
        """End this trajectory now, after step ``state.step``? (Asked only while it goes on.)"""
        return bool(loop_fires(state.step, state.loop, self.k0))
