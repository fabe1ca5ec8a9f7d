"""A learned gate: L2-regularised logistic regression of P(zero-variance) on the signals at K plus
K itself (features standardised; fitted by Newton's method from zero, pure numpy), with a
threshold chosen under a precision floor on cross-fitted scores; reported numbers come from
nested held-out cuts (:func:`nested_heldout_cuts`), so every TP/FP is a decision on a group
nothing was fit on. The model, the features (:data:`FEATURE_SETS`), the objective and the
held-out procedure: docs/gates.md ("The learned gate", "What the operating point maximises",
"Chosen on one set of groups, judged on another").
"""

from __future__ import annotations

import dataclasses
import math
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple, TypeVar

import numpy as np
from numpy.typing import ArrayLike

from srollout.core.gate import (
    GATE_FILE_VERSION,
    AuditKnob,
    Gate,
    _as_step,
    _check_header,
    _check_keys,
    _fields_of,
    gate_kind,
)
from srollout.core.signals import GroupSignals
from srollout.core.sweep import FLOOR_TOL
from srollout.errors import SrolloutError
from srollout.signal_names import SIGNAL_NAMES, STEP_SIGNAL_NAMES

# the seven agreement signals: the classic features (the default, and every gate.json before
# the step signals)
SIGNAL_FIELDS: tuple[str, ...] = SIGNAL_NAMES
FEATURE_NAMES: tuple[str, ...] = (*SIGNAL_FIELDS, "K")
# feature set -> the signals it reads at K (the model's features are these, then K); "all" adds
# the step signals of srollout.core.step_signals. A gate.json records its features by name.
FEATURE_SETS: dict[str, tuple[str, ...]] = {
    "classic": SIGNAL_FIELDS,
    "all": SIGNAL_FIELDS + STEP_SIGNAL_NAMES,
}
DEFAULT_L2 = 1.0
DEFAULT_FOLDS = 5


# --- the logistic model -----------------------------------------------------------------------


class LogisticFit(NamedTuple):
    """Newton/IRLS result on standardised features: intercept b, weights w [d], iterations."""

    intercept: float
    coef: np.ndarray
    n_iter: int
    converged: bool


def _sigmoid(z: np.ndarray) -> np.ndarray:
    # the two branches avoid overflow in exp for large |z|
    out = np.empty_like(z, dtype=np.float64)
    pos = z >= 0
    out[pos] = 1.0 / (1.0 + np.exp(-z[pos]))
    ez = np.exp(z[~pos])
    out[~pos] = ez / (1.0 + ez)
    return out


def fit_logistic(
    X: ArrayLike, y: ArrayLike, l2: float = DEFAULT_L2, max_iter: int = 100, tol: float = 1e-10
) -> LogisticFit:
    """Minimise −Σ log-likelihood + (l2/2)·||w||² (intercept unpenalised) by Newton's method.

    X: [n, d] features (already standardised), y: [n] in {0, 1}, l2 = λ >= 0. Starts from zero;
    stops when the largest Newton step is below ``tol``. Both classes must be present (with one
    class the intercept runs to ±∞): SrolloutError otherwise.
    """
    X = np.asarray(X, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    if X.ndim != 2 or y.shape != (X.shape[0],):
        raise SrolloutError(
            f"fit_logistic: X must be [n, d] and y [n], got {X.shape} and {y.shape}"
        )
    if not np.all(np.isfinite(X)):
        raise SrolloutError("fit_logistic: features must be finite (standardise and impute first)")
    if l2 < 0 or not math.isfinite(l2):
        raise SrolloutError(f"the L2 penalty must be a finite number >= 0, got {l2}")
    n_pos = float(y.sum())
    if n_pos == 0 or n_pos == y.size:
        raise SrolloutError(
            "the learned gate needs both zero-variance and non-zero-variance groups to fit on "
            f"(got {int(n_pos)} of {y.size} zero-variance)"
        )
    n, d = X.shape
    A = np.column_stack([np.ones(n), X])  # column 0 = intercept
    penalty = np.full(d + 1, float(l2))
    penalty[0] = 0.0
    beta = np.zeros(d + 1)
    converged = False
    n_iter = 0
    while n_iter < max_iter:
        n_iter += 1
        p = _sigmoid(A @ beta)
        grad = A.T @ (p - y) + penalty * beta
        w = p * (1.0 - p)
        # a tiny ridge keeps H invertible when a feature is constant and l2 = 0
        H = (A * w[:, None]).T @ A + np.diag(penalty + 1e-12)
        step = np.linalg.solve(H, grad)
        beta = beta - step
        if np.max(np.abs(step)) < tol:
            converged = True
            break
    return LogisticFit(float(beta[0]), beta[1:].copy(), n_iter, converged)


def feature_set_of(width: int) -> str:
    """The feature set whose signals number ``width`` (7: classic, 9: all)."""
    for name, fields in FEATURE_SETS.items():
        if len(fields) == width:
            return name
    sizes = " or ".join(str(len(f)) for f in FEATURE_SETS.values())
    raise SrolloutError(f"signals must have {sizes} columns (a feature set), got {width}")


def feature_matrix(signals: ArrayLike, K: ArrayLike) -> np.ndarray:
    """[n, S + 1] raw features: the S signals (columns in the order of the model's
    ``signal_names``) and K."""
    s = np.asarray(signals, dtype=np.float64)
    if s.ndim != 2 or s.shape[1] < 1:
        raise SrolloutError(f"signals must be [n, S] (S signals), got shape {s.shape}")
    k = np.broadcast_to(np.asarray(K, dtype=np.float64), (s.shape[0],))
    return np.column_stack([s, k])


def named_matrix(signals: Mapping[str, Any], names: Sequence[str]) -> np.ndarray:
    """[N, S] the signals ``names`` of N groups from their columns by name; a signal not given is
    nan (the model imputes its training mean)."""
    n = len(np.asarray(signals["prefix_edit_distance_mean"]))
    nan = np.full(n, math.nan)
    return np.column_stack([np.asarray(signals.get(f, nan), np.float64) for f in names])


def signals_row(signals: GroupSignals, names: Sequence[str] = SIGNAL_FIELDS) -> np.ndarray:
    """[S] the signals ``names`` of one group (default the seven, :data:`SIGNAL_FIELDS` order);
    a step signal the caller did not compute (``signals.steps`` lacks it) is nan, which the
    model imputes with its training mean."""
    values = signals.as_dict()
    return np.array([values.get(f, math.nan) for f in names], dtype=np.float64)


@dataclass(frozen=True)
class LogisticModel:
    """An inspectable P(zero-variance) model: standardisation (mean, std per feature) + logistic
    weights on the standardised features. Arrays are tuples so the dataclass stays hashable."""

    mean: tuple[float, ...]
    std: tuple[float, ...]
    coef: tuple[float, ...]
    intercept: float
    l2: float = DEFAULT_L2
    feature_names: tuple[str, ...] = FEATURE_NAMES

    def __post_init__(self) -> None:
        d = len(self.feature_names)
        for name in ("mean", "std", "coef"):
            value = tuple(float(v) for v in getattr(self, name))
            if len(value) != d or not all(math.isfinite(v) for v in value):
                raise SrolloutError(f"learned gate: {name} must hold {d} finite numbers")
            object.__setattr__(self, name, value)
        if any(v <= 0 for v in self.std):
            raise SrolloutError("learned gate: std must be > 0")
        *signals, last = self.feature_names or ("",)
        known = (*SIGNAL_NAMES, *STEP_SIGNAL_NAMES)
        unknown = [n for n in signals if n not in known]
        if last != "K" or not signals or unknown or len(set(signals)) != len(signals):
            raise SrolloutError(
                "learned gate: features must be distinct signal names then K (signals: "
                f"{', '.join(known)}), got {list(self.feature_names)}"
            )
        object.__setattr__(self, "feature_names", tuple(self.feature_names))
        object.__setattr__(self, "intercept", float(self.intercept))

    @property
    def signal_names(self) -> tuple[str, ...]:
        """The signals the model reads at K (its features without K)."""
        return tuple(self.feature_names[:-1])

    @property
    def feature_set(self) -> str:
        """The :data:`FEATURE_SETS` entry the model reads (classic, all), else ``custom``."""
        return next((n for n, f in FEATURE_SETS.items() if f == self.signal_names), "custom")

    @classmethod
    def fit(
        cls, X: ArrayLike, y: ArrayLike, l2: float = DEFAULT_L2, names: Sequence[str] | None = None
    ) -> LogisticModel:
        """Standardise the raw features X [n, S + 1] (:func:`feature_matrix`; nan ignored in μ,
        σ and imputed with μ) and fit. names: the S signals of X's columns but the last (K), by
        name; without them, the feature set of S's width (7 classic, 9 all)."""
        X = np.asarray(X, dtype=np.float64)
        if names is None:
            names = FEATURE_SETS[feature_set_of(X.shape[1] - 1)]
        if len(names) != X.shape[1] - 1:
            raise SrolloutError(f"{len(names)} signal names for {X.shape[1] - 1} signal columns")
        names = (*names, "K")
        with np.errstate(invalid="ignore"):
            all_nan = np.all(np.isnan(X), axis=0)
            mean = np.where(all_nan, 0.0, np.nanmean(np.where(all_nan, 0.0, X), axis=0))
            std = np.where(all_nan, 0.0, np.nanstd(np.where(all_nan, 0.0, X), axis=0))
        std = np.where(std > 1e-12, std, 1.0)
        model = cls(tuple(mean), tuple(std), (0.0,) * X.shape[1], 0.0, l2, names)
        result = fit_logistic(model.standardise(X), y, l2)
        return cls(tuple(mean), tuple(std), tuple(result.coef), result.intercept, l2, names)

    def standardise(self, X: ArrayLike) -> np.ndarray:
        """(X − μ)/σ with nan → 0 (the training mean)."""
        X = np.asarray(X, dtype=np.float64)
        if X.shape[-1] != len(self.mean):
            raise SrolloutError(
                f"learned gate: {X.shape[-1] - 1} signals given, the model reads "
                f"{len(self.mean) - 1} ({', '.join(self.signal_names)})"
            )
        Z = (X - np.asarray(self.mean)) / np.asarray(self.std)
        return np.where(np.isnan(Z), 0.0, Z)

    def proba(self, X: ArrayLike) -> np.ndarray:
        """[n] P(zero-variance) for raw features X [n, S + 1] (the model's features)."""
        Z = self.standardise(np.atleast_2d(X))
        return _sigmoid(self.intercept + Z @ np.asarray(self.coef))

    def to_dict(self) -> dict[str, Any]:
        return {
            "features": list(self.feature_names),
            "mean": list(self.mean),
            "std": list(self.std),
            "coef": list(self.coef),
            "intercept": self.intercept,
            "l2": self.l2,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], source: str = "gate") -> LogisticModel:
        if not isinstance(d, Mapping):
            raise SrolloutError(f"{source}: 'model' must be an object")
        _check_keys(
            d,
            required=("features", "mean", "std", "coef", "intercept"),
            optional=("l2",),
            source=source,
        )
        try:
            return cls(
                mean=tuple(d["mean"]),
                std=tuple(d["std"]),
                coef=tuple(d["coef"]),
                intercept=d["intercept"],
                l2=float(d.get("l2", DEFAULT_L2)),
                feature_names=tuple(d["features"]),
            )
        except (TypeError, ValueError) as err:
            raise SrolloutError(f"{source}: malformed model ({err})") from None
        except SrolloutError as err:
            raise SrolloutError(f"{source}: {err}") from None


# --- folds, cross-fitting, thresholds ---------------------------------------------------------


class FoldRecord(NamedTuple):
    """Which groups (indices into the N groups) a fold's model was fit on and which it scored."""

    fold: int
    train_groups: np.ndarray
    test_groups: np.ndarray


def assign_folds(zero_var: ArrayLike, n_folds: int = DEFAULT_FOLDS, seed: int = 0) -> np.ndarray:
    """int[N] fold of each group in 0..k−1, stratified by zero_var (each class shuffled with the
    seed and dealt round-robin, so every fold gets its share of both classes). k is capped at N."""
    zv = np.asarray(zero_var, dtype=bool)
    if isinstance(n_folds, bool) or not isinstance(n_folds, (int, np.integer)) or n_folds < 2:
        raise SrolloutError(f"the number of folds must be an integer >= 2, got {n_folds!r}")
    N = zv.size
    if N < 2:
        raise SrolloutError(f"cross-fitting needs at least 2 groups, got {N}")
    k = min(int(n_folds), N)
    rng = np.random.Generator(np.random.PCG64(seed))
    folds = np.empty(N, dtype=np.int64)
    offset = 0
    for cls in (True, False):
        idx = np.flatnonzero(zv == cls)
        idx = idx[rng.permutation(idx.size)]
        folds[idx] = (offset + np.arange(idx.size)) % k
        offset += idx.size  # the next class continues the deal: fold sizes stay within one
    return folds


def fold_records(folds: ArrayLike) -> tuple[FoldRecord, ...]:
    """One FoldRecord per fold value of ``folds`` [N]."""
    f = np.asarray(folds)
    return tuple(
        FoldRecord(int(v), np.flatnonzero(f != v), np.flatnonzero(f == v)) for v in np.unique(f)
    )


class ThresholdChoice(NamedTuple):
    """A threshold on P(zero-variance) and what it does on the scores it was chosen on.

    threshold None: no threshold clears the floor (the gate never cuts). value: the Σ gain the
    threshold achieves (nan when None)."""

    threshold: float | None
    n_cut: int
    tp: int
    precision: float
    value: float = math.nan


def choose_threshold(
    scores: ArrayLike,
    zero_var: ArrayLike,
    precision_floor: float,
    gain: ArrayLike | None = None,
    count_fp: bool = False,
) -> ThresholdChoice:
    """The threshold t (cut iff score ≥ t) with the largest Σ gain over cut zero-variance groups
    among those whose precision TP/cut ≥ floor; ties: higher precision, then higher t.

    scores, zero_var, gain: [N] (gain default 1: maximise TP; the sweep passes T_max − K). nan
    scores never cut. Candidates are the distinct finite scores. count_fp: every cut group's
    gain counts, FPs' too (the measured objective, docs/gates.md).
    """
    s = np.asarray(scores, dtype=np.float64)
    zv = np.asarray(zero_var, dtype=bool)
    g = np.ones(s.size) if gain is None else np.asarray(gain, dtype=np.float64)
    ok = np.isfinite(s)
    s, zv, g = s[ok], zv[ok], g[ok]
    if s.size == 0:
        return ThresholdChoice(None, 0, 0, math.nan)
    order = np.argsort(-s, kind="stable")
    s_sorted, zv_sorted, g_sorted = s[order], zv[order], g[order]
    tp = np.cumsum(zv_sorted)
    cut = np.arange(1, s.size + 1)
    value = np.cumsum(g_sorted if count_fp else np.where(zv_sorted, g_sorted, 0.0))
    # a threshold keeps all of a tied block: only the last index of each block is a candidate
    last = np.r_[s_sorted[1:] != s_sorted[:-1], True]
    precision = tp / cut
    valid = last & (precision >= precision_floor - FLOOR_TOL) & (tp > 0)
    if not valid.any():
        return ThresholdChoice(None, 0, 0, math.nan)
    idx = np.flatnonzero(valid)
    # lexicographic: value, precision, threshold (all larger is better)
    best = idx[np.lexsort((s_sorted[idx], precision[idx], np.round(value[idx], 12)))[-1]]
    return ThresholdChoice(
        float(s_sorted[best]),
        int(cut[best]),
        int(tp[best]),
        float(precision[best]),
        float(value[best]),
    )


class RowTable(NamedTuple):
    """Training rows for the pooled model: one row per (group, K).

    X: [n, S + 1] raw features, y: [n] zero_var of the row's group, group: [n] index of the group in
    0..N−1, K: [n] the row's step."""

    X: np.ndarray
    y: np.ndarray
    group: np.ndarray
    K: np.ndarray

    def of_groups(self, groups: np.ndarray) -> RowTable:
        keep = np.isin(self.group, groups)
        return RowTable(self.X[keep], self.y[keep], self.group[keep], self.K[keep])


def row_table(
    signals_by_K: Mapping[int, ArrayLike], zero_var: ArrayLike, Ks: Sequence[int]
) -> RowTable:
    """Pool the N groups' signals at each K of ``Ks``: signals_by_K[K] is [N, S] (groups order)."""
    zv = np.asarray(zero_var, dtype=bool)
    parts = []
    for K in Ks:
        if K not in signals_by_K:
            raise SrolloutError(
                f"no signals at K={K} (have K = {', '.join(map(str, sorted(signals_by_K)))})"
            )
        X = feature_matrix(signals_by_K[K], K)
        if X.shape[0] != zv.size:
            raise SrolloutError(f"signals at K={K} have {X.shape[0]} groups, expected {zv.size}")
        parts.append(X)
    N = zv.size
    return RowTable(
        np.concatenate(parts),
        np.tile(zv, len(Ks)).astype(np.float64),
        np.tile(np.arange(N), len(Ks)),
        np.repeat(np.asarray(Ks, dtype=np.int64), N),
    )


class CrossFit(NamedTuple):
    """Held-out P(zero-variance) of every training row and the folds that produced them."""

    proba: np.ndarray
    folds: tuple[FoldRecord, ...]


def cross_fit_proba(
    rows: RowTable,
    group_fold: ArrayLike,
    l2: float = DEFAULT_L2,
    names: Sequence[str] | None = None,
) -> CrossFit:
    """Score each row with a model fit on the rows of the *other* folds' groups only.

    group_fold: int[N] fold per group (rows follow their group, so the K rows of one group are
    never split between fitting and scoring); names: the signal of each column of rows.X but K
    (:meth:`LogisticModel.fit`)."""
    proba = np.full(rows.y.size, np.nan)
    records = fold_records(np.asarray(group_fold))
    for rec in records:
        train = rows.of_groups(rec.train_groups)
        model = LogisticModel.fit(train.X, train.y, l2, names)
        test = np.isin(rows.group, rec.test_groups)
        proba[test] = model.proba(rows.X[test])
    return CrossFit(proba, records)


# --- the gate ---------------------------------------------------------------------------------


def as_threshold(t: Any, what: str) -> float | None:
    """A threshold on P(zero-variance): None (never cut) or a number in [0, 1], as a float."""
    if t is None:
        return None
    is_number = isinstance(t, (int, float, np.integer, np.floating)) and not isinstance(t, bool)
    if not is_number or not 0.0 <= float(t) <= 1.0:
        raise SrolloutError(f"{what} must be in [0, 1] or null, got {t!r}")
    return float(t)


class PooledGate(Gate, ABC):
    """What the learned and adaptive gates share: the pooled logistic model ``model`` with its
    training ``meta``; the decision at a check step K, P(zero-variance | signals at K, K) >=
    :meth:`threshold_at` (K), for one group or N groups; and the gate.json form (the
    kind's own fields, then ``model`` and ``meta``)."""

    model: LogisticModel
    meta: Mapping[str, Any]

    @abstractmethod
    def threshold_at(self, K: int) -> float | None:
        """The threshold at check step K (None: never cut there)."""

    def proba(self, signals: GroupSignals, K: int | None = None) -> float:
        """P(zero-variance) of one group from its signals at step K (default the first)."""
        row = signals_row(signals, self.model.signal_names)
        return float(self.model.proba(np.r_[row, self.K if K is None else K])[0])

    def decide_at(self, K: int, signals: GroupSignals) -> bool:
        """True iff the group is cut at check step K, given its signals at K."""
        t = self.threshold_at(K)
        return t is not None and self.proba(signals, K) >= t

    def decide(self, signals: GroupSignals) -> bool:
        """:meth:`decide_at` the first check step (the fixed-K protocol)."""
        return self.decide_at(self.K, signals)

    def cut_at(self, K: int, signals: ArrayLike) -> np.ndarray:
        """Vectorised :meth:`decide_at`: signals [N, S] at K (the model's signals) -> bool[N]."""
        s = np.asarray(signals, dtype=np.float64)
        t = self.threshold_at(K)
        if t is None:
            return np.zeros(s.shape[0], dtype=bool)
        return self.model.proba(feature_matrix(s, K)) >= t

    def decide_batch(self, K: int, signals: Mapping[str, Any]) -> np.ndarray:
        """:meth:`cut_at` on the model's signals by name (a step signal not given: nan, imputed
        by the model)."""
        return self.cut_at(K, named_matrix(signals, self.model.signal_names))

    def to_dict(self) -> dict[str, Any]:
        own = {n: v for n, v in _fields_of(type(self), self).items() if n not in ("model", "meta")}
        return {
            "kind": self.kind,
            "version": GATE_FILE_VERSION,
            **{n: list(v) if isinstance(v, tuple) else v for n, v in own.items()},
            "model": self.model.to_dict(),
            "meta": dict(self.meta),
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], source: str = "gate") -> Any:
        body = _check_header(d, cls.kind, source)
        own = [n for n in _fields_of(cls) if n not in ("model", "meta")]
        _check_keys(body, required=(*own, "model"), optional=("meta",), source=source)
        model = LogisticModel.from_dict(body["model"], source)
        cls._check_body(body, source)
        try:
            return cls(model, *(body[n] for n in own), meta=dict(body.get("meta") or {}))
        except SrolloutError as err:
            raise SrolloutError(f"{source}: {err}") from None

    @classmethod
    def _check_body(cls, body: Mapping[str, Any], source: str) -> None:
        """The kind's own checks of a gate.json body, before the gate is built."""


@gate_kind("learned")
@dataclass(frozen=True)
class LearnedGate(PooledGate):
    """Cut at step K iff the logistic model's P(zero-variance | signals at K, K) ≥ threshold
    (None: never cut; no threshold cleared the precision floor)."""

    model: LogisticModel
    K: int = 10
    threshold: float | None = None
    meta: Mapping[str, Any] = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "K", _as_step(self.K))
        t = as_threshold(self.threshold, "learned gate threshold")
        object.__setattr__(self, "threshold", t)

    def threshold_at(self, K: int) -> float | None:
        return self.threshold if K == self.K else None

    def decide_matrix(self, signals: ArrayLike) -> np.ndarray:
        """Vectorised decide: signals [N, S] at step K (the model's signals) -> bool[N]."""
        return self.cut_at(self.K, signals)

    def audit_knob(self) -> AuditKnob:
        """The audit moves the threshold t, as the score 1 - P below 1 - t."""
        start = 0.0 if self.threshold is None else 1.0 - self.threshold  # None: never cuts
        return AuditKnob(
            lambda s: 1.0 - self.proba(s),
            start,
            lambda t: dataclasses.replace(self, threshold=min(1.0, max(0.0, 1.0 - t))),
            lambda t: 1.0 - t,
        )


# --- fitting and held-out evaluation -----------------------------------------------------------


class HeldoutCuts(NamedTuple):
    """Decisions on every group made by a gate selected without it.

    cut: bool[N]; cut_K: int[N] the step of the cut (0 where not cut); folds: the outer folds
    (fit on train_groups, decisions on test_groups)."""

    cut: np.ndarray
    cut_K: np.ndarray
    folds: tuple[FoldRecord, ...]


G = TypeVar("G")

# select(train group indices) -> decide(test group indices) -> (cut bool[n_test], cut_K int[n_test])
Selector = Callable[[np.ndarray], Callable[[np.ndarray], tuple[np.ndarray, np.ndarray]]]


def nested_heldout_cuts(select: Selector, group_fold: ArrayLike) -> HeldoutCuts:
    """Outer cross-fitting of a whole gate-selection procedure: for each fold, ``select`` sees
    only the other folds' groups, and its gate decides the fold's groups."""
    fold_of_group = np.asarray(group_fold)
    cut = np.zeros(fold_of_group.size, dtype=bool)
    cut_K = np.zeros(fold_of_group.size, dtype=np.int64)
    records = fold_records(fold_of_group)
    for rec in records:
        decide = select(rec.train_groups)
        fold_cut, fold_cut_K = decide(rec.test_groups)
        cut[rec.test_groups] = fold_cut
        cut_K[rec.test_groups] = np.where(fold_cut, fold_cut_K, 0)
    return HeldoutCuts(cut, cut_K, records)


class LearnedFit(NamedTuple):
    """A learned gate fit on a set of groups, with the cross-fitted scores its threshold used."""

    gate: LearnedGate
    oof_proba: np.ndarray  # [n_rows] held-out P(zero-variance) of the training rows
    folds: tuple[FoldRecord, ...]


def fit_learned_gate(
    signals_by_K: Mapping[int, ArrayLike],
    zero_var: ArrayLike,
    gate_Ks: Sequence[int],
    train_Ks: Sequence[int],
    T_max: int,
    precision_floor: float,
    n_folds: int = DEFAULT_FOLDS,
    l2: float = DEFAULT_L2,
    seed: int = 0,
    groups: np.ndarray | None = None,
    gain_by_K: Mapping[int, ArrayLike] | None = None,
    names: Sequence[str] | None = None,
) -> LearnedFit:
    """Fit the pooled model on ``groups`` (default all N) at ``train_Ks`` and choose (K, threshold).

    K ∈ gate_Ks and the threshold maximise TP·(T_max − K) on k-fold cross-fitted scores with
    precision ≥ floor (ties: the smaller K); the returned gate's model is refit on all ``groups``.
    signals_by_K[K]: [N, S] (S = 7 classic or 9 all, :data:`FEATURE_SETS`); zero_var: [N].
    gain_by_K (the measured objective): K -> [N] the real steps each group spent after K.
    """
    zv_all = np.asarray(zero_var, dtype=bool)
    groups = np.arange(zv_all.size) if groups is None else np.asarray(groups)
    Ks = tuple(sorted(set(train_Ks) | set(gate_Ks)))
    rows = row_table({K: np.asarray(signals_by_K[K])[groups] for K in Ks}, zv_all[groups], Ks)
    zv = zv_all[groups]
    folds = assign_folds(zv, n_folds, seed)
    heldout = cross_fit_proba(rows, folds, l2, names)
    best: tuple[float, int, ThresholdChoice] | None = None
    for K in sorted(gate_Ks):
        gain = None if gain_by_K is None else np.asarray(gain_by_K[K], dtype=np.float64)[groups]
        p = heldout.proba[rows.K == K]
        choice = choose_threshold(p, zv, precision_floor, gain, count_fp=gain is not None)
        value = choice.tp * (T_max - K) if gain is None else choice.value
        if choice.threshold is None:  # nothing clears the floor at this K
            value = 0.0
        if best is None or value > best[0]:
            best = (value, K, choice)
    assert best is not None
    _, K, choice = best
    model = LogisticModel.fit(rows.X, rows.y, l2, names)
    meta = {
        "n_groups": int(zv.size),
        "n_zero_var": int(zv.sum()),
        "train_K": list(Ks),
        "n_folds": int(len(heldout.folds)),
        "seed": int(seed),
        "precision_floor": float(precision_floor),
        "T_max": int(T_max),
        "heldout_n_cut": choice.n_cut,
        "heldout_tp": choice.tp,
        "heldout_precision": None if math.isnan(choice.precision) else choice.precision,
    }
    if gain_by_K is not None:  # recorded only off the default, so default files stay as they were
        meta["objective"] = "measured"
    return LearnedFit(LearnedGate(model, K, choice.threshold, meta), heldout.proba, heldout.folds)


def gate_selector(
    fit: Callable[[np.ndarray], G], decide: Callable[[G, np.ndarray], tuple[np.ndarray, np.ndarray]]
) -> Selector:
    """A gate's selection procedure as a :data:`Selector` for :func:`nested_heldout_cuts`:
    ``fit(train groups)`` gives the gate, ``decide(gate, test groups)`` its (cut, cut_K)."""

    def select(train: np.ndarray) -> Callable[[np.ndarray], tuple[np.ndarray, np.ndarray]]:
        gate = fit(train)
        return lambda test: decide(gate, test)

    return select
