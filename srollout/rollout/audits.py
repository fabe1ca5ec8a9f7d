"""The audit as a wrapper around a run's gates: one object every stage runs the same way.

A run rolls out in *rounds* (train-onpolicy: iterations; collect: chunks of groups; ab-rollout:
an arm's timed runs). With ``--audit F`` the group gate's threshold and the trajectory gate's W
move from one round to the next; without it nothing moves. Either way a stage does the same
per round, so it never asks which gate is audited::

    audit = Audit(gate, traj_gate, fraction=F, floor=P, seed=seed, ckpt_dir=run_dir)
    settings = audit.settings(settings)          # the gates (and audit draws) of this round
    gate_metrics, stop_metrics = audit.label(roll(specs, settings), round)  # None when off
    audit.save()                                  # the ledgers, before the round's checkpoint
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from srollout.rollout.audit import NO_AUDIT, AuditMetrics, GateAuditor
from srollout.rollout.stop_audit import NO_STOP_AUDIT, StopAuditMetrics, StopAuditor


class Audit:
    """``--audit fraction --audit-floor floor`` around the group gate and the trajectory gate
    (either may be None), its ledgers in ``ckpt_dir`` (None: only check that the audit can move
    these gates, writing nothing); ``iteration`` / ``resume``: continue from the ledgers cut back to
    that round. A gate the audit cannot move is one SrolloutError line."""

    def __init__(
        self,
        gate: Any,
        traj_gate: Any = None,
        *,
        fraction: float,
        floor: float,
        seed: int,
        ckpt_dir: Path | None = None,
        iteration: int = 0,
        resume: bool = False,
    ) -> None:
        self.on = fraction > 0
        args = dict(
            fraction=fraction,
            floor=floor,
            seed=seed,
            ckpt_dir=Path(ckpt_dir) if ckpt_dir is not None else Path(),
            iteration=iteration,
            resume=resume and ckpt_dir is not None,
        )
        self.gate = GateAuditor(gate, **args) if self.on and gate is not None else None
        self.stops = StopAuditor(traj_gate, **args) if self.on and traj_gate is not None else None

    @classmethod
    def of(cls, config: Any, gate: Any, traj_gate: Any = None, **kw: Any) -> Audit:
        """From a stage's config (``audit``, ``audit_floor``, ``seed``; ``seed=`` in ``kw``
        overrides it, as a training seed does)."""
        kw.setdefault("seed", config.seed)
        return cls(gate, traj_gate, fraction=config.audit, floor=config.audit_floor, **kw)

    def settings(self, settings: Any) -> Any:
        """``settings`` (a RolloutSettings) with the gates this round runs with and the audit's
        draws; unchanged when nothing is audited."""
        if self.gate is not None:
            settings = dataclasses.replace(
                settings, gate=self.gate.current_gate(), audit=self.gate.picks
            )
        if self.stops is not None:
            settings = dataclasses.replace(
                settings, traj_gate=self.stops.current_gate(), traj_audit=self.stops.picks
            )
        return settings

    def label(
        self, records: Sequence[Any], round: int
    ) -> tuple[AuditMetrics | None, StopAuditMetrics | None]:
        """Label the round's finished groups and move each threshold for the next round; the
        round's audit columns (an audited run's gate without an auditor: the empty ones; None
        when --audit is off)."""
        if not self.on:
            return None, None
        gate = self.gate.audit(records, round) if self.gate is not None else NO_AUDIT
        stops = self.stops.audit(records, round) if self.stops is not None else NO_STOP_AUDIT
        return gate, stops

    def save(self) -> None:
        """Each ledger (and the calibrated gate beside it), atomically."""
        for auditor in (self.gate, self.stops):
            if auditor is not None:
                auditor.save()

    def files(self) -> list[Path]:
        """The ledgers written so far."""
        return [a.path for a in (self.gate, self.stops) if a is not None and a.path.exists()]


__all__ = ("Audit",)
