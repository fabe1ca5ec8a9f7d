"""The trajectory gate: a rule evaluated after every step of one trajectory that ends that
trajectory alone (``ended_by="stalled"``), beside the group gate that ends a whole group at K.

The first kind is the **stall** rule (W, k0): end a trajectory after step t >= k0 once none of
its last W observations was new to it (``steps_since_new`` >= W, :mod:`srollout.core
.trajectory_signals`). A stopped trajectory keeps its tokens and the reward it earned so far, as
one cut by T_max does. ``srollout sweep --stall`` chooses W and k0 on an ungated collect and
writes it as ``gate-stall.json``::

    {"kind": "stall", "version": 1, "W": 8, "k0": 10}

Inside your own loop, one tracker per trajectory::

    from srollout.core.trajectory_gate import StallGate
    from srollout.core.trajectory_signals import NoveltyTracker, TrajectoryState

    gate = StallGate(W=8, k0=10)
    tracker = NoveltyTracker(initial_observation)
    ...  # after step t of this trajectory, if the episode is not over:
    if gate.stops(TrajectoryState(step=t, since_new=tracker.step(observation), rejected_run=0)):
        ...  # end this trajectory now; it keeps its reward so far
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar

from srollout.core.gate import Gate, gate_kind
from srollout.core.trajectory_signals import TrajectoryState
from srollout.errors import SrolloutError


def _as_count(value: Any, name: str) -> int:
    if isinstance(value, float) and math.isnan(value):
        raise SrolloutError(f"{name} is NaN; it must be an integer >= 1")
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise SrolloutError(f"{name} must be an integer >= 1, got {value!r}")
    return int(value)


@gate_kind("stall")
@dataclass(frozen=True)
class StallGate(Gate):
    """End a trajectory after step t >= k0 once its last W observations were all seen before.

    W: steps without a new observation (>= 1); k0: the first step the rule may fire at (>= 1).
    """

    W: int = 8
    k0: int = 10
    scope: ClassVar[str] = "trajectory"
    required_keys: ClassVar[tuple[str, ...]] = ("W", "k0")  # in a gate.json

    def __post_init__(self) -> None:
        object.__setattr__(self, "W", _as_count(self.W, "stall W"))
        object.__setattr__(self, "k0", _as_count(self.k0, "stall k0 (--stall-from)"))

    def check_steps(self, T_max: int | None = None) -> tuple[int, ...]:
        return ()  # asked after every step (stops), never shown a group

    def stops(self, state: TrajectoryState) -> bool:
        """End this trajectory now, after step ``state.step``? (Asked only while it goes on.)"""
        return state.step >= self.k0 and state.since_new >= self.W

    def check(self, T_max: int) -> None:
        """Refuse a rule that can never fire within T_max steps."""
        if self.k0 > T_max:
            raise SrolloutError(f"stall k0 (--stall-from) {self.k0} is larger than --T-max {T_max}")
