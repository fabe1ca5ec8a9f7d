"""The audited gate as a file: ``{"kind": "audited", ...}`` (issue 35): a base gate (a threshold
rule or a learned gate) at the threshold an audit chose, with the audit's settings and evidence,
so the next run starts from the calibrated gate. How a run uses the file, and the checks on
load: docs/gates.md ("The calibrated gate as a file")::

    {"kind": "audited", "version": 1,
     "base": {"kind": "threshold", "rule": "r1", "K": 10, "d_L": 0.087, ...},
     "audit": 0.5, "precision_floor": 0.85, "confidence": 0.95, "window": 50,
     "precision_lb": 0.87,
     "ledger": {"window": 50, "rows": [[iteration, score, zero_var, "audit"|"through"], ...],
                "thresholds": {"1": 0.12, ...}}}
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from srollout.core.audit import DEFAULT_CONFIDENCE, DEFAULT_WINDOW, AuditLedger
from srollout.core.gate import (
    GATE_FILE_VERSION,
    AuditKnob,
    Gate,
    _check_header,
    _check_keys,
    gate_from_dict,
    gate_kind,
)
from srollout.core.signals import GroupSignals
from srollout.errors import SrolloutError

LABEL_SOURCES = ("audit", "through")


def _number(value: Any, name: str, source: str, lo: float, hi: float, *, open_lo: bool) -> float:
    """``value`` as a finite float in [lo, hi] (or (lo, hi] with ``open_lo``), else one line."""
    bad = isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating))
    x = math.nan if bad else float(value)
    inside = (lo < x if open_lo else lo <= x) and x <= hi  # False for nan
    if not inside:
        span = f"({lo}, {hi}]" if open_lo else f"[{lo}, {hi}]"
        raise SrolloutError(f"{source}: {name} must be a number in {span}, got {value!r}")
    return x


def _ledger(value: Any, source: str) -> AuditLedger:
    """The saved ledger, every row checked (a finite score, a bool label, a known source)."""
    where = f"{source}: ledger"
    if not isinstance(value, Mapping) or not {"window", "rows", "thresholds"} <= set(value):
        raise SrolloutError(f"{where} must be an object with window, rows and thresholds")
    rows = value["rows"]
    if not isinstance(rows, list):
        raise SrolloutError(f"{where}.rows must be a list")
    for i, row in enumerate(rows):
        ok = (
            isinstance(row, list)
            and len(row) == 4
            and isinstance(row[0], int)
            and not isinstance(row[0], bool)
            and isinstance(row[1], (int, float))
            and not isinstance(row[1], bool)
            and math.isfinite(row[1])
            and isinstance(row[2], bool)
            and row[3] in LABEL_SOURCES
        )
        if not ok:
            raise SrolloutError(
                f"{where}.rows[{i}] must be [iteration, finite score, true/false, "
                f"'audit' or 'through'], got {row!r}"
            )
    thresholds = value["thresholds"]
    if not isinstance(thresholds, Mapping):
        raise SrolloutError(f"{where}.thresholds must be an object")
    for k, t in thresholds.items():
        if not str(k).lstrip("-").isdigit():
            raise SrolloutError(f"{where}.thresholds: key {k!r} is not an iteration")
        _number(t, f"ledger.thresholds[{k}]", source, 0.0, 1.0, open_lo=False)
    window = value["window"]
    if isinstance(window, bool) or not isinstance(window, int) or window < 1:
        raise SrolloutError(f"{where}.window must be an integer >= 1, got {window!r}")
    return AuditLedger.from_dict(value)


@gate_kind("audited")
@dataclass(frozen=True)
class AuditedGate(Gate):
    """A base gate (threshold rule or learned gate) at its audited threshold, with the audit's
    settings and evidence. As a gate it decides as its base; an audited run moves the base's
    threshold from here on (``srollout.rollout.audit``)."""

    base: Any
    fraction: float
    floor: float
    confidence: float = DEFAULT_CONFIDENCE
    window: int = DEFAULT_WINDOW
    precision_lb: float | None = None
    ledger: AuditLedger | None = None

    @property
    def K(self) -> int:
        return int(self.base.K)

    def check_steps(self, T_max: int | None = None) -> tuple[int, ...]:
        return self.base.check_steps(T_max)

    def decide(self, signals: GroupSignals) -> bool:
        return bool(self.base.decide(signals))

    def decide_at(self, K: int, signals: GroupSignals) -> bool:
        return bool(self.base.decide_at(K, signals))

    def decide_batch(self, K: int, signals: Mapping[str, Any]) -> np.ndarray:
        return self.base.decide_batch(K, signals)

    def audit_knob(self) -> AuditKnob | None:
        return self.base.audit_knob()

    def to_dict(self) -> dict[str, Any]:
        lb = self.precision_lb
        return {
            "kind": "audited",
            "version": GATE_FILE_VERSION,
            "base": self.base.to_dict(),
            "audit": self.fraction,
            "precision_floor": self.floor,
            "confidence": self.confidence,
            "window": self.window,
            "precision_lb": None if lb is None or math.isnan(lb) else lb,
            "ledger": None if self.ledger is None else self.ledger.to_dict(),
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], source: str = "gate") -> AuditedGate:
        body = _check_header(d, "audited", source)
        _check_keys(
            body,
            required=("base", "audit", "precision_floor"),
            optional=("confidence", "window", "precision_lb", "ledger"),
            source=source,
        )
        base_d = body["base"]
        kind = base_d.get("kind") if isinstance(base_d, Mapping) else base_d
        wrong = SrolloutError(
            f"{source}: base must be a threshold or learned gate, or another kind with a threshold "
            f"an audit moves, got {kind!r}"
        )
        if not isinstance(base_d, Mapping) or kind == "audited":
            raise wrong
        base: Gate = gate_from_dict(base_d, f"{source}: base")
        if base.audit_knob() is None:
            raise wrong
        fraction = _number(body["audit"], "audit", source, 0.0, 1.0, open_lo=False)
        floor = _number(body["precision_floor"], "precision_floor", source, 0.0, 1.0, open_lo=True)
        if floor >= 1.0:
            raise SrolloutError(f"{source}: precision_floor must lie in (0, 1), got {floor}")
        confidence = _number(
            body.get("confidence", DEFAULT_CONFIDENCE), "confidence", source, 0.0, 1.0, open_lo=True
        )
        if confidence >= 1.0:
            raise SrolloutError(f"{source}: confidence must lie in (0, 1), got {confidence}")
        window = body.get("window", DEFAULT_WINDOW)
        if isinstance(window, bool) or not isinstance(window, int) or window < 1:
            raise SrolloutError(f"{source}: window must be an integer >= 1, got {window!r}")
        lb = body.get("precision_lb")
        lb = None if lb is None else _number(lb, "precision_lb", source, 0.0, 1.0, open_lo=False)
        ledger = None if body.get("ledger") is None else _ledger(body["ledger"], source)
        return cls(base, fraction, floor, confidence, window, lb, ledger)


def unwrap(gate: Gate) -> tuple[Gate, AuditLedger | None, float | None]:
    """The gate to run and what to start an audit from: an audited gate's base, ledger and
    confidence; any other gate as it is, with none."""
    if isinstance(gate, AuditedGate):
        return gate.base, gate.ledger, gate.confidence
    return gate, None, None
