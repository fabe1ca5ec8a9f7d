"""The audited gate: a rule gate whose threshold is kept honest while the policy trains. The
procedure, the bound, why Clopper–Pearson and how θ moves: docs/gates.md ("The audited gate").

Where each step lives: the seeded pick (:func:`audit_pick`), the window (:class:`AuditLedger`;
counted in audits rather than iterations, it keeps enough evidence when cuts are rare and forgets
old evidence as fast as new audits come in, which is what tracking drift needs), the hold /
refute / tighten / loosen moves (:func:`next_threshold`) and their bounds.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np

from srollout.errors import ArgumentError

DEFAULT_FLOOR = 0.85
DEFAULT_CONFIDENCE = 0.95
DEFAULT_WINDOW = 50  # audited cuts of evidence (and the groups let through since the oldest)
AUDIT_STREAM = 0xA0D1  # keeps the audit's draws apart from every other seeded stream
STOP_AUDIT_STREAM = 0xA0D2  # the trajectory gate's audit: one draw per (group, trajectory)


def clopper_pearson_lower(k: int, n: int, confidence: float = DEFAULT_CONFIDENCE) -> float:
    """One-sided Clopper–Pearson lower bound on a binomial proportion from k successes in n:
    the p with P(X >= k | n, p) = 1 - confidence (0 when k = 0; nan when n = 0)."""
    if n == 0:
        return math.nan
    if not 0 <= k <= n:
        raise ValueError(f"need 0 <= k <= n, got k={k}, n={n}")
    if k == 0:
        return 0.0
    from scipy.stats import beta

    return float(beta.ppf(1.0 - confidence, k, n - k + 1))


def clopper_pearson_upper(k: int, n: int, confidence: float = DEFAULT_CONFIDENCE) -> float:
    """One-sided Clopper–Pearson upper bound: the p with P(X <= k | n, p) = 1 - confidence
    (1 when k = n; nan when n = 0). Equals 1 - the lower bound of the n - k failures."""
    if not 0 <= k <= n:
        raise ValueError(f"need 0 <= k <= n, got k={k}, n={n}")
    return 1.0 - clopper_pearson_lower(n - k, n, confidence)


def certifiable_n(floor: float, confidence: float = DEFAULT_CONFIDENCE) -> int:
    """The fewest audited cuts whose bound can clear ``floor`` (all of them right):
    the smallest n with (1 - confidence)^(1/n) >= floor."""
    return max(1, math.ceil(math.log(1.0 - confidence) / math.log(floor) - 1e-12))


def _draw_below(fraction: float, *key: int) -> bool:
    """A uniform draw seeded by ``key`` below ``fraction`` (1.0: always, 0.0: never)."""
    if fraction >= 1.0 or fraction <= 0.0:
        return fraction >= 1.0
    return bool(np.random.default_rng(list(key)).random() < fraction)


def audit_pick(seed: int, group_index: int, fraction: float) -> bool:
    """Whether the cut group ``group_index`` of the run seeded ``seed`` is audited: a uniform draw
    from (seed, group index) below ``fraction`` (1.0: every cut, 0.0: none)."""
    return _draw_below(fraction, AUDIT_STREAM, seed, group_index)


def audit_pick_stop(seed: int, group_index: int, traj_idx: int, fraction: float) -> bool:
    """Whether a stop of trajectory ``traj_idx`` of group ``group_index`` is audited (the
    trajectory gate's audit): a uniform draw from (seed, group index, trajectory index) below
    ``fraction``, on a stream of its own."""
    return _draw_below(fraction, STOP_AUDIT_STREAM, seed, group_index, traj_idx)


def check_audit_options(audit: float, audit_floor: float) -> None:
    """The share of cuts audited ``audit`` in [0, 1] and the precision floor ``audit_floor`` in
    (0, 1), else one ArgumentError naming the argument (the CLI: ``--audit``, ``--audit-floor``)."""
    if not (isinstance(audit, (int, float)) and 0.0 <= audit <= 1.0):
        raise ArgumentError(
            f"{{audit:name}} must be a fraction in [0, 1], got {audit}", audit=audit
        )
    if not (isinstance(audit_floor, (int, float)) and 0.0 < audit_floor < 1.0):
        raise ArgumentError(
            f"{{audit_floor:name}} must lie in (0, 1), got {audit_floor}", audit_floor=audit_floor
        )


class Labelled(NamedTuple):
    """One group the audit knows the outcome of: its d_K, whether its full rollout was
    zero-variance, and how it is known ("audit": a cut rolled on; "through": a group the gate
    let through, which ran to the end)."""

    iteration: int
    score: float
    zero_var: bool
    source: str


class ThresholdStep(NamedTuple):
    """:func:`next_threshold`'s answer: the new θ, the bound at the old θ (nan: no audited cut
    below it), the audited cuts it rests on, and why θ moved (hold / refute / tighten / loosen /
    keep)."""

    threshold: float
    precision_lb: float
    n_audited: int
    move: str


def _midpoint(a: float, b: float | None) -> float:
    """A threshold between two sorted d_K values (cut iff d_K < θ takes ``a`` in, leaves ``b``
    out); just above ``a`` when there is no ``b``, capped at 1."""
    if b is None or b <= a:
        return min(1.0, a + 1e-6)
    return (a + b) / 2.0


def _prefixes(ordered: Sequence[tuple[float, bool]]) -> Iterable[tuple[int, int, float]]:
    """Over d_K-ordered (score, ok) pairs, every prefix a threshold can cut: (its length, how
    many are ok, the θ that takes it in and leaves the rest out). Equal d_K values fall on the
    same side of any θ, so a prefix never ends inside a tie."""
    k = 0
    for j, (score, ok) in enumerate(ordered, start=1):
        k += bool(ok)
        nxt = ordered[j][0] if j < len(ordered) else None
        if nxt is None or nxt != score:
            yield j, k, _midpoint(score, nxt)


def _largest(
    ordered: Sequence[tuple[float, bool]], holds: Callable[[int, int], bool]
) -> float | None:
    """The largest θ over d_K-ordered (score, ok) pairs whose prefix below θ, j long with k ok,
    ``holds(j, k)``; None when no prefix does."""
    best = None
    for j, k, theta in _prefixes(ordered):
        if holds(j, k):
            best = theta
    return best


def next_threshold(
    theta: float,
    labelled: Iterable[Labelled],
    *,
    floor: float = DEFAULT_FLOOR,
    confidence: float = DEFAULT_CONFIDENCE,
    min_n: int | None = None,
) -> ThresholdStep:
    """θ for the next iteration from the window's labelled groups (docs/gates.md, "How d_L
    moves"); ``min_n`` defaults to :func:`certifiable_n`."""
    rows = list(labelled)
    min_n = certifiable_n(floor, confidence) if min_n is None else min_n
    below = sorted((r.score, r.zero_var) for r in rows if r.source == "audit" and r.score < theta)
    n = len(below)
    lb = clopper_pearson_lower(sum(ok for _, ok in below), n, confidence) if n else math.nan
    if 0 < n < min_n:
        k = sum(ok for _, ok in below)
        if clopper_pearson_upper(k, n, confidence) >= floor:
            return ThresholdStep(theta, lb, n, "hold")
        # already shown below the floor on few audits: keep the largest prefix that is not
        unrefuted = _largest(below, lambda j, k: clopper_pearson_upper(k, j, confidence) >= floor)
        return ThresholdStep(unrefuted if unrefuted is not None else below[0][0], lb, n, "refute")

    def certified(j: int, k: int) -> bool:  # a prefix of at least min_n whose bound clears
        return j >= min_n and clopper_pearson_lower(k, j, confidence) >= floor

    if n and lb < floor:
        tight = _largest(below, certified)
        return ThresholdStep(tight if tight is not None else below[0][0], lb, n, "tighten")
    band = sorted((r.score, r.zero_var) for r in rows if r.source == "through" and r.score >= theta)
    wider = _largest(band, certified)
    if wider is not None and wider > theta:
        return ThresholdStep(wider, lb, n, "loosen")
    return ThresholdStep(theta, lb, n, "keep")


class Band(NamedTuple):
    """The best band the loosen move saw: the ``n`` groups let through nearest the threshold,
    ``zero_var`` of them zero-variance, and their bound (:func:`best_band`)."""

    n: int
    zero_var: int
    precision_lb: float


def best_band(
    theta: float,
    labelled: Iterable[Labelled],
    *,
    confidence: float = DEFAULT_CONFIDENCE,
    min_n: int,
) -> Band | None:
    """Of the groups let through at or above ``theta``, ordered by score, the prefix of at least
    ``min_n`` with the highest bound: why the gate did (or did not) loosen. None when fewer than
    ``min_n`` were let through."""
    band = sorted((r.score, r.zero_var) for r in labelled if r.source == "through")
    band = [(score, ok) for score, ok in band if score >= theta]
    best = None
    for j, k, _ in _prefixes(band):
        if j >= min_n:
            lb = clopper_pearson_lower(k, j, confidence)
            if best is None or lb > best.precision_lb:
                best = Band(j, k, lb)
    return best


@dataclass
class AuditLedger:
    """The audit's memory: every labelled group, the θ each iteration ran with, and the window
    :func:`next_threshold` reads (:meth:`recent`). Checkpointed as JSON (:meth:`to_dict`)."""

    window: int = DEFAULT_WINDOW
    rows: list[Labelled] = field(default_factory=list)
    thresholds: dict[int, float] = field(default_factory=dict)  # iteration -> θ it ran with

    def add(self, rows: Iterable[Labelled]) -> None:
        self.rows.extend(rows)

    def recent(self, iteration: int) -> list[Labelled]:
        """The rows up to ``iteration`` from the iteration of the ``window``-th latest audited cut
        on (every row while there are fewer audited cuts)."""
        rows = [r for r in self.rows if r.iteration <= iteration]
        audits = sorted(r.iteration for r in rows if r.source == "audit")
        start = audits[-self.window] if len(audits) >= self.window else -math.inf
        return [r for r in rows if r.iteration >= start]

    def truncate(self, iteration: int) -> None:
        """Forget everything after ``iteration`` (resume: audit.json may be one iteration ahead
        of the checkpoint)."""
        self.rows = [r for r in self.rows if r.iteration <= iteration]
        self.thresholds = {i: t for i, t in self.thresholds.items() if i <= iteration}

    def to_dict(self) -> dict[str, Any]:
        return {
            "window": self.window,
            "rows": [list(r) for r in self.rows],
            "thresholds": {str(i): t for i, t in sorted(self.thresholds.items())},
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> AuditLedger:
        return cls(
            int(d["window"]),
            [Labelled(int(i), float(s), bool(z), str(src)) for i, s, z, src in d["rows"]],
            {int(i): float(t) for i, t in d["thresholds"].items()},
        )
