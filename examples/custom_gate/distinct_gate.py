"""A gate kind of your own, in your own package: srollout loads it from a gate.json by its kind.

``{"kind": "distinct", "version": 1, "K": 5, "max_ratio": 0.3}`` cuts a group at step K when
at most ``max_ratio`` of the actions its G trajectories took up to K are distinct
(``unique_action_ratio``, one of the seven signals: the group keeps doing the same few things).

The kind registers itself with ``@gate_kind``; srollout finds this module through the entry point
in this folder's pyproject.toml (group ``srollout.gates``, name = the kind), so after
``pip install ./examples/custom_gate`` a gate.json of kind "distinct" works in every stage
(``srollout collect --gate gate.json``) without a change to srollout. docs/extending.md.
"""

from __future__ import annotations

from dataclasses import dataclass

from srollout.core.gate import Gate, gate_kind
from srollout.core.signals import GroupSignals
from srollout.errors import SrolloutError


@gate_kind("distinct")
@dataclass(frozen=True)
class DistinctActionsGate(Gate):
    """Cut at step K iff the group's unique-action ratio at K is <= max_ratio."""

    K: int = 5
    max_ratio: float = 0.3

    def __post_init__(self) -> None:
        if isinstance(self.K, bool) or not isinstance(self.K, int) or self.K < 1:
            raise SrolloutError(f"distinct gate: K must be an integer >= 1, got {self.K!r}")
        ratio = self.max_ratio
        if isinstance(ratio, bool) or not isinstance(ratio, (int, float)) or not 0 <= ratio <= 1:
            raise SrolloutError(f"distinct gate: max_ratio must be in [0, 1], got {self.max_ratio}")

    def decide(self, signals: GroupSignals) -> bool:
        return signals.unique_action_ratio <= self.max_ratio

    # gate.json's reading and writing come from the contract: its fields, checked on load
