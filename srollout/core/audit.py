"""The audited gate: a rule gate whose threshold is kept honest while the policy trains.

A threshold fitted offline goes stale as the policy trains (docs/results.md). The audit checks the
gate on the run itself:

1. each iteration rolls its groups out with the gate at threshold θ (R1/R3's d_L: cut iff
   d_K < θ);
2. each cut group is *audited* with probability ``fraction``, drawn from (seed, group index) so
   a rerun audits the same groups: it is rolled on to T_max with the same seeds and weights and
   no gate, and labelled a true positive iff its full outcome is zero-variance. The audit's
   rollouts are part of the run's cost (its time, steps and tokens);
3. every group the gate let through ran to the end anyway: its (d_K, zero-variance) is known
   for free;
4. θ for the next iteration comes from the evidence since the ``window``-th latest audited cut
   (:func:`next_threshold`). A window counted in audits rather than iterations keeps enough
   evidence when cuts are rare (one a iteration, an audit every few) and forgets old evidence
   as fast as new audits come in when they are many, which is what tracking drift needs.

The bound. ``gate/precision_lb`` is the one-sided Clopper–Pearson lower bound, at ``confidence``,
on the precision of the gate's cuts, from the audited cuts below the current θ. The audited cuts
are a uniform random sample of the cuts, so the bound speaks for all of them. Clopper–Pearson
because an audit sees few cuts (tens): it is exact, never covering less than its nominal level at
any count, where Wilson's or the normal interval cover less than nominal near a precision of 1,
the very region a floor of 0.85–0.95 lives in. Its price is conservatism: with every audited cut
right, a 95 % bound passes 0.85 only from 19 cuts on (0.05^(1/19) = 0.854).

How θ moves (each step certified by its own bound):
- fewer audited cuts below θ in the window than the bound needs to clear the floor at all
  (``min_n``, by default the n at which n right of n clears it: 19 for 0.85 at 95 %): θ stays
  (the start, from gate.json or a conservative default, is trusted until the audit can say
  something; a smaller n would tighten on every run's first audits, however good the gate),
  unless those few audits already *refute* the floor: their one-sided Clopper–Pearson upper
  bound lies below it (3 wrong of 6 at 0.85: upper bound 0.847). θ then falls to the largest
  prefix of the audited cuts that is not refuted, else below every audited cut. Without this a
  gate of precision 0.5 would cut unchecked until its 19th audit, which at a fraction of 0.5
  and two cuts an iteration is the whole of a 40-iteration run;
- the bound at θ is below the floor: θ tightens to the largest value whose audited cuts below it
  still clear the floor (a prefix of the audited cuts ordered by d_K), or, if none does, to the
  smallest audited d_K (the gate then cuts only groups more alike than every audited one);
- the bound at θ clears the floor, or nothing below θ was cut: θ may loosen over the groups it
  let through, ordered by d_K, to the largest value whose band [θ, θ') holds at least ``min_n``
  groups and whose own bound clears the floor. Both the old cuts and the band clear the floor,
  so their union does.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
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
    if n == 0:
        return math.nan
    if not 0 <= k <= n:
        raise ValueError(f"need 0 <= k <= n, got k={k}, n={n}")
    return 1.0 - clopper_pearson_lower(n - k, n, confidence)


def certifiable_n(floor: float, confidence: float = DEFAULT_CONFIDENCE) -> int:
    """The fewest audited cuts whose bound can clear ``floor`` (all of them right):
    the smallest n with (1 - confidence)^(1/n) >= floor."""
    return max(1, math.ceil(math.log(1.0 - confidence) / math.log(floor) - 1e-12))


def audit_pick(seed: int, group_index: int, fraction: float) -> bool:
    """Whether the cut group ``group_index`` of the run seeded ``seed`` is audited: a uniform draw
    from (seed, group index) below ``fraction`` (1.0: every cut, 0.0: none)."""
    if fraction >= 1.0:
        return True
    if fraction <= 0.0:
        return False
    return bool(np.random.default_rng([AUDIT_STREAM, seed, group_index]).random() < fraction)


def audit_pick_stop(seed: int, group_index: int, traj_idx: int, fraction: float) -> bool:
    """Whether a stop of trajectory ``traj_idx`` of group ``group_index`` is audited (the
    trajectory gate's audit): a uniform draw from (seed, group index, trajectory index) below
    ``fraction``, on a stream of its own."""
    if fraction >= 1.0:
        return True
    if fraction <= 0.0:
        return False
    rng = np.random.default_rng([STOP_AUDIT_STREAM, seed, group_index, traj_idx])
    return bool(rng.random() < fraction)


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


def _largest_certified(
    ordered: Sequence[tuple[float, bool]], floor: float, confidence: float, min_n: int
) -> float | None:
    """The largest θ over d_K-ordered (score, ok) pairs whose prefix below θ (at least ``min_n``
    long) has its Clopper–Pearson bound at or above ``floor``; None when no prefix does."""
    best = None
    for j, k, theta in _prefixes(ordered):
        if j >= min_n and clopper_pearson_lower(k, j, confidence) >= floor:
            best = theta
    return best


def _largest_unrefuted(
    ordered: Sequence[tuple[float, bool]], floor: float, confidence: float
) -> float | None:
    """The largest θ over d_K-ordered (score, ok) pairs whose prefix below θ is not shown below
    ``floor`` (its Clopper–Pearson upper bound at or above it); None when every prefix is."""
    best = None
    for j, k, theta in _prefixes(ordered):
        if clopper_pearson_upper(k, j, confidence) >= floor:
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
    """θ for the next iteration from the window's labelled groups (module docstring); ``min_n``
    defaults to :func:`certifiable_n`."""
    rows = list(labelled)
    min_n = certifiable_n(floor, confidence) if min_n is None else min_n
    below = sorted((r.score, r.zero_var) for r in rows if r.source == "audit" and r.score < theta)
    n = len(below)
    lb = clopper_pearson_lower(sum(ok for _, ok in below), n, confidence) if n else math.nan
    if 0 < n < min_n:
        k = sum(ok for _, ok in below)
        if clopper_pearson_upper(k, n, confidence) >= floor:
            return ThresholdStep(theta, lb, n, "hold")
        # already shown below the floor on few audits: keep only what is not
        unrefuted = _largest_unrefuted(below, floor, confidence)
        return ThresholdStep(unrefuted if unrefuted is not None else below[0][0], lb, n, "refute")
    if n and lb < floor:
        certified = _largest_certified(below, floor, confidence, min_n)
        return ThresholdStep(certified if certified is not None else below[0][0], lb, n, "tighten")
    band = sorted((r.score, r.zero_var) for r in rows if r.source == "through" and r.score >= theta)
    wider = _largest_certified(band, floor, confidence, min_n)
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
    :func:`next_threshold` reads: the iterations from the one of the ``window``-th latest audited
    cut on (all of them while there are fewer audits). Checkpointed as JSON (:meth:`to_dict`)."""

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


__all__ = (
    "DEFAULT_CONFIDENCE",
    "DEFAULT_FLOOR",
    "AuditLedger",
    "Band",
    "Labelled",
    "ThresholdStep",
    "audit_pick",
    "audit_pick_stop",
    "best_band",
    "certifiable_n",
    "check_audit_options",
    "clopper_pearson_lower",
    "clopper_pearson_upper",
    "next_threshold",
)
