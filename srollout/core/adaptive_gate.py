"""An adaptive-K gate: check a group at several steps K_1 < K_2 < ... and cut it at the first step
K_j where the pooled model of :mod:`srollout.core.learned_gate` gives P(zero-variance) ≥ t_j
(:func:`choose_step_thresholds`). The thresholds, the savings and the engine contract
(``decide`` alone cuts at K_1 only): docs/gates.md ("The adaptive-K gate").
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np
from numpy.typing import ArrayLike

from srollout.core.gate import _as_step, check_step, gate_kind
from srollout.core.learned_gate import (
    DEFAULT_FOLDS,
    DEFAULT_L2,
    LogisticModel,
    PooledGate,
    ThresholdChoice,
    as_threshold,
    assign_folds,
    choose_threshold,
    cross_fit_proba,
    row_table,
)
from srollout.core.sweep import GateOutcome, evaluate_cuts
from srollout.errors import SrolloutError

DEFAULT_CHECK_K = (5, 10, 15)


@gate_kind("adaptive")
@dataclass(frozen=True)
class AdaptiveGate(PooledGate):
    """Cut at the first check step K_j with P(zero-variance | signals at K_j) ≥ thresholds[j].

    check_K: ascending steps; thresholds: one per step (None = never cut at that step)."""

    model: LogisticModel
    check_K: tuple[int, ...] = DEFAULT_CHECK_K
    thresholds: tuple[float | None, ...] = (None, None, None)
    meta: Mapping[str, Any] = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        check_steps = tuple(_as_step(k, "check K") for k in self.check_K)
        if not check_steps or list(check_steps) != sorted(set(check_steps)):
            raise SrolloutError(
                f"adaptive gate: check K must be distinct ascending steps, got {list(self.check_K)}"
            )
        if len(self.thresholds) != len(check_steps):
            raise SrolloutError(
                f"adaptive gate: {len(self.thresholds)} thresholds for {len(check_steps)} "
                "check steps"
            )
        thresholds = tuple(as_threshold(t, "adaptive gate: thresholds") for t in self.thresholds)
        object.__setattr__(self, "check_K", check_steps)
        object.__setattr__(self, "thresholds", thresholds)

    @property
    def K(self) -> int:
        """The first check step (what a fixed-K loop evaluates this gate at)."""
        return self.check_K[0]

    def check_steps(self, T_max: int | None = None) -> tuple[int, ...]:
        return tuple(k for k in self.check_K if T_max is None or k <= T_max)

    def threshold_at(self, K: int) -> float | None:
        if K not in self.check_K:
            raise SrolloutError(
                f"adaptive gate checks at K = {', '.join(map(str, self.check_K))}, not {K}"
            )
        return self.thresholds[self.check_K.index(K)]

    def decide_matrix(self, signals_by_K: Mapping[int, ArrayLike]) -> tuple[np.ndarray, np.ndarray]:
        """Vectorised over N groups: signals_by_K[K] [N, S] for each check K -> (cut bool[N],
        cut_K int[N], 0 where not cut): the first check step whose threshold is reached."""
        N = np.asarray(signals_by_K[self.check_K[0]]).shape[0]
        cut = np.zeros(N, dtype=bool)
        cut_K = np.zeros(N, dtype=np.int64)
        for K in self.check_K:
            fire = ~cut & self.cut_at(K, signals_by_K[K])
            cut_K[fire] = K
            cut |= fire
        return cut, cut_K

    @classmethod
    def _check_body(cls, body: Mapping[str, Any], source: str) -> None:
        if not isinstance(body["check_K"], list) or not isinstance(body["thresholds"], list):
            raise SrolloutError(f"{source}: check_K and thresholds must be lists")


# --- choosing thresholds, evaluating variable cut steps ---------------------------------------


def choose_step_thresholds(
    proba_by_K: Mapping[int, ArrayLike],
    zero_var: ArrayLike,
    check_K: Sequence[int],
    precision_floor: float,
    gain_by_K: Mapping[int, ArrayLike] | None = None,
) -> tuple[ThresholdChoice, ...]:
    """Per-step thresholds in step order: at K_j, :func:`choose_threshold` on the groups not cut
    at an earlier step (their scores at K_j). proba_by_K[K]: [N] scores at K. gain_by_K (the
    measured objective): K -> [N] real steps after K; each step then maximises Σ gain over every
    group it cuts instead of TP."""
    zv = np.asarray(zero_var, dtype=bool)
    alive = np.ones(zv.size, dtype=bool)
    choices = []
    for K in check_K:
        p = np.asarray(proba_by_K[K], dtype=np.float64)
        gain = None if gain_by_K is None else gain_by_K[K]
        choice = choose_threshold(
            np.where(alive, p, np.nan), zv, precision_floor, gain, count_fp=gain is not None
        )
        choices.append(choice)
        if choice.threshold is not None:
            alive &= ~(p >= choice.threshold)
    return tuple(choices)


class AdaptiveFit(NamedTuple):
    gate: AdaptiveGate
    oof_proba: Mapping[int, np.ndarray]  # K -> [N] held-out scores at K


def fit_adaptive_gate(
    signals_by_K: Mapping[int, ArrayLike],
    zero_var: ArrayLike,
    check_K: Sequence[int],
    precision_floor: float,
    T_max: int,
    n_folds: int = DEFAULT_FOLDS,
    l2: float = DEFAULT_L2,
    seed: int = 0,
    groups: np.ndarray | None = None,
    gain_by_K: Mapping[int, ArrayLike] | None = None,
    names: Sequence[str] | None = None,
) -> AdaptiveFit:
    """Fit the pooled model on ``groups`` (default all) at ``check_K`` and the per-step thresholds
    on k-fold cross-fitted scores; the returned gate's model is refit on all ``groups``.
    gain_by_K: K -> [N] real steps after K, for the measured objective
    (:func:`choose_step_thresholds`)."""
    zv_all = np.asarray(zero_var, dtype=bool)
    groups = np.arange(zv_all.size) if groups is None else np.asarray(groups)
    Ks = tuple(sorted(set(check_K)))
    check_step(max(Ks), T_max, "check_K")
    zv = zv_all[groups]
    rows = row_table({K: np.asarray(signals_by_K[K])[groups] for K in Ks}, zv, Ks)
    heldout = cross_fit_proba(rows, assign_folds(zv, n_folds, seed), l2, names)
    proba = {K: heldout.proba[rows.K == K] for K in Ks}
    gains = (
        None
        if gain_by_K is None
        else {K: np.asarray(gain_by_K[K], dtype=np.float64)[groups] for K in Ks}
    )
    choices = choose_step_thresholds(proba, zv, Ks, precision_floor, gains)
    model = LogisticModel.fit(rows.X, rows.y, l2, names)
    meta = {
        "n_groups": int(zv.size),
        "n_zero_var": int(zv.sum()),
        "n_folds": int(len(heldout.folds)),
        "seed": int(seed),
        "precision_floor": float(precision_floor),
        "T_max": int(T_max),
        "heldout_cuts_per_K": [c.n_cut for c in choices],
        "heldout_tp_per_K": [c.tp for c in choices],
    }
    if gain_by_K is not None:  # recorded only off the default, so default files stay as they were
        meta["objective"] = "measured"
    return AdaptiveFit(AdaptiveGate(model, Ks, tuple(c.threshold for c in choices), meta), proba)


def evaluate_variable_cuts(
    cut: ArrayLike,
    cut_K: ArrayLike,
    zero_var: ArrayLike,
    T_max: int,
    remaining_steps: ArrayLike | None = None,
    total_steps: ArrayLike | None = None,
    advantages: Sequence[ArrayLike] | None = None,
) -> GateOutcome:
    """:func:`srollout.core.sweep.evaluate_cuts` with a cut step per group.

    cut: bool[N]; cut_K: int[N] (read where cut); remaining_steps: [N] real steps after the
    group's own cut step (give the value at cut_K for cut groups), total_steps [N]."""
    c = np.asarray(cut, dtype=bool)
    zv = np.asarray(zero_var, dtype=bool)
    N = zv.size
    if c.shape != (N,):
        raise SrolloutError(f"cut must have one entry per group ({N})")
    k = np.asarray(cut_K, dtype=np.float64)
    if np.any(c & ((k < 1) | (k > T_max))):
        raise SrolloutError(f"a cut step must lie in [1, T_max={T_max}]")
    saved = np.where(c, (T_max - k) / T_max, 0.0)
    # every field but the two savings that depend on the step is evaluate_cuts' (its K is moot)
    out = evaluate_cuts(c, zv, 1, T_max, remaining_steps, total_steps, advantages)
    return out._replace(
        safe_savings=float(saved[c & zv].sum() / N), raw_savings=float(saved.sum() / N)
    )
