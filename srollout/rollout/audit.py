"""``train-onpolicy --audit F --audit-floor P``: the audited gate inside on-policy training
(the statistics and the threshold rule: :mod:`srollout.core.audit`; how it works: docs/gates.md).

Per iteration of an arm with a rule gate (its d_L moves) or a learned gate (its threshold t
moves: cut iff P(zero-variance) >= t, run as the score 1 - P below 1 - t), a seeded share F of
the cuts is rolled on to T_max through the same engine and labelled by its full outcome. The
ledger is ``audit.json`` beside ``state.pt`` (written before it; on resume the iterations after
the checkpoint are dropped and the next threshold recomputed from what is left)."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from srollout.core.audit import (
    DEFAULT_CONFIDENCE,
    AuditLedger,
    Labelled,
    audit_pick,
    best_band,
    certifiable_n,
    next_threshold,
)
from srollout.core.gate import AuditKnob, Gate
from srollout.errors import SrolloutError


class GateColumns:
    """An audit's metrics as ``gate/<field>`` columns (one ``metrics.parquet`` row's)."""

    def columns(self) -> dict[str, Any]:
        return {f"gate/{f.name}": getattr(self, f.name) for f in dataclasses.fields(self)}


@dataclass(frozen=True)
class AuditMetrics(GateColumns):
    """``--audit``'s ``gate/`` columns of one iteration (docs/gates.md, "What is logged"): audited
    cuts and their TP / FP, the Clopper-Pearson bound over the window at this iteration's
    threshold (nan with no audited cut in it), that threshold (nan with no gate), and the
    environment steps the audited groups took after their cut step."""

    audited: int
    audit_tp: int
    audit_fp: int
    precision_lb: float
    threshold: float
    audit_steps: int


# written after the judge's columns, and only by a run with --audit > 0 (every arm)
AUDIT_COLUMNS = tuple(AuditMetrics(0, 0, 0, 0.0, 0.0, 0).columns())
NO_AUDIT = AuditMetrics(0, 0, 0, float("nan"), float("nan"), 0)


AUDIT_FILE = "audit.json"
AUDITED_GATE_FILE = "gate-audited.json"  # the calibrated gate, for the next run's --gate


def knob(gate: Gate) -> AuditKnob:
    """The audit's handle on ``gate``: the one threshold its kind lets an audit move."""
    found = gate.audit_knob()
    if found is None:
        raise SrolloutError(
            f"--audit moves a rule gate's d_L or a learned gate's threshold (a gate kind's "
            f"audit_knob); this arm's gate is a {gate.kind!r} gate, which has none: use "
            "--rule/--d-L or a rule or learned gate.json"
        )
    return found


class Auditor:
    """What the group gate's and the stall gate's audits share: the ledger at ``path``, the
    threshold θ in :mod:`srollout.core.audit`'s form ("cut iff score < θ"), one move of θ per
    round, and the resume from a checkpoint."""

    path: Path
    ledger: AuditLedger
    threshold: float
    floor: float
    confidence: float

    def evidence(self, rows: list[Labelled], theta: float) -> list[Labelled]:
        """The window's rows as the bound at ``theta`` reads them (as they are, by default)."""
        return rows

    def _next(self, iteration: int, theta: float) -> Any:
        """θ after ``iteration`` from ``theta``; the answer is kept (``self.step``): when θ did
        not move, an export reads the bound at it from there instead of a second run."""
        rows = self.evidence(self.ledger.recent(iteration), theta)
        step = next_threshold(theta, rows, floor=self.floor, confidence=self.confidence)
        self.step = (iteration, theta, step)
        return step

    def _move(self, iteration: int, rows: Sequence[Labelled]) -> tuple[float, Any, int]:
        """Add a round's labelled ``rows`` (those with a score) to the ledger and move θ for the
        next round; returns the θ the round ran with, the move, and the audited rows' TP."""
        theta = self.threshold
        self.ledger.add(r for r in rows if not math.isnan(r.score))
        self.ledger.thresholds[iteration] = theta
        step = self._next(iteration, theta)
        self.threshold = step.threshold
        return theta, step, sum(r.zero_var for r in rows if r.source == "audit")

    def _restore(self, iteration: int, resume: bool) -> None:
        """On resume, the ledger as checkpointed beside ``iteration``'s state and the threshold
        the next iteration runs with, computed again from it."""
        saved = resumed_ledger(self.path, iteration) if resume else None
        if saved is not None:
            self.ledger = saved
            if iteration in saved.thresholds:
                self.threshold = self._next(iteration, saved.thresholds[iteration]).threshold


class GateAuditor(Auditor):
    """The audit of one (seed, arm): ``gate`` the arm's gate as it starts (a rule or learned
    gate, or an audited gate.json: its base at the calibrated threshold, its evidence carried
    over as the oldest in the window), ``fraction`` / ``floor`` the CLI's --audit /
    --audit-floor, ``seed`` the run's seed (the audit draws)."""

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
        from srollout.core.audited_gate import unwrap

        base, ledger, confidence = unwrap(gate)
        self.knob = knob(base)
        self.fraction, self.floor, self.seed = fraction, floor, seed
        self.confidence = DEFAULT_CONFIDENCE if confidence is None else confidence
        self.path = ckpt_dir / AUDIT_FILE
        self.ledger = AuditLedger() if ledger is None else carried_over(ledger)
        self.threshold = self.knob.theta  # "cut iff score < threshold" (core.audit's units)
        self.step: tuple[int, float, Any] | None = None  # the last (iteration, θ, ThresholdStep)
        self._restore(iteration, resume)

    def current_gate(self) -> Any:
        """The gate at the threshold this iteration runs with."""
        return self.knob.gate_at(self.threshold)

    def _score(self, record: Any) -> float:
        """The score the gate read for ``record`` (nan when the gate never ran on it)."""
        signals = record.gate_signals
        return math.nan if signals is None else self.knob.score(signals)

    def picks(self, group_index: int) -> bool:
        """Whether a cut of ``group_index`` is audited (``RolloutSettings.audit``): a seeded
        draw, the same on every run."""
        return audit_pick(self.seed, group_index, self.fraction)

    def audit(self, records: Sequence[Any], iteration: int) -> AuditMetrics:
        """Label this iteration's finished groups (every round): audited cuts (``r.audited``: the
        engine let them run to the end) by their full outcome, groups let through by theirs.
        Moves the threshold for the next iteration; returns the iteration's audit columns."""
        from srollout.core.grpo import is_zero_variance

        audited = [r for r in records if r.cut and r.audited]
        through = [r for r in records if not r.cut and r.gate_signals is not None]
        rows = [
            Labelled(iteration, self._score(r), is_zero_variance(r.rewards), source)
            for source, group in (("audit", audited), ("through", through))
            for r in group
        ]
        theta, step, tp = self._move(iteration, rows)
        # what the audit cost: the steps its groups took after their cut step
        cost = sum(max(0, len(t.actions) - r.cut_step) for r in audited for t in r.trajs)
        shown = self.knob.shown(theta)
        return AuditMetrics(len(audited), tp, len(audited) - tp, step.precision_lb, shown, cost)

    def band(self) -> Any:
        """The best band of the groups let through since the window's start, against the floor
        (core.audit.best_band): what the gate needs to loosen. None before any iteration."""
        if not self.ledger.thresholds:
            return None
        last = max(self.ledger.thresholds)
        return best_band(
            self.threshold,
            self.ledger.recent(last),
            confidence=self.confidence,
            min_n=certifiable_n(self.floor, self.confidence),
        )

    def export(self, iteration: int) -> Any:
        """The calibrated gate after ``iteration``, as an audited gate.json holds it: the base
        gate at the threshold the next iteration would run with, this audit's settings, the
        bound at that threshold, and the evidence."""
        from srollout.core.audited_gate import AuditedGate

        # the bound at the θ it exports: the audit's own when θ did not move, else anew
        if self.step is not None and self.step[:2] == (iteration, self.threshold):
            lb = self.step[2].precision_lb
        else:
            lb = self._next(iteration, self.threshold).precision_lb
        return AuditedGate(
            self.current_gate(),
            self.fraction,
            self.floor,
            self.confidence,
            self.ledger.window,
            None if math.isnan(lb) else lb,
            AuditLedger(self.ledger.window, list(self.ledger.rows), dict(self.ledger.thresholds)),
        )

    def save(self) -> None:
        """audit.json, atomically (before state.pt, as greso.json), and beside it the gate as
        calibrated so far (``gate-audited.json``, :meth:`export`): ``--gate`` takes it."""
        from srollout.atomic import atomic_write_json

        atomic_write_json(self.ledger.to_dict(), self.path)
        if self.ledger.thresholds:
            self.export(max(self.ledger.thresholds)).save(self.path.parent / AUDITED_GATE_FILE)


def resumed_ledger(path: Path, iteration: int) -> AuditLedger | None:
    """The ledger saved at ``path`` cut back to ``iteration`` (the checkpoint's; the file may be
    one iteration ahead of it), or None when there is none: how an audit resumes."""
    if not path.exists():
        return None
    import json

    ledger = AuditLedger.from_dict(json.loads(path.read_text()))
    ledger.truncate(iteration)
    return ledger


def carried_over(ledger: AuditLedger) -> AuditLedger:
    """A saved ledger renumbered to end at iteration 0, so a new run's iterations (1, 2, ...)
    come after it and its window reads the saved rows as the oldest evidence. The saved
    thresholds are history of another run and are not carried."""
    last = max((r.iteration for r in ledger.rows), default=0)
    rows = [r._replace(iteration=r.iteration - last) for r in ledger.rows]
    return AuditLedger(ledger.window, rows, {})
