"""Unit tests of srollout.core.sweep: the paper's table, a hand-counted toy, grid vs naive."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from srollout.core.sweep import (
    GateOutcome,
    choose_operating_point,
    evaluate_cuts,
    evaluate_grid,
    oracle_cuts,
    precision_floor_for,
    random_cut_baseline,
    random_cut_expectation,
    threshold_cuts,
    useful_groups_lost,
)
from srollout.errors import SrolloutError


def _paper_buffer(n_cut: int, tp: int):
    """N = 100 groups, 39 zero-variance (the paper's buffer); a gate with n_cut cuts, tp of them
    TP."""
    zero_var = np.zeros(100, dtype=bool)
    zero_var[:39] = True
    cut = np.zeros(100, dtype=bool)
    cut[:tp] = True  # TPs among the zero-variance groups
    cut[39 : 39 + n_cut - tp] = True  # FPs among the mixed ones
    return cut, zero_var


def test_paper_table_row_d_l_012():
    # d_L = 0.12 at K = 10, T_max = 30: cut 21, TP 17 -> safe 17*20/3000 = 11.33 %, raw 14.0 %.
    cut, zv = _paper_buffer(21, 17)
    o = evaluate_cuts(cut, zv, K=10, T_max=30)
    assert (o.n_cut, o.tp, o.fp) == (21, 17, 4)
    assert o.precision == pytest.approx(17 / 21)  # 0.81
    assert o.recall == pytest.approx(17 / 39)  # 0.44
    assert o.safe_savings == pytest.approx(0.11333, abs=1e-5)
    assert o.raw_savings == pytest.approx(0.14)
    assert math.isnan(o.measured_step_savings) and math.isnan(o.adv_l2_kept)


def test_ten_group_toy_by_hand():
    # T_max = 30, K = 10, G = 2. zero-variance: g0, g1, g2, g7. Cut: g0, g1 (TP), g3 (FP).
    # precision 2/3, recall 2/4; safe = 2*20/(10*30) = 0.1333; raw = 3*20/300 = 0.2.
    # Steps after K that really happened: g0 40 (both ran to 30), g1 6 (both ended at 13), g3 20.
    # Total real steps 60+26+20+50+6*60 = 516 -> measured = (40+6+20)/516 = 0.1279.
    # Advantages: zero-variance groups [0,0]; the 6 mixed groups [1,-1] (||A||^2 = 2 each);
    # cutting g3 keeps sqrt(10/12) = 0.9129 of the L2 norm.
    zv = np.array([1, 1, 1, 0, 0, 0, 0, 1, 0, 0], dtype=bool)
    cut = np.array([1, 1, 0, 1, 0, 0, 0, 0, 0, 0], dtype=bool)
    remaining = np.array([40, 6, 0, 20, 30, 30, 30, 0, 30, 30])
    total = np.array([60, 26, 20, 50, 60, 60, 60, 60, 60, 60])
    advs = [np.zeros(2) if z else np.array([1.0, -1.0]) for z in zv]
    o = evaluate_cuts(cut, zv, 10, 30, remaining, total, advs)
    want = (3, 2, 1, 2 / 3, 0.5, 40 / 300, 0.2, 66 / 516, math.sqrt(10 / 12))
    assert tuple(o) == pytest.approx(want)
    assert isinstance(o.n_cut, int) and isinstance(o.tp, int)


def test_oracle_and_never():
    cut, zv = _paper_buffer(21, 17)
    o = evaluate_cuts(oracle_cuts(zv), zv, 10, 30)
    assert (o.precision, o.recall) == (1.0, 1.0)
    assert o.safe_savings == o.raw_savings == pytest.approx(39 * 20 / 3000)
    never = evaluate_cuts(np.zeros(100, bool), zv, 10, 30, advantages=[np.ones(2)] * 100)
    assert never.n_cut == 0 and math.isnan(never.precision) and never.raw_savings == 0.0
    assert never.adv_l2_kept == 1.0


def _naive(cut, zv, K, T, rem, tot, advs):
    N = len(zv)
    n_cut = sum(cut)
    tp = sum(1 for c, z in zip(cut, zv, strict=False) if c and z)
    prec = tp / n_cut if n_cut else math.nan
    rec = tp / sum(zv) if sum(zv) else math.nan
    meas = sum(r for c, r in zip(cut, rem, strict=False) if c) / sum(tot) if sum(tot) else math.nan
    full = sum(float(np.sum(np.square(a))) for a in advs)
    kept = sum(float(np.sum(np.square(a))) for c, a in zip(cut, advs, strict=False) if not c)
    l2 = math.sqrt(kept / full) if full else math.nan
    per = (T - K) / (N * T)
    return (n_cut, tp, n_cut - tp, prec, rec, tp * per, n_cut * per, meas, l2)


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 30), st.integers(1, 5), st.integers(0, 2**31 - 1))
def test_grid_matches_naive(N, M, seed):
    rng = np.random.default_rng(seed)
    zv = rng.random(N) < 0.4
    cuts = rng.random((M, N)) < 0.3
    tot = rng.integers(0, 60, N)
    rem = np.minimum(tot, rng.integers(0, 40, N))
    advs = [rng.normal(size=3) * (not z) for z in zv]
    grid = evaluate_grid(cuts, zv, 10, 30, rem, tot, advs)
    for m in range(M):
        got = grid.row(m)
        want = _naive(cuts[m].tolist(), zv.tolist(), 10, 30, rem.tolist(), tot.tolist(), advs)
        for g, w in zip(got, want, strict=False):
            assert (math.isnan(g) and math.isnan(w)) or g == pytest.approx(w, abs=1e-12)


def test_threshold_cuts_r1_and_r3():
    d = np.array([0.0, 0.1, 0.2, np.nan])
    tau = np.array([0.0, 0.5, 1.0, 1.0])
    r1 = threshold_cuts(d, [0.05, 0.15])
    assert r1.tolist() == [[True, False, False, False], [True, True, False, False]]
    r3 = threshold_cuts(d, [0.05, 0.15], tau, [0.9, 0.4])
    # rows: (0.05, 0.9), (0.05, 0.4), (0.15, 0.9), (0.15, 0.4)
    assert r3.tolist() == [
        [True, False, True, True],
        [True, True, True, True],
        [True, True, True, True],
        [True, True, True, True],
    ]
    with pytest.raises(SrolloutError, match="both tau_K and t_high_values"):
        threshold_cuts(d, [0.1], tau)


def test_random_cut_baseline():
    _, zv = _paper_buffer(21, 17)
    r = random_cut_baseline(20, zv, 10, 30, n_draws=4000, seed=0)
    assert r.n_cut == 20
    assert r.tp == pytest.approx(20 * 0.39, abs=0.1)  # hypergeometric mean 7.8
    assert r.precision == pytest.approx(0.39, abs=0.01)
    assert r.raw_savings == pytest.approx(20 * 20 / 3000)
    again = [random_cut_baseline(20, zv, 10, 30, n_draws=50, seed=1)[:7] for _ in range(2)]
    assert again[0] == again[1]
    everything = random_cut_baseline(100, zv, 10, 30, n_draws=3)
    assert everything.tp == 39 and everything.precision == pytest.approx(0.39)
    with pytest.raises(SrolloutError, match="n_cut"):
        random_cut_baseline(101, zv, 10, 30)


PAPER_TABLE = [  # d_L, cut, TP (paper Table "ablation", K = 10)
    (0.05, 9, 9),
    (0.08, 14, 13),
    (0.10, 20, 16),
    (0.12, 21, 17),
    (0.14, 24, 18),
    (0.18, 25, 19),
]


def _paper_rows():
    rows = []
    for d_l, n_cut, tp in PAPER_TABLE:
        o = evaluate_cuts(*_paper_buffer(n_cut, tp), K=10, T_max=30)
        rows.append({"d_L": d_l, **o._asdict()})
    return rows


def test_choose_operating_point_paper_table():
    rows = _paper_rows()
    assert [round(r["safe_savings"] * 100, 1) for r in rows] == [6.0, 8.7, 10.7, 11.3, 12.0, 12.7]
    assert [round(r["raw_savings"] * 100, 1) for r in rows] == [6.0, 9.3, 13.3, 14.0, 16.0, 16.7]
    assert rows[choose_operating_point(rows)]["d_L"] == 0.12  # the paper's choice at floor 0.80
    assert rows[choose_operating_point(rows, 0.9)]["d_L"] == 0.08
    assert rows[choose_operating_point(rows, 1.0)]["d_L"] == 0.05
    assert rows[choose_operating_point(rows, 0.0)]["d_L"] == 0.18
    # 16/20 = 0.80 sits exactly on the floor and counts.
    assert choose_operating_point([rows[2]], 0.80) == 0


def test_choose_operating_point_ties_and_none():
    rows = [
        {"d_L": 0.2, "precision": 0.9, "safe_savings": 0.1},
        {"d_L": 0.1, "precision": 0.9, "safe_savings": 0.1},
        {"d_L": 0.05, "precision": 0.95, "safe_savings": 0.1},
        {"d_L": 0.01, "precision": float("nan"), "safe_savings": 0.0},
    ]
    assert choose_operating_point(rows) == 2  # higher precision wins the tie
    assert choose_operating_point(rows[:2]) == 1  # then smaller d_L
    assert choose_operating_point(rows[3:]) is None  # nothing cut never qualifies
    assert (
        choose_operating_point([GateOutcome(1, 1, 0, 1.0, 1.0, 0.1, 0.1, 0.0, 1.0)]) == 0
    )  # objects
    with pytest.raises(SrolloutError, match="lacks precision"):
        choose_operating_point([{"d_L": 0.1}])


def test_precision_floor_appendix_numbers():
    # App. "Setting the precision floor": 21 * 0.19 / 61 = 6.5 %; 1 - 0.10 * 61 / 21 = 0.71.
    assert useful_groups_lost(0.81, 21, 61) == pytest.approx(0.0654, abs=1e-4)
    assert precision_floor_for(0.10, 61, 21) == pytest.approx(0.7095, abs=1e-4)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"K": 31}, "beyond the horizon"),
        ({"K": 0}, "K must be an integer"),
        ({"remaining_steps": [0] * 4}, "both remaining_steps and total_steps"),
        ({"remaining_steps": [5, 0, 0, 0], "total_steps": [1, 1, 1, 1]}, "between 0"),
        ({"cut": [True, False]}, "one entry per group|expected one per group|shape"),
        ({"advantages": [np.zeros(2)]}, "advantages has 1 groups"),
    ],
)
def test_bad_inputs(kwargs, match):
    args = {
        "cut": [True, False, False, True],
        "zero_var": [True, True, False, False],
        "K": 10,
        "T_max": 30,
    }
    args.update(kwargs)
    with pytest.raises(SrolloutError, match=match):
        evaluate_cuts(**args)


def test_random_cut_expectation_by_hand():
    # 4 groups, 2 zero-variance; cut 2 at random: E[TP] = 2·2/4 = 1, precision 1/2, recall 2/4;
    # every group is cut with probability 1/2: measured = (0+16+8+13)/2 / 97.
    zv = np.array([True, False, True, False])
    rem, tot = np.array([0, 16, 8, 13]), np.array([12, 32, 24, 29])
    r = random_cut_expectation(2, zv, 4, 10, rem, tot)
    assert (r.n_cut, r.tp, r.fp, r.precision, r.recall) == (2, 1.0, 1.0, 0.5, 0.5)
    assert r.safe_savings == pytest.approx(1 * 6 / 40) and r.raw_savings == pytest.approx(
        2 * 6 / 40
    )
    assert r.measured_step_savings == pytest.approx(18.5 / 97)
    nothing = random_cut_expectation(0, zv, 4, 10)
    assert math.isnan(nothing.precision) and nothing.tp == 0.0
    # one group kept out of N (or one cut): the L2 share is an exact mean over the N choices
    advs = [
        np.zeros(2),
        np.array([1.0, -1.0]),
        np.zeros(2),
        np.array([2.0, -2.0]),
    ]  # ||A||² 0, 2, 0, 8
    assert random_cut_expectation(3, zv, 4, 10, advantages=advs).adv_l2_kept == pytest.approx(
        (0 + np.sqrt(0.2) + 0 + np.sqrt(0.8)) / 4
    )
    assert random_cut_expectation(1, zv, 4, 10, advantages=advs).adv_l2_kept == pytest.approx(
        (1 + np.sqrt(0.8) + 1 + np.sqrt(0.2)) / 4
    )
    with pytest.raises(SrolloutError, match="n_cut"):
        random_cut_expectation(5, zv, 4, 10)


@pytest.mark.parametrize("n_cut", [1, 7, 20, 50, 90])
def test_random_cut_expectation_matches_a_large_simulation(n_cut):
    # the paper's buffer (N = 100, 39 zero-variance) with real-looking step counts and advantages
    rng = np.random.default_rng(11)
    _, zv = _paper_buffer(21, 17)
    tot = rng.integers(40, 240, 100).astype(float)
    rem = np.floor(tot * rng.random(100))
    advs = [np.zeros(8) if z else (r := (rng.random(8) < 0.5).astype(float)) - r.mean() for z in zv]
    exact = random_cut_expectation(n_cut, zv, 10, 30, rem, tot, advs)
    sim = random_cut_baseline(n_cut, zv, 10, 30, rem, tot, advs, n_draws=100_000, seed=3)
    assert exact.n_cut == sim.n_cut
    # linear fields: Monte Carlo error of 100,000 draws (the TP count's sd is at most ~2.5)
    assert exact.tp == pytest.approx(sim.tp, abs=0.05)
    assert exact.precision == pytest.approx(sim.precision, abs=0.005)
    assert exact.recall == pytest.approx(sim.recall, abs=0.005)
    assert exact.safe_savings == pytest.approx(sim.safe_savings, abs=5e-4)
    assert exact.raw_savings == pytest.approx(sim.raw_savings, abs=1e-12)
    assert exact.measured_step_savings == pytest.approx(sim.measured_step_savings, abs=5e-4)
    # the L2 share, a square root, by its second-order expansion
    assert exact.adv_l2_kept == pytest.approx(sim.adv_l2_kept, abs=2e-3)
