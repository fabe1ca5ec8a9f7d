"""``train-onpolicy --audit F --audit-floor P`` on an arm with the trajectory gate: the stall
rule's W kept honest while the policy trains (how it works: docs/gates.md, "Audited while
training"; the statistics and the threshold rule are the group gate's, :mod:`srollout.core.audit`).

In :mod:`srollout.core.audit`'s form "cut iff score < θ" (the score as docs/gates.md defines it):
the rule (W, k0) stops iff score < θ with θ = 0.5 - W, and θ runs as W = floor(-θ) + 1. The
ledger's window holds the last :data:`STOP_WINDOW` audited stops (the group gate's holds 50)."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from srollout.core.audit import DEFAULT_CONFIDENCE, AuditLedger, Labelled, audit_pick_stop
from srollout.core.trajectory_gate import StallGate
from srollout.core.trajectory_signals import longest_stall
from srollout.rollout.audit import Auditor, GateColumns


@dataclass(frozen=True)
class StopAuditMetrics(GateColumns):
    """``--audit``'s trajectory-gate columns of one iteration: audited stops and their TP (failed) /
    FP (won), the Clopper-Pearson bound over the window at this iteration's W (nan with no audited
    stop in it), that W (0 without the trajectory gate), and the steps the audited trajectories
    took after their stop."""

    stop_audited: int
    stop_audit_tp: int
    stop_audit_fp: int
    stop_precision_lb: float
    stall_W: int
    stop_audit_steps: int


# metrics.parquet columns written after the audit's, by every arm of a run with --audit > 0;
# rows of audited runs from before them read NO_STOP_AUDIT
NO_STOP_AUDIT = StopAuditMetrics(0, 0, 0, float("nan"), 0, 0)
STOP_AUDIT_COLUMNS = tuple(NO_STOP_AUDIT.columns())


STOP_AUDIT_FILE = "audit-stall.json"
AUDITED_STALL_GATE_FILE = "gate-stall-audited.json"  # the calibrated rule, for the next --gate
# audited stops of evidence: a run stops hundreds of trajectories where the group gate cuts tens
# of groups, and the bound of a window of 50 cannot clear 0.90 unless 48 of 50 are right (0.05 ^
# (1/50) = 0.942 at 50 of 50); 200 holds about the last 25 iterations at F 0.25 and 30 stops an
# iteration, and clears 0.90 at 188 of 200 right
STOP_WINDOW = 200


def theta_of(W: int) -> float:
    """θ of the rule with this W ("stop iff score < θ", score = -longest stall)."""
    return 0.5 - W


def W_of(theta: float) -> int:
    """The W a θ stands for: stop iff longest stall > -θ, i.e. >= floor(-θ) + 1 (at least 1)."""
    return max(1, math.floor(-theta) + 1)


def stop_score(traj: Any, k0: int) -> float:
    """Minus the trajectory's longest stall from k0 on (nan when the gate was never asked)."""
    run = longest_stall([int(s["steps_since_new"]) for s in traj.steps], k0)
    return math.nan if run is None else -float(run)


def evidence(rows: Sequence[Labelled], theta: float) -> list[Labelled]:
    """The window's rows as the bound at ``theta`` reads them: a trajectory the rule let through
    when W was higher, and that W = W_of(theta) stops, is labelled by its full outcome like an
    audited stop, and counts as one. Without this the audit swings: the trajectories let through
    at a high W certify a lower one (the loosen move), and at that W the bound, reading only the
    25 % of its stops that were audited, tightens it straight back (measured on Tier 3, seed 7:
    W 5 and 16 in turn). Counting them is conservative while precision grows with the stall:
    the band they add stalls less than the stops the audits sampled."""
    return [
        r._replace(source="audit") if r.source == "through" and r.score < theta else r for r in rows
    ]


class StopAuditor(Auditor):
    """The audit of one (seed, arm)'s stall gate: ``gate`` the rule it starts from,
    ``fraction`` / ``floor`` the CLI's --audit / --audit-floor, ``seed`` the run's seed."""

    def __init__(
        self,
        gate: StallGate,
        *,
        fraction: float,
        floor: float,
        seed: int,
        ckpt_dir: Path,
        iteration: int = 0,
        resume: bool = False,
        confidence: float = DEFAULT_CONFIDENCE,
    ) -> None:
        self.base, self.fraction, self.floor, self.seed = gate, fraction, floor, seed
        self.confidence = confidence
        self.path = ckpt_dir / STOP_AUDIT_FILE
        self.ledger = AuditLedger(STOP_WINDOW)
        self.threshold = theta_of(gate.W)
        self._restore(iteration, resume)

    def evidence(self, rows: list[Labelled], theta: float) -> list[Labelled]:
        return evidence(rows, theta)

    @property
    def W(self) -> int:
        """The W this iteration runs with."""
        return W_of(self.threshold)

    def current_gate(self) -> StallGate:
        return dataclasses.replace(self.base, W=self.W)

    def picks(self, group_index: int, traj_idx: int) -> bool:
        """``RolloutSettings.traj_audit``: whether this stop is audited (seeded, the same on
        every run)."""
        return audit_pick_stop(self.seed, group_index, traj_idx, self.fraction)

    def audit(self, records: Sequence[Any], iteration: int) -> StopAuditMetrics:
        """Label this iteration's trajectories (every round): audited stops by their full
        outcome, trajectories let through by theirs; move W for the next iteration."""
        W, k0 = self.W, self.base.k0
        rows, audited, cost = [], 0, 0
        for r in records:
            for t in r.trajs:
                if t.stalled:
                    continue  # a stop that stood: its outcome is unknown
                score = stop_score(t, k0)
                if math.isnan(score):
                    continue  # ended before k0: no W could stop it
                source = "through"
                if t.audited_stop is not None:
                    source, audited = "audit", audited + 1
                    cost += len(t.actions) - t.audited_stop
                rows.append(Labelled(iteration, score, not t.success, source))
        _, step, tp = self._move(iteration, rows)
        return StopAuditMetrics(audited, tp, audited - tp, step.precision_lb, W, cost)

    def save(self) -> None:
        """audit-stall.json, atomically (before state.pt), and beside it the rule at the W the
        next round runs with (``gate-stall-audited.json``): ``--gate`` takes it."""
        from srollout.atomic import atomic_write_json

        atomic_write_json(self.ledger.to_dict(), self.path)
        self.current_gate().save(self.path.parent / AUDITED_STALL_GATE_FILE)
