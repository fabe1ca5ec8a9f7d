"""``train-onpolicy --audit F --precision-floor P``: the audited gate inside on-policy training
(the statistics and the threshold rule: :mod:`srollout.core.audit`).

Per iteration of an arm with a rule gate (r1/r3): the gate runs at the current d_L; a seeded
share F of its cuts is rolled on to T_max with the same seeds and weights and no gate, through
the same engine and policy as the rollout, counted in the iteration's rollout time, steps and
tokens; each audited cut is labelled by its full outcome, each group let through by its own;
d_L for the next iteration comes from the last window of iterations. The ledger is checkpointed
as ``audit.json`` beside ``state.pt`` (written before it; on resume the iterations after the
checkpoint are dropped, and the next d_L is recomputed from what is left).
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from srollout.core.audit import AuditLedger, Labelled, audit_pick, next_threshold
from srollout.core.gate import GateRule
from srollout.errors import SrolloutError
from srollout.training.metrics import NO_AUDIT, AuditMetrics

AUDIT_FILE = "audit.json"


def _d_K(record: Any) -> float:
    """The d_K the rule gate read for ``record`` (nan when the gate never ran on it)."""
    signals = record.gate_signals
    return math.nan if signals is None else float(signals.prefix_edit_distance_mean)


class GateAuditor:
    """The audit of one (seed, arm): ``gate`` the arm's rule gate as it starts, ``fraction`` /
    ``floor`` the CLI's --audit / --precision-floor, ``seed`` the run's seed (the audit draws)."""

    def __init__(
        self,
        gate: Any,
        *,
        fraction: float,
        floor: float,
        seed: int,
        ckpt_dir: Path,
        iteration: int = 0,
        resume: bool = False,
    ) -> None:
        if not isinstance(gate, GateRule):
            raise SrolloutError(
                f"--audit moves a rule gate's d_L (r1/r3); this arm's gate is "
                f"{type(gate).__name__}: use --rule/--d-L or a rule gate.json"
            )
        self.gate, self.fraction, self.floor, self.seed = gate, fraction, floor, seed
        self.path = ckpt_dir / AUDIT_FILE
        self.ledger = AuditLedger()
        self.threshold = gate.d_L
        if resume and self.path.exists():
            import json

            self.ledger = AuditLedger.from_dict(json.loads(self.path.read_text()))
            self.ledger.truncate(iteration)
            if iteration in self.ledger.thresholds:
                self.threshold = self._next(iteration, self.ledger.thresholds[iteration]).threshold

    def _next(self, iteration: int, theta: float) -> Any:
        return next_threshold(theta, self.ledger.recent(iteration), floor=self.floor)

    def current_gate(self) -> GateRule:
        """The gate at the d_L this iteration runs with."""
        return dataclasses.replace(self.gate, d_L=self.threshold)

    def audit(
        self,
        records: Sequence[Any],
        roll: Callable[[list[Any]], list[Any]],
        iteration: int,
    ) -> AuditMetrics:
        """Audit ``records`` (this iteration's finished groups, every round): ``roll(specs)``
        rolls groups on without a gate and returns them in the order given. Moves the
        threshold for the next iteration; returns the iteration's audit columns."""
        from srollout.core.grpo import is_zero_variance

        theta = self.threshold
        picked = sorted(
            (r for r in records if r.cut and audit_pick(self.seed, r.spec.index, self.fraction)),
            key=lambda r: r.spec.index,
        )
        start = time.perf_counter()
        full = roll([r.spec for r in picked]) if picked else []
        audit_s = time.perf_counter() - start
        rows = [
            Labelled(iteration, _d_K(r), is_zero_variance(whole.rewards), "audit")
            for r, whole in zip(picked, full, strict=True)
        ]
        rows += [
            Labelled(iteration, _d_K(r), is_zero_variance(r.rewards), "through")
            for r in records
            if not r.cut and r.gate_signals is not None
        ]
        self.ledger.add(r for r in rows if not math.isnan(r.score))
        self.ledger.thresholds[iteration] = theta
        step = self._next(iteration, theta)
        self.threshold = step.threshold
        tp = sum(r.zero_var for r in rows if r.source == "audit")
        return AuditMetrics(len(picked), tp, len(picked) - tp, step.precision_lb, theta, audit_s)

    def save(self) -> None:
        """audit.json, atomically (before state.pt, as greso.json)."""
        from srollout.atomic import atomic_write_json

        atomic_write_json(self.ledger.to_dict(), self.path)


__all__ = ("AUDIT_FILE", "NO_AUDIT", "GateAuditor")
