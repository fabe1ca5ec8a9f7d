"""Sweep formulas (paper §4.4 Table "ablation", App. "Calibration against random-cut and oracle
gates", App. "Setting the precision floor"), vectorised over a grid of gates.

For N groups, a gate is a boolean cut vector judged against the full (un-gated) zero-variance
labels: TP, FP, precision, recall, safe, raw and measured step savings and adv_l2_kept are
docs/glossary.md's (precision nan when nothing is cut, recall nan when no group is zero-variance,
measured savings nan without step data). An operating point is the row with the largest savings
at precision ≥ a floor (:func:`choose_operating_point`); the savings it maximises, ``safe`` or
``measured``: docs/gates.md ("What the operating point maximises").

All shares are fractions (0.113 = 11.3 %).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np
from numpy.typing import ArrayLike

from srollout.errors import SrolloutError

# Precisions within this of the floor count as on it (16/20 must pass a 0.80 floor).
FLOOR_TOL = 1e-12


class GateOutcome(NamedTuple):
    """One gate's outcome on N groups (random-cut baseline: expectations, tp/fp as floats)."""

    n_cut: int
    tp: int
    fp: int
    precision: float
    recall: float
    safe_savings: float
    raw_savings: float
    measured_step_savings: float
    adv_l2_kept: float


class GridOutcome(NamedTuple):
    """The GateOutcome fields for M gates at once, each an array [M]."""

    n_cut: np.ndarray
    tp: np.ndarray
    fp: np.ndarray
    precision: np.ndarray
    recall: np.ndarray
    safe_savings: np.ndarray
    raw_savings: np.ndarray
    measured_step_savings: np.ndarray
    adv_l2_kept: np.ndarray

    def row(self, m: int) -> GateOutcome:
        """Gate m as a GateOutcome of Python scalars."""
        return GateOutcome(
            int(self.n_cut[m]),
            int(self.tp[m]),
            int(self.fp[m]),
            *(float(getattr(self, f)[m]) for f in GateOutcome._fields[3:]),
        )


def _check_steps(K: int, T_max: int) -> None:
    for name, v in (("K", K), ("T_max", T_max)):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
            raise SrolloutError(f"{name} must be an integer >= 1, got {v!r}")
    if K > T_max:
        raise SrolloutError(
            f"K={K} is beyond the horizon T_max={T_max}; the gate must act at K <= T_max"
        )


def _bool_vector(x: ArrayLike, name: str, n: int | None = None) -> np.ndarray:
    v = np.asarray(x)
    if v.ndim != 1:
        raise SrolloutError(f"{name} must be a 1-D array over groups, got shape {v.shape}")
    if v.dtype != bool:
        if not np.all(np.isin(v, (0, 1))):
            raise SrolloutError(f"{name} must hold booleans (or 0/1)")
        v = v.astype(bool)
    if n is not None and v.size != n:
        raise SrolloutError(f"{name} has {v.size} entries, expected one per group ({n})")
    return v


def _float_vector(x: ArrayLike, name: str, n: int) -> np.ndarray:
    v = np.asarray(x, dtype=np.float64)
    if v.shape != (n,):
        raise SrolloutError(f"{name} must have one entry per group ({n}), got shape {v.shape}")
    return v


def advantage_sq_norms(advantages: Sequence[ArrayLike]) -> np.ndarray:
    """‖A_g‖² of each group's advantage array: N arrays [G_g] -> [N]."""
    return np.array([float(np.sum(np.square(np.asarray(a, dtype=np.float64)))) for a in advantages])


def _sq_norms(
    advantages: Sequence[ArrayLike] | None, adv_sq: ArrayLike | None, n: int
) -> np.ndarray | None:
    """[N] squared advantage norms from either argument (None when neither is given)."""
    if advantages is not None and adv_sq is not None:
        raise SrolloutError("give advantages or adv_sq, not both")
    if adv_sq is not None:
        return _float_vector(adv_sq, "adv_sq", n)
    if advantages is None:
        return None
    if len(advantages) != n:
        raise SrolloutError(f"advantages has {len(advantages)} groups, expected {n}")
    return advantage_sq_norms(advantages)


def evaluate_grid(
    cut: ArrayLike,
    zero_var: ArrayLike,
    K: int,
    T_max: int,
    remaining_steps: ArrayLike | None = None,
    total_steps: ArrayLike | None = None,
    advantages: Sequence[ArrayLike] | None = None,
    adv_sq: ArrayLike | None = None,
) -> GridOutcome:
    """Outcomes of M gates on N groups in one pass.

    cut: bool[M, N] (or [N] for one gate), zero_var: bool[N] (full-outcome labels), K and T_max
    in steps; remaining_steps[N] = real env steps the group's G trajectories took after step K,
    total_steps[N] = real env steps of the whole group (give both or neither); advantages: N
    arrays [G_g] of the groups' GRPO advantages (for adv_l2_kept; nan without), or instead
    adv_sq[N] = their squared norms ‖A_g‖² (:func:`advantage_sq_norms`, computed once for many
    calls).
    """
    _check_steps(K, T_max)
    zv = _bool_vector(zero_var, "zero_var")
    N = zv.size
    c = np.asarray(cut)
    if c.ndim == 1:
        c = c[None, :]
    if c.ndim != 2 or c.shape[1] != N:
        raise SrolloutError(
            f"cut must have shape [M, {N}] (one column per group), got {np.shape(cut)}"
        )
    c = c.astype(bool)
    M = c.shape[0]
    if N == 0:
        raise SrolloutError("no groups to evaluate")

    n_cut = c.sum(axis=1)
    tp = (c @ zv.astype(np.int64)).astype(np.int64)
    fp = n_cut - tp
    n_zv = int(zv.sum())
    with np.errstate(divide="ignore", invalid="ignore"):
        precision = np.where(n_cut > 0, tp / np.maximum(n_cut, 1), np.nan)
    recall = tp / n_zv if n_zv else np.full(M, np.nan)
    per_cut = (T_max - K) / (N * T_max)
    safe = tp * per_cut
    raw = n_cut * per_cut

    costs = _costs(remaining_steps, total_steps, N)
    measured = np.full(M, np.nan) if costs is None else _share(c, *costs)

    sq = _sq_norms(advantages, adv_sq, N)
    if sq is None:
        kept = np.full(M, np.nan)
    else:
        full = float(sq.sum())
        kept = np.sqrt((~c) @ sq / full) if full > 0 else np.full(M, np.nan)

    return GridOutcome(
        n_cut.astype(np.int64),
        tp,
        fp.astype(np.int64),
        precision.astype(np.float64),
        np.asarray(recall, dtype=np.float64),
        np.asarray(safe, dtype=np.float64),
        np.asarray(raw, dtype=np.float64),
        np.asarray(measured, dtype=np.float64),
        np.asarray(kept, dtype=np.float64),
    )


def evaluate_cuts(
    cut: ArrayLike, zero_var: ArrayLike, K: int, T_max: int, *steps: Any, **named: Any
) -> GateOutcome:
    """One gate's outcome: cut bool[N] against zero_var bool[N]; ``steps`` / ``named``:
    :func:`evaluate_grid`'s remaining_steps, total_steps, advantages and adv_sq."""
    c = _bool_vector(cut, "cut")
    return evaluate_grid(c[None, :], zero_var, K, T_max, *steps, **named).row(0)


def threshold_cuts(
    d_K: ArrayLike,
    d_L_values: ArrayLike,
    tau_K: ArrayLike | None = None,
    t_high_values: ArrayLike | None = None,
) -> np.ndarray:
    """Cut matrix of a grid of threshold gates: bool[M, N].

    R1 grid (tau_K/t_high_values None): row m cuts d_K < d_L_values[m], M = len(d_L_values).
    R3 grid: rows run over the product (d_L, t_high), t_high fastest: row m = i·T + j cuts
    d_K < d_L_values[i] or tau_K >= t_high_values[j]. nan d_K never cuts on the d clause.
    """
    d = np.asarray(d_K, dtype=np.float64).ravel()
    dl = np.asarray(d_L_values, dtype=np.float64).ravel()
    cut = d[None, :] < dl[:, None]
    if (tau_K is None) != (t_high_values is None):
        raise SrolloutError("an R3 grid needs both tau_K and t_high_values")
    if tau_K is None:
        return cut
    tau = np.asarray(tau_K, dtype=np.float64).ravel()
    if tau.size != d.size:
        raise SrolloutError(f"tau_K has {tau.size} entries, d_K has {d.size}")
    th = np.asarray(t_high_values, dtype=np.float64).ravel()
    by_tau = tau[None, :] >= th[:, None]  # [T, N]
    return (cut[:, None, :] | by_tau[None, :, :]).reshape(dl.size * th.size, d.size)


def oracle_cuts(zero_var: ArrayLike) -> np.ndarray:
    """The oracle gate: cut exactly the zero-variance groups at K. bool[N]."""
    return _bool_vector(zero_var, "zero_var").copy()


def random_cut_expectation(
    n_cut: int,
    zero_var: ArrayLike,
    K: int,
    T_max: int,
    remaining_steps: ArrayLike | None = None,
    total_steps: ArrayLike | None = None,
    advantages: Sequence[ArrayLike] | None = None,
    adv_sq: ArrayLike | None = None,
) -> GateOutcome:
    """The random-cut policy at the same cut count, in closed form: the expectation of every field
    over all ways of cutting n_cut of the N groups uniformly without replacement.

    With m = n_cut, Z = #zero-variance: TP is hypergeometric, E[TP] = m·Z/N, and each group is
    cut with probability m/N, so every field linear in the cut follows (precision Z/N, nan at
    m = 0; recall m/N, nan when Z = 0). adv_l2_kept = sqrt(S/F), S the kept squared norm (the
    sum of N − m of the N group values s_g drawn without replacement, F = Σ s_g), is not linear:
    its mean is the second-order (delta-method) expansion sqrt(μ/F)·(1 − Var S / (8 μ²)),
    μ = E[S] = (N−m)/N·F, Var S = (N−m)·σ_s²·m/(N−1), σ_s² the population variance of s_g (exact,
    a mean over the N choices, when one group is cut or one is kept; checked against a large
    simulation in the tests). O(N) whatever m; :func:`random_cut_baseline` is the simulation it
    replaces. tp and fp are floats.
    """
    zv = _bool_vector(zero_var, "zero_var")
    N = zv.size
    _check_n_cut(n_cut, N)
    _check_steps(K, T_max)
    m = int(n_cut)
    n_zv = int(zv.sum())
    per_cut = (T_max - K) / (N * T_max)
    tp = m * n_zv / N
    precision = n_zv / N if m > 0 else math.nan
    recall = m / N if n_zv else math.nan
    costs = _costs(remaining_steps, total_steps, N)
    measured = math.nan if costs is None else random_measured_share(m, *costs)
    sq = _sq_norms(advantages, adv_sq, N)
    kept = math.nan if sq is None else _expected_l2_kept(sq, m)
    return GateOutcome(m, tp, m - tp, precision, recall, tp * per_cut, m * per_cut, measured, kept)


def _expected_l2_kept(sq: np.ndarray, m: int) -> float:
    """E[sqrt(S / F)] to second order, S = sum of N − m of the [N] values ``sq`` drawn without
    replacement, F = their total (see :func:`random_cut_expectation`)."""
    N = sq.size
    full = float(sq.sum())
    if full <= 0:
        return math.nan
    n_kept = N - m
    if n_kept == 0:
        return 0.0
    # exact where one group is cut or one is kept: a mean over the N choices
    if m == 1:
        return float(np.mean(np.sqrt(np.maximum(full - sq, 0.0) / full)))
    if n_kept == 1:
        return float(np.mean(np.sqrt(sq / full)))
    mu = n_kept / N * full
    var = n_kept * float(sq.var()) * m / (N - 1) if N > 1 else 0.0
    return math.sqrt(mu / full) * (1.0 - var / (8.0 * mu * mu))


def _check_n_cut(n_cut: int, N: int) -> None:
    if isinstance(n_cut, bool) or not isinstance(n_cut, (int, np.integer)) or not 0 <= n_cut <= N:
        raise SrolloutError(f"n_cut must be an integer in [0, {N}], got {n_cut!r}")


def random_cut_baseline(
    n_cut: int,
    zero_var: ArrayLike,
    K: int,
    T_max: int,
    remaining_steps: ArrayLike | None = None,
    total_steps: ArrayLike | None = None,
    advantages: Sequence[ArrayLike] | None = None,
    n_draws: int = 1000,
    seed: int = 0,
) -> GateOutcome:
    """The random-cut policy simulated: n_cut groups chosen uniformly without replacement,
    n_draws times; every field is the mean over draws (tp, fp as floats). Memory and time grow
    as n_draws × N: the sweep uses :func:`random_cut_expectation`, which this checks."""
    zv = _bool_vector(zero_var, "zero_var")
    N = zv.size
    _check_n_cut(n_cut, N)
    if isinstance(n_draws, bool) or not isinstance(n_draws, (int, np.integer)) or n_draws < 1:
        raise SrolloutError(f"n_draws must be a positive integer, got {n_draws!r}")
    rng = np.random.Generator(np.random.PCG64(seed))
    # Ranks of iid uniforms are a uniform random permutation; the n_cut smallest are cut.
    order = np.argsort(rng.random((n_draws, N)), axis=1)
    cut = np.zeros((n_draws, N), dtype=bool)
    np.put_along_axis(cut, order[:, :n_cut], True, axis=1)
    grid = evaluate_grid(cut, zv, K, T_max, remaining_steps, total_steps, advantages)
    with np.errstate(invalid="ignore"):
        means = [float(np.mean(getattr(grid, f))) for f in GateOutcome._fields[1:]]
    return GateOutcome(int(n_cut), *means)


def _field(row: Any, name: str) -> Any:
    if isinstance(row, Mapping):
        return row.get(name)
    return getattr(row, name, None)


# objective -> the savings column an operating point maximises ("safe": the paper's)
OBJECTIVES: dict[str, str] = {"safe": "safe_savings", "measured": "measured_step_savings"}


def choose_operating_point(
    rows: Any, precision_floor: float = 0.80, objective: str = "safe"
) -> int | None:
    """Index of the operating point: the largest savings among rows with precision >= floor.

    rows: a sequence of mappings or objects with ``precision`` and the objective's column
    (:data:`OBJECTIVES`; nan never qualifies) and optionally ``d_L``, or a table with
    ``to_dicts()`` (a Polars DataFrame). Ties: higher precision, then smaller d_L, then the earlier
    row. None when no row clears the floor (rows with nan precision — nothing cut — never do).
    """
    if not 0.0 <= precision_floor <= 1.0:
        raise SrolloutError(f"precision floor must be in [0, 1], got {precision_floor}")
    if objective not in OBJECTIVES:
        raise SrolloutError(f"objective must be one of {', '.join(OBJECTIVES)}, got {objective!r}")
    column = OBJECTIVES[objective]
    if hasattr(rows, "to_dicts"):
        rows = rows.to_dicts()
    best: tuple[float, float, float] | None = None
    best_i: int | None = None
    for i, row in enumerate(rows):
        p = _field(row, "precision")
        s = _field(row, column)
        if p is None or s is None:
            raise SrolloutError(f"sweep row {i} lacks precision or {column}")
        p, s = float(p), float(s)
        if math.isnan(p) or math.isnan(s) or p < precision_floor - FLOOR_TOL:
            continue
        d_l = _field(row, "d_L")
        d_l = math.inf if d_l is None or math.isnan(float(d_l)) else float(d_l)
        # Rounded savings so that float noise between equal fractions does not break the tie.
        key = (round(s, 12), p, -d_l)
        if best is None or key > best:
            best, best_i = key, i
    return best_i


def measured_share(cut: ArrayLike, remaining: ArrayLike, total: ArrayLike) -> np.ndarray:
    """Measured savings of M gates from any per-group cost (steps, generated tokens): cut
    bool[M, N] (or [N]), remaining[N] = the cost the group spent after its cut step, total[N] =
    the group's whole cost -> [M] Σ remaining[cut] / Σ total (nan when Σ total is 0)."""
    c = np.atleast_2d(np.asarray(cut, dtype=bool))
    return _share(c, *_costs(remaining, total, c.shape[1]))


def _costs(remaining: ArrayLike | None, total: ArrayLike | None, n: int):
    """The checked per-group costs (remaining [N], total [N]) as float arrays; None when neither
    is given."""
    if (remaining is None) != (total is None):
        raise SrolloutError(
            "measured savings need both remaining_steps and total_steps (or neither)"
        )
    if remaining is None:
        return None
    rem = _float_vector(remaining, "remaining_steps", n)
    tot = _float_vector(total, "total_steps", n)
    if np.any(rem < 0) or np.any(rem > tot):
        raise SrolloutError("remaining_steps must lie between 0 and the group's total_steps")
    return rem, tot


def _share(c: np.ndarray, rem: np.ndarray, tot: np.ndarray) -> np.ndarray:
    whole = float(tot.sum())
    return (c @ rem) / whole if whole > 0 else np.full(c.shape[0], np.nan)


def random_measured_share(n_cut: int, remaining: ArrayLike, total: ArrayLike) -> float:
    """The measured savings of a random cut of ``n_cut`` of the N groups, in expectation over all
    such cuts: each group is cut with probability n_cut/N, so n_cut/N · Σ remaining / Σ total
    (remaining[N], total[N] as in :func:`measured_share`; nan when Σ total is 0)."""
    rem = np.asarray(remaining, dtype=np.float64)
    _check_n_cut(n_cut, rem.size)
    whole = float(np.sum(np.asarray(total, dtype=np.float64)))
    return int(n_cut) / rem.size * float(rem.sum()) / whole if whole > 0 else math.nan


def useful_groups_lost(precision: float, n_cut: int, n_nonzero_var: int) -> float:
    """Worst-case share of useful (non-zero-variance) groups a gate cuts: (1−p)·|cut| /
    |nonzero-var|.

    Paper App. "Setting the precision floor": p = 0.81, 21 cuts, 61 mixed groups → ≈ 6.5 %.
    """
    if n_nonzero_var <= 0:
        raise SrolloutError("no non-zero-variance groups: the lost share is undefined")
    return (1.0 - precision) * n_cut / n_nonzero_var


def precision_floor_for(eta: float, n_nonzero_var: int, n_cut: int) -> float:
    """The precision floor that bounds the worst-case useful-group loss by eta: 1 −
    η·|nonzero-var|/|cut|.

    Paper: η = 0.10, 61 non-zero-variance groups, 21 cuts → ≈ 0.71 (so 0.80 is conservative).
    """
    if n_cut <= 0:
        raise SrolloutError("n_cut must be > 0 to derive a precision floor")
    return 1.0 - eta * n_nonzero_var / n_cut
