"""Unit tests of srollout.core.stats: hand-worked values, scipy as oracle, bootstrap properties."""

from __future__ import annotations

import math

import numpy as np
import pytest
import scipy.stats
from hypothesis import given, settings
from hypothesis import strategies as st

from srollout.core import stats as S
from srollout.core.stats import (
    auroc,
    bootstrap_ci,
    bootstrap_sums,
    bootstrap_sums_ci,
    mcnemar,
    paired_bootstrap,
    rank_stats,
    rankdata,
    relative_saving_ci,
    run_pair_saving_ci,
    spearman,
    spearman_p_value,
)
from srollout.errors import SrolloutError


def test_spearman_hand_worked():
    # x = 1,2,3; y = 1,3,2: rank differences 0,1,1 -> rho = 1 - 6*2/(3*8) = 0.5.
    # n = 3, 1 dof: t = 0.5*sqrt(1/0.75) = 1/sqrt(3); the t(1) law is Cauchy,
    # sf(t) = 1/2 - atan(t)/pi = 1/2 - 1/6, so p = 2*(1/3) = 2/3.
    r = spearman([1, 2, 3], [1, 3, 2])
    assert r.rho == pytest.approx(0.5)
    assert r.p_value == pytest.approx(2 / 3)
    assert r.n == 3


def test_spearman_edge_cases():
    assert spearman([1, 2, 3, 4], [2, 4, 6, 8]) == (1.0, 0.0, 4)
    assert math.isnan(spearman([1, 1, 1], [1, 2, 3]).rho)  # constant side
    two = spearman([1, 2], [2, 1])
    assert two.rho == -1.0 and math.isnan(two.p_value)
    # nan pairs are omitted by default, propagate on request.
    r = spearman([1, 2, np.nan, 3], [1, 3, 5, 2])
    assert r.n == 3 and r.rho == pytest.approx(0.5)
    assert math.isnan(spearman([1, 2, np.nan, 3], [1, 3, 5, 2], nan_policy="propagate").rho)
    with pytest.raises(SrolloutError, match="different lengths"):
        spearman([1, 2], [1, 2, 3])


@pytest.mark.filterwarnings("ignore::scipy.stats.ConstantInputWarning")
@settings(max_examples=60, deadline=None)
@given(st.integers(3, 60), st.integers(0, 2**31 - 1), st.sampled_from([3, 10, 1000]))
def test_spearman_matches_scipy(n, seed, levels):
    rng = np.random.default_rng(seed)
    x = rng.integers(0, levels, n).astype(float)  # few levels: many ties
    y = x * rng.choice([-1, 1]) + rng.integers(0, levels, n)
    got = spearman(x, y)
    want = scipy.stats.spearmanr(x, y)
    if np.isnan(want.statistic):
        assert np.isnan(got.rho)
    else:
        assert got.rho == pytest.approx(want.statistic, abs=1e-12)
        assert got.p_value == pytest.approx(want.pvalue, rel=1e-9, abs=1e-300)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(-3, 3), min_size=1, max_size=40))
def test_rankdata_matches_scipy(values):
    np.testing.assert_allclose(rankdata(np.array(values)), scipy.stats.rankdata(values))


def test_auroc_hand_worked():
    # positives 0.35, 0.8; negatives 0.1, 0.4: 0.35 beats 0.1 only, 0.8 beats both -> 3/4.
    assert auroc([0.1, 0.4, 0.35, 0.8], [0, 0, 1, 1]) == pytest.approx(0.75)
    assert auroc([0.5, 0.5], [True, False]) == pytest.approx(0.5)  # a tie counts 1/2
    assert auroc([0.1, 0.9], [False, True]) == 1.0
    assert math.isnan(auroc([0.1, 0.2], [1, 1]))
    assert auroc([np.nan, 0.1, 0.9], [0, 0, 1]) == 1.0  # nan score dropped


@settings(max_examples=60, deadline=None)
@given(st.integers(2, 80), st.integers(0, 2**31 - 1))
def test_auroc_matches_mannwhitneyu(n, seed):
    rng = np.random.default_rng(seed)
    scores = np.round(rng.random(n), 1)  # ties
    labels = rng.random(n) < 0.4
    labels[0], labels[1] = True, False
    u = scipy.stats.mannwhitneyu(scores[labels], scores[~labels]).statistic
    assert auroc(scores, labels) == pytest.approx(u / (labels.sum() * (~labels).sum()), abs=1e-12)


def test_bootstrap_constant_and_seeded():
    ci = bootstrap_ci(np.full(10, 3.0), n_resamples=200)
    assert (ci.estimate, ci.low, ci.high, ci.n_resamples, ci.level) == (3.0, 3.0, 3.0, 200, 0.95)
    x = np.random.default_rng(1).normal(size=50)
    assert bootstrap_ci(x, seed=5, n_resamples=500) == bootstrap_ci(x, seed=5, n_resamples=500)
    assert bootstrap_ci(x, seed=5, n_resamples=500) != bootstrap_ci(x, seed=6, n_resamples=500)


def test_bootstrap_width_of_a_mean():
    # For N = 2000 standard normals the 95% CI of the mean is about ±1.96/sqrt(N) = ±0.0438.
    x = np.random.default_rng(2).normal(size=2000)
    ci = bootstrap_ci(x, n_resamples=4000)
    assert ci.estimate == pytest.approx(x.mean())
    assert (ci.high - ci.low) / 2 == pytest.approx(1.96 * x.std() / np.sqrt(2000), rel=0.1)


def test_bootstrap_vectorised_equals_naive(monkeypatch):
    x = np.random.default_rng(3).exponential(size=37)
    fast = bootstrap_ci(x, n_resamples=1500, seed=9)
    naive = bootstrap_ci(x, statistic=np.mean, n_resamples=1500, seed=9)
    assert fast.low == pytest.approx(naive.low, abs=1e-12)
    assert fast.high == pytest.approx(naive.high, abs=1e-12)
    # Small chunks: the resamples are the same whichever way they are cut.
    monkeypatch.setattr(S, "_CHUNK_CELLS", 37 * 7)
    assert bootstrap_ci(x, n_resamples=1500, seed=9) == fast
    # A batched 2-D statistic equals the same statistic called per resample.
    rows = np.stack([x, x * 0.8 + 0.1], axis=1)

    def share(z):
        return 1 - z[..., 1].sum(-1) / z[..., 0].sum(-1)

    b = bootstrap_ci(rows, share, n_resamples=800, seed=4, batched=True)
    n = bootstrap_ci(rows, lambda z: float(share(z)), n_resamples=800, seed=4)
    assert b == pytest.approx(n, abs=1e-12)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(-1e3, 1e3), min_size=1, max_size=60), st.integers(0, 1000))
def test_bootstrap_ci_contains_estimate(values, seed):
    ci = bootstrap_ci(values, n_resamples=2000, seed=seed)
    tol = 1e-9 * (1 + max(abs(v) for v in values))  # rounding of equal means only
    assert ci.low - tol <= ci.estimate <= ci.high + tol


def test_bootstrap_bad_input():
    with pytest.raises(SrolloutError, match="level"):
        bootstrap_ci([1.0, 2.0], level=1.5)
    with pytest.raises(SrolloutError, match="n_resamples"):
        bootstrap_ci([1.0, 2.0], n_resamples=0)
    with pytest.raises(SrolloutError, match="non-empty"):
        bootstrap_ci([])
    with pytest.raises(SrolloutError, match="needs a statistic"):
        bootstrap_ci(np.ones((3, 2)))
    with pytest.raises(SrolloutError, match="one value per resample"):
        bootstrap_ci([1.0, 2.0], np.mean, batched=True)


def test_paired_bootstrap_hand_worked():
    a = np.arange(20, dtype=float)
    r = paired_bootstrap(a, a + 1.0, n_resamples=300)
    # Every resample shifts by exactly 1: diff = 1, CI [1, 1], no resample on the other side.
    assert (r.diff, r.low, r.high, r.p_value, r.n) == pytest.approx((1.0, 1.0, 1.0, 0.0, 20))
    same = paired_bootstrap(a, a, n_resamples=100)
    assert same.diff == 0.0 and same.p_value == 1.0
    neg = paired_bootstrap(a, a - 2.0, n_resamples=100)
    assert neg.diff == pytest.approx(-2.0) and neg.p_value == 0.0


def test_paired_bootstrap_noise_and_paths_agree():
    rng = np.random.default_rng(5)
    a = rng.normal(size=60)
    b = a + rng.normal(0.0, 1.0, size=60)  # no real effect
    r = paired_bootstrap(a, b, n_resamples=2000)
    assert r.low <= r.diff <= r.high and r.p_value > 0.05
    # Paired resampling: the CI of the mean of b - a equals the plain bootstrap of b - a.
    d = bootstrap_ci(b - a, n_resamples=2000)
    assert (r.low, r.high) == pytest.approx((d.low, d.high), abs=1e-12)
    naive = paired_bootstrap(a, b, statistic=np.mean, n_resamples=2000)
    batched = paired_bootstrap(a, b, statistic=lambda z: z.mean(-1), n_resamples=2000, batched=True)
    assert naive == pytest.approx(r, abs=1e-12) and batched == pytest.approx(r, abs=1e-12)
    with pytest.raises(SrolloutError, match="different shapes"):
        paired_bootstrap(a, b[:-1])


def test_relative_saving_ci():
    base = np.full(30, 10.0)
    r = relative_saving_ci(base, np.full(30, 8.0), n_resamples=200)
    assert (r.estimate, r.low, r.high) == pytest.approx((0.2, 0.2, 0.2))
    rng = np.random.default_rng(6)
    base = rng.uniform(50, 100, size=100)
    gated = base * rng.uniform(0.7, 1.0, size=100)
    r = relative_saving_ci(base, gated, n_resamples=1000)
    assert r.estimate == pytest.approx(1 - gated.sum() / base.sum())
    assert r.low < r.estimate < r.high
    # The column-wise fast path equals the generic batched statistic on the same resamples.
    generic = bootstrap_ci(
        np.stack([base, gated], axis=1),
        lambda z: 1 - z[..., 1].sum(-1) / z[..., 0].sum(-1),
        n_resamples=1000,
        batched=True,
    )
    assert tuple(r) == pytest.approx(tuple(generic), abs=1e-12)
    with pytest.raises(SrolloutError, match="sum to 0"):
        relative_saving_ci([0.0, 0.0], [1.0, 1.0])


def test_mcnemar_hand_worked_and_scipy():
    a = np.array([0, 0, 0, 0, 0, 1, 1, 0], dtype=bool)
    b = np.array([1, 1, 1, 1, 1, 1, 1, 0], dtype=bool)
    r = mcnemar(a, b)
    # 5 discordant pairs all favour b: p = 2 * 0.5**5 = 0.0625.
    assert (r.b01, r.b10, r.statistic) == (5, 0, 0.0)
    assert r.p_value == pytest.approx(0.0625)
    assert mcnemar(a, a).p_value == 1.0
    rng = np.random.default_rng(8)
    for _ in range(20):
        x, y = rng.random(50) < 0.5, rng.random(50) < 0.6
        r = mcnemar(x, y)
        want = scipy.stats.binomtest(r.b01, r.b01 + r.b10, 0.5).pvalue if r.b01 + r.b10 else 1.0
        assert r.p_value == pytest.approx(want, rel=1e-9)


def test_run_pair_saving_ci_hand_worked():
    # l = (ln 0.8, ln 0.9); s = (ln 0.9 - ln 0.8) / sqrt 2 = 0.083286; t_1 = 12.7062;
    # half = 12.7062 * 0.083286 / sqrt 2 = 0.748285; R = 17 / 20 = 0.85
    r = run_pair_saving_ci([10, 10], [8, 9])
    assert r.estimate == pytest.approx(0.15)
    assert r.low == pytest.approx(1 - 0.85 * math.exp(0.748285), abs=1e-5)  # -0.7964
    assert r.high == pytest.approx(1 - 0.85 * math.exp(-0.748285), abs=1e-5)  # 0.5978
    assert r.n_pairs == 2
    # identical ratios in every pair: no spread, the interval collapses on the estimate
    same = run_pair_saving_ci([10, 20, 30], [9, 18, 27])
    assert (same.estimate, same.low, same.high) == pytest.approx((0.1, 0.1, 0.1))
    # one pair: a point estimate, no interval
    one = run_pair_saving_ci([10], [8])
    assert one.estimate == pytest.approx(0.2) and math.isnan(one.low) and math.isnan(one.high)
    with pytest.raises(SrolloutError, match="positive"):
        run_pair_saving_ci([10, 0], [8, 9])
    with pytest.raises(SrolloutError, match="positive"):
        run_pair_saving_ci([10, 10], [-1, 9])
    # an arm run that skipped its whole block costs 0 s: 1 - 9 / 20, no log-ratio, no interval
    skipped = run_pair_saving_ci([10, 10], [0, 9])
    assert skipped.estimate == pytest.approx(0.55) and math.isnan(skipped.low)
    assert math.isnan(skipped.high) and skipped.n_pairs == 2
    with pytest.raises(SrolloutError, match="different lengths"):
        run_pair_saving_ci([10, 10], [8])


def test_run_pair_interval_covers_zero_in_aa_runs_where_the_task_bootstrap_does_not():
    # An A/A test: 4 timed-run pairs, the same 6 tasks' work, and each run slowed or sped up as
    # a whole by drift (the factors below). The per-task bootstrap sees 24 tight task pairs and
    # calls the drift a saving; the run-pair interval does not.
    # arm/baseline per pair: 0.97, 0.952, 1.01, 0.952 (a 2.9 % 'saving' from noise alone)
    drift = np.array([1.00, 0.97, 1.05, 1.00, 1.00, 1.01, 1.04, 0.99])  # baseline, arm per pair
    tasks = np.array([5.0, 7.0, 6.0, 8.0, 5.5, 6.5])
    base_tasks = np.concatenate([tasks * drift[2 * p] for p in range(4)])
    arm_tasks = np.concatenate([tasks * drift[2 * p + 1] for p in range(4)])
    naive = relative_saving_ci(base_tasks, arm_tasks, n_resamples=2000)
    assert naive.low > 0 or naive.high < 0  # spuriously "significant"
    runs = run_pair_saving_ci(
        [base_tasks[6 * p : 6 * p + 6].sum() for p in range(4)],
        [arm_tasks[6 * p : 6 * p + 6].sum() for p in range(4)],
    )
    assert runs.estimate == pytest.approx(naive.estimate)
    assert runs.low < 0 < runs.high


def test_bootstrap_ci_is_scipys_percentile_bootstrap():
    # the same resamples as scipy.stats.bootstrap with the same Generator: the same interval
    x = np.random.default_rng(7).exponential(size=300)
    ours = bootstrap_ci(x, n_resamples=3000, seed=4)
    theirs = scipy.stats.bootstrap(
        (x,),
        np.mean,
        n_resamples=3000,
        method="percentile",
        vectorized=True,
        rng=np.random.Generator(np.random.PCG64(4)),
    ).confidence_interval
    assert (ours.low, ours.high) == pytest.approx((theirs.low, theirs.high), abs=1e-12)


def test_relative_saving_ci_is_scipys_paired_bootstrap():
    rng = np.random.default_rng(8)
    base = rng.uniform(50, 100, size=200)
    gated = base * rng.uniform(0.6, 1.0, size=200)
    ours = relative_saving_ci(base, gated, n_resamples=2000, seed=3)
    theirs = scipy.stats.bootstrap(
        (base, gated),
        lambda b, g, axis=-1: 1 - g.sum(axis) / b.sum(axis),
        paired=True,
        n_resamples=2000,
        method="percentile",
        vectorized=True,
        rng=np.random.Generator(np.random.PCG64(3)),
    ).confidence_interval
    assert (ours.low, ours.high) == pytest.approx((theirs.low, theirs.high), abs=1e-12)


def test_bootstrap_sums_draw_the_row_bootstraps_law():
    # N = 200 binary rows, 60 ones: a resample's sum is Binomial(200, 0.3) — mean 60, sd sqrt(42)
    x = np.r_[np.ones(60), np.zeros(140)]
    sums = bootstrap_sums(x, n_resamples=40_000, seed=1)
    assert sums.n == 200 and sums.total.tolist() == [60.0]
    s = sums.resampled[:, 0]
    assert s.mean() == pytest.approx(60, abs=0.1) and s.std() == pytest.approx(
        np.sqrt(42), rel=0.02
    )
    law = scipy.stats.binom(200, 0.3)
    for q in (0.025, 0.5, 0.975):
        assert np.quantile(s, q) == pytest.approx(law.ppf(q), abs=1)
    # the mean's interval: the row bootstrap's within Monte Carlo noise, and scipy's
    mean_ci = bootstrap_sums_ci(x, lambda t, n: t[..., 0] / n, n_resamples=20_000)
    rows = bootstrap_ci(x, n_resamples=20_000)
    assert mean_ci.estimate == rows.estimate == 0.3
    assert (mean_ci.low, mean_ci.high) == pytest.approx((rows.low, rows.high), abs=0.006)


def test_bootstrap_sums_ratio_matches_the_row_bootstrap():
    # precision-like ratio of sums over rows with a few distinct values (as the sweep's TP/cut rows)
    rng = np.random.default_rng(2)
    cut = rng.random(500) < 0.3
    tp = cut & (rng.random(500) < 0.8)
    data = np.column_stack([tp, cut]).astype(float)
    by_counts = bootstrap_sums_ci(
        data, lambda t, n: t[..., 0] / t[..., 1], n_resamples=20_000, seed=5
    )
    by_rows = bootstrap_ci(
        data,
        lambda z: z[..., 0].sum(-1) / z[..., 1].sum(-1),
        n_resamples=20_000,
        seed=5,
        batched=True,
    )
    assert by_counts.estimate == pytest.approx(tp.sum() / cut.sum())
    assert (by_counts.low, by_counts.high) == pytest.approx((by_rows.low, by_rows.high), abs=0.006)
    same = bootstrap_sums_ci(data, lambda t, n: t[..., 0] / t[..., 1], n_resamples=500, seed=5)
    assert same == bootstrap_sums_ci(
        data, lambda t, n: t[..., 0] / t[..., 1], n_resamples=500, seed=5
    )
    with pytest.raises(SrolloutError, match="n_resamples"):
        bootstrap_sums(data, n_resamples=0)


@pytest.mark.filterwarnings("ignore::scipy.stats.ConstantInputWarning")
@settings(max_examples=60, deadline=None)
@given(st.integers(3, 80), st.integers(0, 2**31 - 1), st.booleans())
def test_rank_stats_is_spearmanr_and_mannwhitneyu(n, seed, with_nan):
    rng = np.random.default_rng(seed)
    x = np.round(rng.random(n), 1)  # ties
    y = np.round(rng.random(n) * 0.25, 2)
    pos = rng.random(n) < 0.5
    if with_nan:
        x[rng.random(n) < 0.2] = np.nan
    got = rank_stats(x, y, pos)
    keep = ~np.isnan(x)
    assert got.n == int(keep.sum())
    xk, yk, pk = x[keep], y[keep], pos[keep]
    want = scipy.stats.spearmanr(xk, yk) if got.n >= 3 else None
    if want is None or np.isnan(want.statistic):
        assert math.isnan(got.rho) and math.isnan(got.p_value)
    else:
        assert got.rho == pytest.approx(want.statistic, abs=1e-12)
        if abs(got.rho) == 1.0:
            # ranks in the same (or opposite) order: rho is exactly ±1 and p exactly 0; scipy's
            # rho may round to 1 - 1e-13, whose p is then tiny but not 0 (hypothesis found one)
            assert got.p_value == 0.0 and want.pvalue < 1e-15
        else:
            assert got.p_value == pytest.approx(want.pvalue, rel=1e-9, abs=1e-300)
    if pk.any() and (~pk).any():
        u = scipy.stats.mannwhitneyu(xk[pk], xk[~pk]).statistic
        assert got.auroc == pytest.approx(u / (pk.sum() * (~pk).sum()), abs=1e-12)
    else:
        assert math.isnan(got.auroc)
    if not with_nan:  # ranks of the target handed in give the same result
        assert rank_stats(x, y, pos, target_ranks=rankdata(y)) == got


def test_rank_stats_edge_cases():
    assert rank_stats([1, 2, 3, 4], [2, 4, 6, 8], [0, 0, 1, 1]) == (4, 1.0, 0.0, 1.0)
    flat = rank_stats([1, 1, 1], [1, 2, 3], [0, 1, 1])
    assert math.isnan(flat.rho) and flat.auroc == 0.5
    assert rank_stats([np.nan, np.nan], [1, 2], [0, 1]).n == 0
    with pytest.raises(SrolloutError, match="different lengths"):
        rank_stats([1, 2], [1, 2, 3], [0, 1])


def test_spearman_p_value_elementwise():
    rng = np.random.default_rng(9)
    x, y = rng.random(50), rng.random(50)
    ref = scipy.stats.spearmanr(x, y)
    rho = np.array([0.5, ref.statistic, 1.0, np.nan, 0.3])
    n = np.array([3, 50, 10, 10, 2])
    p = spearman_p_value(rho, n)
    assert p[0] == pytest.approx(2 / 3)  # the hand-worked t(1) case above
    assert p[1] == pytest.approx(ref.pvalue, rel=1e-9)
    assert p[2] == 0.0 and math.isnan(p[3]) and math.isnan(p[4])
