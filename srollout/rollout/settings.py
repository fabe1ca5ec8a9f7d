"""How the rollout engine (:mod:`srollout.rollout.engine`) rolls out: its settings and what it
needs of the gates it applies (a group gate at its check steps, a trajectory gate after every
step)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from srollout.core.gate import Gate, require_group_gate
from srollout.errors import ArgumentError, SrolloutError


def check_concurrency(concurrency: int, G: int) -> None:
    """The one check that a group fits the engine: ``concurrency`` (trajectories in flight) >= G,
    else an ArgumentError (the CLI names --concurrency and --G)."""
    if concurrency < G:
        raise ArgumentError(
            "{concurrency} must be >= {G}: a group starts only when all G of its trajectories fit",
            concurrency=concurrency,
            G=G,
        )


@dataclass(frozen=True)
class RolloutSettings:
    """How the engine rolls out.

    G: trajectories per group (1 only without signals or gate: independent trajectories, as a
    greedy evaluation plays them); T_max: step limit per trajectory; seed: the run seed;
    concurrency: most trajectories in flight at once (>= G); signal_K: K values at which the
    seven signals are recorded (those > T_max are dropped); gate / gate_K: the rule applied at
    step gate_K (None = no gate; a gate is applied at each of its ``check_steps()`` and gate_K,
    if given, must be its first); arm: the value of groups.arm ("collect",
    "baseline", "gated"); audit: group index -> whether a cut of that group is audited (the cut
    stands, but its trajectories run on to the end for the audit's label; ``--audit``);
    traj_gate: the trajectory gate (None = off), asked after every step of every trajectory
    that goes on; traj_audit: (group index, trajectory index) -> whether a stop of that
    trajectory is audited (it is recorded as ``TrajRecord.audited_stop`` and the trajectory runs
    on to its end for the audit's label; ``train-onpolicy --audit`` on a stall arm); shadow:
    both gates are asked where they would act and their decisions recorded
    (``GroupRecord.shadow_cut_step``, ``TrajRecord.shadow_stop``), but nothing is cut or stopped,
    so every decision is later labelled by the full outcome.
    """

    G: int = 8
    T_max: int = 30
    seed: int = 0
    concurrency: int = 64
    signal_K: tuple[int, ...] = (5, 10, 15, 20)
    gate: Gate | None = None
    gate_K: int | None = None
    arm: str = "collect"
    audit: Callable[[int], bool] | None = None
    traj_gate: Gate | None = None
    traj_audit: Callable[[int, int], bool] | None = None
    shadow: bool = False

    def __post_init__(self) -> None:
        if self.G < 1:
            raise SrolloutError(f"G must be >= 1, got {self.G}")
        if self.G < 2 and (self.signal_K or self.gate is not None):
            # one trajectory per "group" (a greedy evaluation) is fine; agreement needs two
            raise SrolloutError(
                f"G must be >= 2 for signals or a gate (a group of one has no variance), "
                f"got {self.G}"
            )
        if self.T_max < 1:
            raise SrolloutError(f"T_max must be >= 1, got {self.T_max}")
        check_concurrency(self.concurrency, self.G)
        if any(k < 1 for k in self.signal_K):
            raise SrolloutError(f"signal K values must be >= 1, got {list(self.signal_K)}")
        if self.traj_gate is not None and self.traj_gate.scope != "trajectory":
            raise SrolloutError(f"traj_gate: a {self.traj_gate.kind!r} gate ends whole groups")
        if self.gate is not None:
            checks = require_group_gate(self.gate).check_steps()
            if self.gate_K is None:
                object.__setattr__(self, "gate_K", checks[0])
            elif self.gate_K != checks[0]:
                raise SrolloutError(
                    f"gate K={self.gate_K} is not the first check step of a gate "
                    f"checking at K = {list(checks)}"
                )
            if not 1 <= self.gate_K <= self.T_max:
                raise SrolloutError(f"gate K={self.gate_K} must lie in [1, T_max={self.T_max}]")

    @property
    def recorded_K(self) -> tuple[int, ...]:
        """signal_K ∩ [1, T_max], sorted, without duplicates."""
        return tuple(sorted({k for k in self.signal_K if k <= self.T_max}))

    @property
    def gate_steps(self) -> tuple[int, ...]:
        """The steps the gate is evaluated after: ``gate.check_steps(T_max)``; () without a gate."""
        return () if self.gate is None else self.gate.check_steps(self.T_max)
