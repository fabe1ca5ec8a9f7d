"""Statistics for the analysis and the A/B claims (paper §4.3, App. "Bootstrap confidence
intervals"): Spearman's ρ with its t-test p-value, AUROC as Mann–Whitney U, seeded percentile
bootstrap (plain and paired), exact McNemar test.

The tests are scipy.stats's; this module adds the paper's conventions around them (nan handling,
one-line errors, the paired p-value, ratios of sums). The bootstrap draws with one
``numpy.random.Generator(PCG64(seed))``, so the same seed gives the same interval. Three
hand-written fast paths, each held to scipy's numbers by tests and timed in docs/benchmarks.md:
:func:`bootstrap_sums_ci` (counts of distinct rows, for statistics of column sums),
:func:`relative_saving_ci` (scipy's own resamples, gathered by hand) and :func:`rank_stats` (ρ and
AUROC from one ranking).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from typing import NamedTuple

import numpy as np
from numpy.typing import ArrayLike

from srollout.errors import SrolloutError

# Cells of the resampled-index matrix [rows, N] held in memory at once: bounds memory at about
# 4 bytes * _CHUNK_CELLS (plus the gathered values) whatever n_resamples and N are.
_CHUNK_CELLS = 4_000_000


class SpearmanResult(NamedTuple):
    rho: float
    p_value: float
    n: int


class BootstrapCI(NamedTuple):
    estimate: float
    low: float
    high: float
    n_resamples: int
    level: float


class PairedBootstrap(NamedTuple):
    diff: float
    low: float
    high: float
    p_value: float
    n: int


class McNemarResult(NamedTuple):
    b01: int
    b10: int
    statistic: float
    p_value: float


def rankdata(x: np.ndarray) -> np.ndarray:
    """Ranks 1..n of a 1-D array, ties get the average of their ranks (``scipy.stats.rankdata``)."""
    from scipy.stats import rankdata as scipy_rankdata

    return scipy_rankdata(np.asarray(x)).astype(np.float64)


def _paired(
    a: ArrayLike, b: ArrayLike, what: str = "samples", empty: str | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Two equally long float64 vectors of paired values (``what`` words the error), refused with
    the message ``empty`` when they are empty and it is given."""
    x = np.asarray(a, dtype=np.float64).ravel()
    y = np.asarray(b, dtype=np.float64).ravel()
    if x.size != y.size:
        raise SrolloutError(f"paired {what} have different lengths ({x.size} vs {y.size})")
    if x.size == 0 and empty is not None:
        raise SrolloutError(empty)
    return x, y


def spearman(x: ArrayLike, y: ArrayLike, nan_policy: str = "omit") -> SpearmanResult:
    """Spearman's ρ of paired samples x, y: [n] with the two-sided p-value of scipy.stats.spearmanr.

    ρ is Pearson's r of the average-tie ranks; p from t = ρ·sqrt((n-2)/(1-ρ²)) with n-2 degrees
    of freedom. nan ρ (and p) when a side is constant or n < 2; p is nan for n < 3.
    nan_policy "omit" drops pairs with a nan (n counts the pairs used); "propagate" returns nan.
    """
    a, b = _paired(x, y)
    if nan_policy not in ("omit", "propagate"):
        raise SrolloutError(f"nan_policy must be 'omit' or 'propagate', got {nan_policy!r}")
    if nan_policy == "omit":
        keep = ~(np.isnan(a) | np.isnan(b))
        a, b = a[keep], b[keep]
    n = int(a.size)
    nan = SpearmanResult(math.nan, math.nan, n)
    if n < 2 or np.isnan(a).any() or np.isnan(b).any() or a.min() == a.max() or b.min() == b.max():
        return nan
    from scipy.stats import spearmanr

    res = spearmanr(a, b)
    rho = max(-1.0, min(1.0, float(res.statistic)))
    if abs(rho) > 1.0 - 1e-12:  # scipy's Pearson of ranks leaves ±1 a rounding away from ±1
        rho = math.copysign(1.0, rho)
    if n < 3:
        return SpearmanResult(rho, math.nan, n)
    return SpearmanResult(rho, float(res.pvalue), n)


class RankStats(NamedTuple):
    """Spearman ρ of a score against a target (with its p-value) and the AUROC of the score for
    a binary label, over the n pairs with a finite score."""

    n: int
    rho: float
    p_value: float
    auroc: float


def rank_stats(
    score: ArrayLike, target: ArrayLike, positive: ArrayLike, target_ranks: ArrayLike | None = None
) -> RankStats:
    """:func:`spearman` (score, target) and :func:`auroc` (score, positive) from one ranking of
    the score: ρ is Pearson's r of the average-tie ranks, AUROC the positives' rank sum (U).

    score, target: [N] floats; positive: bool[N]. Pairs with a nan score are dropped (n counts the
    rest); target_ranks: ``rankdata(target)`` when the caller already has it and no score is
    nan (analyze ranks σ_r² once per K for seven signals). ρ and p are nan for n < 3 or a
    constant side; AUROC is nan when a class is empty (a fast path: module docstring).
    """
    x = np.asarray(score, dtype=np.float64).ravel()
    y = np.asarray(target, dtype=np.float64).ravel()
    pos = np.asarray(positive).ravel().astype(bool)
    if not x.size == y.size == pos.size:
        raise SrolloutError(
            f"score, target and positive have different lengths ({x.size}, {y.size}, {pos.size})"
        )
    ok = np.isfinite(x)
    if not ok.all():
        x, y, pos, target_ranks = x[ok], y[ok], pos[ok], None
    n = int(x.size)
    if n == 0:
        return RankStats(0, math.nan, math.nan, math.nan)
    rx = rankdata(x)
    n_pos = int(pos.sum())
    n_neg = n - n_pos
    auc = (
        (float(rx[pos].sum()) - n_pos * (n_pos + 1) / 2.0) / (n_pos * n_neg)
        if n_pos and n_neg
        else math.nan
    )
    if n < 3 or x.min() == x.max() or y.min() == y.max():
        return RankStats(n, math.nan, math.nan, auc)
    ry = rankdata(y) if target_ranks is None else np.asarray(target_ranks, dtype=np.float64)
    rx -= rx.mean()
    ry = ry - ry.mean()
    rho = max(-1.0, min(1.0, float(rx @ ry) / math.sqrt(float(rx @ rx) * float(ry @ ry))))
    if abs(rho) > 1.0 - 1e-12:  # ranks in the same (or opposite) order: exactly ±1
        rho = math.copysign(1.0, rho)
    return RankStats(n, rho, float(spearman_p_value(rho, n)), auc)


def spearman_p_value(rho: ArrayLike, n: ArrayLike) -> np.ndarray:
    """Two-sided p-value of Spearman's ρ from n pairs, elementwise (the t-test of
    ``scipy.stats.spearmanr``): t = ρ·sqrt((n−2)/(1−ρ²)) with n − 2 degrees of freedom; 0 at
    |ρ| = 1, nan where ρ is nan or n < 3."""
    from scipy.stats import t as student_t

    r = np.asarray(rho, dtype=np.float64)
    dof = np.asarray(n, dtype=np.float64) - 2.0
    with np.errstate(divide="ignore", invalid="ignore"):
        t_stat = r * np.sqrt(dof / ((1.0 - r) * (1.0 + r)))
        p = 2.0 * student_t.sf(np.abs(t_stat), np.maximum(dof, 1.0))
    p = np.where(np.abs(r) == 1.0, 0.0, p)
    return np.where(np.isnan(r) | (dof < 1), np.nan, p)


def auroc(scores: ArrayLike, labels: ArrayLike) -> float:
    """Area under the ROC curve of ``scores`` for the positive class (labels True / 1).

    = U / (n_pos · n_neg), U the Mann–Whitney statistic of the positives: the probability that a
    random positive scores above a random negative, ties counting 1/2. Rows with a nan score are
    dropped; nan when a class is empty.
    """
    s = np.asarray(scores, dtype=np.float64).ravel()
    label = np.asarray(labels).ravel()
    if s.size != label.size:
        raise SrolloutError(f"scores and labels have different lengths ({s.size} vs {label.size})")
    keep = ~np.isnan(s)
    s, pos = s[keep], label[keep].astype(bool)
    n_pos = int(pos.sum())
    n_neg = int(pos.size - n_pos)
    if n_pos == 0 or n_neg == 0:
        return math.nan
    from scipy.stats import mannwhitneyu

    # U of the positives; the p-value is not used (the asymptotic method costs one ranking)
    u = float(mannwhitneyu(s[pos], s[~pos], method="asymptotic").statistic)
    return u / (n_pos * n_neg)


def _check_level(level: float, n_resamples: int) -> None:
    if not 0.0 < level < 1.0:
        raise SrolloutError(f"confidence level must be in (0, 1), got {level}")
    if (
        isinstance(n_resamples, bool)
        or not isinstance(n_resamples, (int, np.integer))
        or n_resamples < 1
    ):
        raise SrolloutError(f"n_resamples must be a positive integer, got {n_resamples!r}")


def _resample_indices(n: int, n_resamples: int, seed: int) -> Iterator[np.ndarray]:
    """Bootstrap row indices in chunks [rows, n]; the same (n, n_resamples, seed) gives the same
    sequence whichever statistic consumes it, so vectorised and per-resample paths agree."""
    rng = np.random.Generator(np.random.PCG64(seed))
    rows = max(1, _CHUNK_CELLS // max(n, 1))
    done = 0
    while done < n_resamples:
        b = min(rows, n_resamples - done)
        # int32 indices: a third of the generation time of int64 and half the memory.
        yield rng.integers(0, n, size=(b, n), dtype=np.int32)
        done += b


def _as_rows(data: ArrayLike, name: str = "data") -> np.ndarray:
    x = np.asarray(data, dtype=np.float64)
    if x.ndim not in (1, 2) or x.shape[0] == 0:
        raise SrolloutError(
            f"{name} must be a non-empty array of shape [N] or [N, k], got shape {x.shape}"
        )
    return x


def _batched_mean(xb: np.ndarray) -> np.ndarray:
    return xb.mean(axis=1)


def _bootstrap_stats(
    x: np.ndarray,
    statistic: Callable[[np.ndarray], float] | None,
    batched: bool,
    n_resamples: int,
    seed: int,
) -> np.ndarray:
    """The statistic on each of n_resamples resamples of the rows of x: [n_resamples].

    ``scipy.stats.bootstrap`` draws the row indices (in batches of ``_CHUNK_CELLS // N``
    resamples, which bounds memory) and the statistic sees ``x`` gathered at them."""
    if statistic is None:
        if x.ndim != 1:
            raise SrolloutError(
                "data of shape [N, k] needs a statistic (the default is the mean of [N] data)"
            )
        statistic, batched = _batched_mean, True

    def on_rows(idx: np.ndarray, axis: int = -1) -> np.ndarray:
        """The statistic of each resample, given its row indices idx: [b, N] -> [b]."""
        b = idx.shape[0]
        if batched:
            vals = np.asarray(statistic(x[idx]), dtype=np.float64)
            if vals.shape != (b,):
                raise SrolloutError(
                    "a batched statistic must return one value "
                    f"per resample, shape {(b,)}, got {vals.shape}"
                )
            return vals
        return np.array([statistic(x[r]) for r in idx], dtype=np.float64)

    n = x.shape[0]
    if n == 1:  # scipy needs two rows; every resample of one row is that row
        return np.repeat(on_rows(np.zeros((1, 1), dtype=np.intp)), n_resamples)
    import warnings

    from scipy.stats import bootstrap

    with warnings.catch_warnings():
        # nan resample values (a ratio over an empty resample) are dropped by _percentiles;
        # scipy's own interval, unused here, warns about them
        warnings.simplefilter("ignore")
        res = bootstrap(
            (np.arange(n),),
            on_rows,
            n_resamples=n_resamples,
            batch=max(1, _CHUNK_CELLS // n),
            vectorized=True,
            method="percentile",
            rng=np.random.Generator(np.random.PCG64(seed)),
        )
    return np.asarray(res.bootstrap_distribution, dtype=np.float64)


def _estimate(
    x: np.ndarray, statistic: Callable[[np.ndarray], float] | None, batched: bool
) -> float:
    if statistic is None:
        return float(x.mean())
    if batched:
        return float(np.asarray(statistic(x[None]), dtype=np.float64).reshape(-1)[0])
    return float(statistic(x))


def _percentiles(stats: np.ndarray, level: float) -> tuple[float, float]:
    alpha = (1.0 - level) / 2.0
    finite = stats[~np.isnan(stats)]
    if finite.size == 0:
        return math.nan, math.nan
    low, high = np.quantile(finite, [alpha, 1.0 - alpha])
    return float(low), float(high)


def bootstrap_ci(
    data: ArrayLike,
    statistic: Callable[[np.ndarray], float] | None = None,
    n_resamples: int = 10_000,
    level: float = 0.95,
    seed: int = 0,
    batched: bool = False,
) -> BootstrapCI:
    """Seeded percentile bootstrap CI of ``statistic`` over the rows of ``data``.

    data: [N] or [N, k]; rows are resampled with replacement (a row is one task/group, so the
    k columns of a row stay together). statistic: row-array -> float; None = mean of [N] data.

    Vectorised path: with ``statistic=None``, or with ``batched=True`` and a statistic that takes
    a batch of resamples [B, N] (or [B, N, k]) and returns [B] — write it over the last axes, e.g.
    the share of steps saved ``lambda x: 1 - x[..., 1].sum(-1) / x[..., 0].sum(-1)``. A batched
    statistic is also called once on ``data[None]`` for the estimate. Otherwise the statistic is
    called once per resample. Both paths see the same resamples. nan resample values are dropped.
    """
    _check_level(level, n_resamples)
    x = _as_rows(data)
    stats = _bootstrap_stats(x, statistic, batched, n_resamples, seed)
    low, high = _percentiles(stats, level)
    return BootstrapCI(_estimate(x, statistic, batched), low, high, int(n_resamples), float(level))


class ResampledSums(NamedTuple):
    """Column sums of a data table and of n_resamples bootstrap resamples of its rows.

    total: [k] the sums over all N rows; resampled: [n_resamples, k]; n: N."""

    total: np.ndarray
    resampled: np.ndarray
    n: int


def bootstrap_sums(data: ArrayLike, n_resamples: int = 10_000, seed: int = 0) -> ResampledSums:
    """The column sums of ``n_resamples`` bootstrap resamples of the rows of ``data`` [N] or [N, k],
    drawn as counts rather than rows.

    A resample of N rows drawn with replacement holds each distinct row r a Multinomial(N, c_r/N)
    number of times (c_r its count in the data), so its column sums are counts @ distinct rows:
    the same law as gathering N rows, at O(#distinct rows) per resample instead of O(N). For
    statistics of the sums (a share of groups, a ratio of sums) this is the row bootstrap of
    :func:`bootstrap_ci`, drawn from other random numbers (so with the same seed its interval
    differs from bootstrap_ci's by Monte Carlo noise only).
    """
    _check_level(0.5, n_resamples)
    x = _as_rows(data)
    if x.ndim == 1:
        x = x[:, None]
    n = x.shape[0]
    distinct, counts = np.unique(x, axis=0, return_counts=True)
    rng = np.random.Generator(np.random.PCG64(seed))
    p = counts / n
    rows = max(1, _CHUNK_CELLS // distinct.shape[0])
    out = np.empty((n_resamples, x.shape[1]), dtype=np.float64)
    for start in range(0, n_resamples, rows):
        b = min(rows, n_resamples - start)
        out[start : start + b] = rng.multinomial(n, p, size=b) @ distinct
    return ResampledSums(x.sum(axis=0), out, n)


def sums_ci(
    sums: ResampledSums, statistic: Callable[[np.ndarray, int], np.ndarray], level: float = 0.95
) -> BootstrapCI:
    """Percentile interval of ``statistic(column sums [..., k], N) -> [...]`` over the resamples
    of :func:`bootstrap_sums`; nan resample values (a ratio over an empty resample) are dropped."""
    _check_level(level, 1)
    with np.errstate(divide="ignore", invalid="ignore"):
        stats = np.asarray(statistic(sums.resampled, sums.n), dtype=np.float64)
        estimate = float(np.asarray(statistic(sums.total[None], sums.n)).reshape(-1)[0])
    low, high = _percentiles(stats, level)
    return BootstrapCI(estimate, low, high, int(sums.resampled.shape[0]), float(level))


def bootstrap_sums_ci(
    data: ArrayLike,
    statistic: Callable[[np.ndarray, int], np.ndarray],
    n_resamples: int = 10_000,
    level: float = 0.95,
    seed: int = 0,
) -> BootstrapCI:
    """Percentile bootstrap CI of a statistic of the column sums of ``data`` [N] or [N, k]:
    ``statistic(sums [..., k], N) -> [...]``, e.g. the mean ``lambda s, n: s[..., 0] / n`` or
    a ratio of sums ``lambda s, n: s[..., 0] / s[..., 1]``. See :func:`bootstrap_sums`."""
    _check_level(level, n_resamples)
    return sums_ci(bootstrap_sums(data, n_resamples, seed), statistic, level)


def paired_bootstrap(
    a: ArrayLike,
    b: ArrayLike,
    statistic: Callable[[np.ndarray], float] | None = None,
    n_resamples: int = 10_000,
    level: float = 0.95,
    seed: int = 0,
    batched: bool = False,
) -> PairedBootstrap:
    """Paired bootstrap of diff = stat(b) - stat(a) (b = treatment / gated arm, a = baseline).

    a, b: [N] (or [N, k]) paired rows (same task and seeds in both arms); each resample draws the
    same rows from both. statistic as in :func:`bootstrap_ci` (default mean). p_value is two-sided:
    twice the share of resampled diffs on the other side of 0 from the observed diff (a resample
    exactly at 0 counts as the other side), capped at 1; 1 when the observed diff is 0.
    """
    _check_level(level, n_resamples)
    xa, xb = _as_rows(a, "a"), _as_rows(b, "b")
    if xa.shape != xb.shape:
        raise SrolloutError(f"paired samples have different shapes ({xa.shape} vs {xb.shape})")
    if statistic is None and xa.ndim != 1:
        raise SrolloutError(
            "data of shape [N, k] needs a statistic (the default is the mean of [N] data)"
        )
    both = np.stack([xa, xb], axis=1)  # [N, 2, ...]: resampling rows keeps pairs together
    if statistic is None:
        statistic, batched = _batched_mean, True

    if batched:

        def diff_stat(z: np.ndarray) -> np.ndarray:
            return np.asarray(statistic(z[:, :, 1]), dtype=np.float64) - np.asarray(
                statistic(z[:, :, 0]), dtype=np.float64
            )

    else:

        def diff_stat(z: np.ndarray) -> float:
            return float(statistic(z[:, 1])) - float(statistic(z[:, 0]))

    stats = _bootstrap_stats(both, diff_stat, batched, n_resamples, seed)
    diff = _estimate(both, diff_stat, batched)
    low, high = _percentiles(stats, level)
    finite = stats[~np.isnan(stats)]
    if diff == 0.0 or finite.size == 0:
        p = 1.0
    elif diff > 0:
        p = min(1.0, 2.0 * float(np.mean(finite <= 0.0)))
    else:
        p = min(1.0, 2.0 * float(np.mean(finite >= 0.0)))
    return PairedBootstrap(diff, low, high, p, int(xa.shape[0]))


def relative_saving_ci(
    baseline: ArrayLike,
    gated: ArrayLike,
    n_resamples: int = 10_000,
    level: float = 0.95,
    seed: int = 0,
) -> BootstrapCI:
    """Bootstrap CI of the share saved, 1 - Σ gated / Σ baseline, over paired tasks (rows).

    baseline, gated: [N] per-task costs (wall-clock s, generated tokens, env steps) on matched
    seeds. This is the paper's "resample the task-level differences and recompute the
    percentage saving" (App. "Bootstrap confidence intervals"), as a fraction.
    """
    base, gate = _paired(
        baseline, gated, "samples", "relative_saving_ci needs at least one paired task"
    )
    if base.sum() <= 0:
        raise SrolloutError("the baseline costs sum to 0; no saving share is defined")
    _check_level(level, n_resamples)
    n = base.size
    # Gathering the two columns separately is ~3x faster than the generic [B, N, 2] gather and
    # gives the same numbers as bootstrap_ci with the batched share statistic (same resamples).
    stats = np.empty(n_resamples, dtype=np.float64)
    filled = 0
    for idx in _resample_indices(n, n_resamples, seed):
        base_cost = base[idx].sum(axis=1)
        with np.errstate(divide="ignore", invalid="ignore"):
            stats[filled : filled + idx.shape[0]] = np.where(
                base_cost > 0, 1.0 - gate[idx].sum(axis=1) / base_cost, np.nan
            )
        filled += idx.shape[0]
    low, high = _percentiles(stats, level)
    return BootstrapCI(
        1.0 - float(gate.sum() / base.sum()), low, high, int(n_resamples), float(level)
    )


class RunPairCI(NamedTuple):
    """estimate: 1 - Σ arm / Σ baseline over the timed-run pairs; low / high: the t interval
    (NaN with fewer than 2 pairs); n_pairs; level."""

    estimate: float
    low: float
    high: float
    n_pairs: int
    level: float


def run_pair_saving_ci(baseline: ArrayLike, arm: ArrayLike, level: float = 0.95) -> RunPairCI:
    """CI of the share saved, 1 - Σ arm / Σ baseline, with timed runs as the unit of sampling.

    baseline, arm: [P] measured wall-clock of P run pairs (the same groups and seeds, one run per
    arm: a block of one repeat of an A/B); why runs and not tasks, and the interval R ·
    exp(±t_{P-1} · s / √P), s the sd (ddof 1) of l_p = ln(arm_p / baseline_p) and R = Σ arm /
    Σ baseline: docs/ab-rollout.md ("Noise the task bootstrap does not see"). An arm run of zero
    wall-clock (a GRESO-like arm skipped its whole block) has no log-ratio: the estimate stands,
    the interval is NaN.
    Hand-worked: baseline (10, 10), arm (8, 9): l = (ln 0.8, ln 0.9), s = 0.08329,
    t_1 (97.5 %) = 12.706, half-width 0.7483, R = 0.85 -> ratio [0.4022, 1.7964], saving
    15 % [-79.6 %, 59.8 %].
    """
    base, mine = _paired(
        baseline, arm, "runs", "run_pair_saving_ci needs at least one pair of timed runs"
    )
    if np.any(base <= 0) or np.any(mine < 0):
        raise SrolloutError("timed runs must have positive wall-clock (an arm's may be 0)")
    if not 0 < level < 1:
        raise SrolloutError(f"confidence level must lie in (0, 1), got {level}")
    ratio = float(mine.sum() / base.sum())
    n = base.size
    if n < 2 or np.any(mine == 0):
        return RunPairCI(1.0 - ratio, math.nan, math.nan, n, float(level))
    from scipy.stats import t as student_t

    logs = np.log(mine / base)
    half = float(student_t.ppf(0.5 + level / 2, n - 1)) * float(logs.std(ddof=1)) / math.sqrt(n)
    return RunPairCI(
        1.0 - ratio, 1.0 - ratio * math.exp(half), 1.0 - ratio * math.exp(-half), n, float(level)
    )


def mcnemar(a_success: ArrayLike, b_success: ArrayLike) -> McNemarResult:
    """Exact McNemar test of paired binary outcomes (e.g. per-task success of two arms).

    b01 = #(a failed, b succeeded), b10 = #(a succeeded, b failed); under H0 the discordant
    pairs split Binomial(b01 + b10, 1/2). statistic = min(b01, b10); two-sided exact p =
    min(1, 2 · P[X <= min]) (1 when there are no discordant pairs).
    """
    a, b = (v.astype(bool) for v in _paired(a_success, b_success, "outcomes"))
    b01 = int(np.count_nonzero(~a & b))
    b10 = int(np.count_nonzero(a & ~b))
    n = b01 + b10
    k = min(b01, b10)
    if n == 0:
        return McNemarResult(b01, b10, float(k), 1.0)
    from scipy.stats import binomtest

    # binomtest's two-sided p at 1/2 is 2·P[X <= min] (the law is symmetric), capped at 1
    return McNemarResult(b01, b10, float(k), min(1.0, float(binomtest(k, n, 0.5).pvalue)))


def ratio_of_sums(data: np.ndarray) -> np.ndarray | float:
    """Σ column 0 / Σ column 1 of ``data[..., N, 2]`` (a batch axis in front is kept): precision
    (TP / cut) or measured savings (saved steps / all steps) of a resample of groups."""
    num = data[..., 0].sum(axis=-1)
    den = data[..., 1].sum(axis=-1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return num / den
