"""The audited gate's statistics and threshold control (srollout.core.audit), numbers by hand."""

from __future__ import annotations

import math

import numpy as np
import pytest

from srollout.core.audit import (
    AuditLedger,
    Labelled,
    audit_pick,
    certifiable_n,
    check_audit_options,
    clopper_pearson_lower,
    clopper_pearson_upper,
    next_threshold,
)
from srollout.errors import SrolloutError


def test_clopper_pearson_lower_by_hand():
    # all n right: the bound solves p^n = 1 - confidence
    assert clopper_pearson_lower(20, 20) == pytest.approx(0.05 ** (1 / 20), abs=1e-12)  # 0.8609
    assert clopper_pearson_lower(19, 19) == pytest.approx(0.854, abs=1e-3)
    assert clopper_pearson_lower(10, 10, 0.90) == pytest.approx(0.1 ** (1 / 10), abs=1e-12)
    # 9 of 10: the tabulated one-sided 95 % exact bound
    assert clopper_pearson_lower(9, 10) == pytest.approx(0.6058, abs=1e-4)
    # 1 of 1: p >= 0.05
    assert clopper_pearson_lower(1, 1) == pytest.approx(0.05, abs=1e-12)
    assert clopper_pearson_lower(0, 7) == 0.0
    assert math.isnan(clopper_pearson_lower(0, 0))
    with pytest.raises(ValueError):
        clopper_pearson_lower(3, 2)


def test_certifiable_n_is_the_first_n_whose_all_right_bound_clears_the_floor():
    assert certifiable_n(0.85) == 19  # 0.05^(1/19) = 0.854; 0.05^(1/18) = 0.847
    assert certifiable_n(0.90) == 29
    assert certifiable_n(0.5) == 5  # 0.05^(1/5) = 0.549; 0.05^(1/4) = 0.473
    for floor in (0.5, 0.85, 0.9):
        n = certifiable_n(floor)
        assert clopper_pearson_lower(n, n) >= floor > clopper_pearson_lower(n - 1, n - 1)


def test_audit_pick_is_seeded_and_takes_its_fraction():
    picks = [audit_pick(7, i, 0.25) for i in range(4000)]
    assert picks == [audit_pick(7, i, 0.25) for i in range(4000)]  # the same groups on a rerun
    assert sum(picks) / 4000 == pytest.approx(0.25, abs=0.02)
    assert picks != [audit_pick(8, i, 0.25) for i in range(4000)]
    assert all(audit_pick(7, i, 1.0) for i in range(50))
    assert not any(audit_pick(7, i, 0.0) for i in range(50))


@pytest.mark.parametrize(
    ("fraction", "floor", "message"),
    [
        (1.5, 0.85, "audit must be a fraction in [0, 1], got 1.5"),
        (-0.1, 0.85, "audit must be a fraction in [0, 1], got -0.1"),
        (float("nan"), 0.85, "audit must be a fraction in [0, 1], got nan"),
        (0.5, 1.0, "audit_floor must lie in (0, 1), got 1.0"),
        (0.5, 0.0, "audit_floor must lie in (0, 1), got 0.0"),
        (0.5, float("nan"), "audit_floor must lie in (0, 1), got nan"),
    ],
)
def test_bad_audit_options_are_one_line(fraction, floor, message):
    # the core names its arguments; the CLI shows the same line with the flags (test_cli_audit)
    from srollout.cli.app import cli_line

    with pytest.raises(SrolloutError) as err:
        check_audit_options(fraction, floor)
    assert str(err.value) == message
    flags = message.replace("audit_floor", "--audit-floor").replace("audit must", "--audit must")
    assert cli_line(err.value) == flags


def _audit(scores, oks, it=1):
    return [Labelled(it, s, ok, "audit") for s, ok in zip(scores, oks, strict=True)]


def _through(scores, zvs, it=1):
    return [Labelled(it, s, zv, "through") for s, zv in zip(scores, zvs, strict=True)]


def test_too_few_audited_cuts_hold_the_threshold():
    step = next_threshold(0.12, _audit([0.01, 0.05, 0.10], [True, True, False]))
    assert step.threshold == 0.12 and step.move == "hold" and step.n_audited == 3
    assert step.precision_lb == pytest.approx(clopper_pearson_lower(2, 3))


def test_clopper_pearson_upper_by_hand():
    # no failure: 1; all n wrong: the bound solves (1 - p)^n = 1 - confidence
    assert clopper_pearson_upper(6, 6) == 1.0
    assert clopper_pearson_upper(0, 5) == pytest.approx(1 - 0.05 ** (1 / 5), abs=1e-12)  # 0.451
    # 3 of 6: the p with P(X <= 3 | 6, p) = 0.05, by the binomial sum itself
    p = clopper_pearson_upper(3, 6)
    assert sum(math.comb(6, i) * p**i * (1 - p) ** (6 - i) for i in range(4)) == pytest.approx(0.05)
    assert p == pytest.approx(0.8468, abs=1e-4)
    assert clopper_pearson_upper(9, 10) == pytest.approx(1 - clopper_pearson_lower(1, 10))
    assert math.isnan(clopper_pearson_upper(0, 0))


def test_few_audits_that_refute_the_floor_tighten_before_the_bound_can_certify():
    # 6 audited cuts, 3 wrong: upper bound 0.847 < 0.85, so the floor is refuted on 6 audits.
    # Prefixes by d_K: 1/1 (upper 1), 2/2 (1), 2/3 (0.98), 3/4 (0.99), 3/5 (0.97), 3/6 (0.847):
    # the largest unrefuted prefix ends at 0.08, so θ goes between 0.08 and 0.11
    scores = [0.01, 0.02, 0.05, 0.06, 0.08, 0.11]
    step = next_threshold(0.12, _audit(scores, [True, True, False, True, False, False]))
    assert step.move == "refute" and step.n_audited == 6
    assert step.threshold == pytest.approx(0.095)
    # 0 of 5 right: 0 of 1 has upper bound 0.95 (unrefuted), 0 of 2 has 1 - 0.05^(1/2) = 0.776
    # (refuted), and so on: θ keeps the most alike cut only, between 0.01 and 0.03
    step = next_threshold(0.12, _audit([0.01, 0.03, 0.05, 0.07, 0.09], [False] * 5))
    assert step.move == "refute" and step.threshold == pytest.approx(0.02)


def test_a_bound_below_the_floor_tightens_to_the_largest_certified_prefix():
    # 30 audited cuts at d_K = 0.00 .. 0.29 under θ = 0.3; the 22 most alike were right:
    # bound 22/30 < 0.85; the prefix of 22 (all right) has 0.05^(1/22) = 0.873 >= 0.85, the
    # prefix of 23 (22 right) 0.810: θ goes between the 22nd and 23rd d_K
    scores = [i / 100 for i in range(30)]
    step = next_threshold(0.3, _audit(scores, [i < 22 for i in range(30)]))
    assert step.move == "tighten" and step.n_audited == 30
    assert step.threshold == pytest.approx(0.215)
    assert step.precision_lb == pytest.approx(clopper_pearson_lower(22, 30))


def test_with_no_certified_prefix_the_gate_cuts_below_every_audited_cut():
    scores = [0.02 + i / 100 for i in range(20)]
    step = next_threshold(0.3, _audit(scores, [i % 2 == 0 for i in range(20)]))
    assert step.move == "tighten" and step.threshold == pytest.approx(0.02)


def test_a_cleared_bound_loosens_over_the_groups_let_through():
    # 19 right cuts below θ = 0.1 (bound 0.854 >= 0.85); let through, d_K 0.10 .. 0.39: the 22
    # most alike were zero-variance, so the band's bound clears the floor up to 0.31
    cuts = _audit([i / 200 for i in range(19)], [True] * 19)
    band = _through([i / 100 for i in range(10, 40)], [i < 32 for i in range(10, 40)])
    step = next_threshold(0.1, cuts + band)
    assert step.move == "loosen" and step.threshold == pytest.approx(0.315)
    # a band whose bound does not clear: θ stays
    mixed = _through([i / 100 for i in range(10, 40)], [i % 3 > 0 for i in range(10, 40)])
    assert next_threshold(0.1, cuts + mixed).move == "keep"
    assert next_threshold(0.1, cuts + mixed).threshold == 0.1


def test_equal_d_k_values_fall_on_one_side_of_the_threshold():
    # 19 right cuts at d_K = 0, then 3 wrong ones also at d_K = 0 .. no θ can split them
    step = next_threshold(0.2, _audit([0.0] * 22, [True] * 19 + [False] * 3))
    assert step.move == "tighten" and step.threshold == 0.0  # cuts nothing (d_K < 0 never)


def test_ledger_window_truncate_and_json_round_trip():
    ledger = AuditLedger(window=2)
    for it in (1, 2, 3):
        ledger.add(_audit([0.01 * it], [True], it))
        ledger.add(_through([0.5], [False], it))
        ledger.thresholds[it] = 0.1 * it
    ledger.add(_through([0.6], [True], 4))  # an iteration without an audit
    # the window starts at the iteration of the 2nd latest audited cut: 2
    assert [r.iteration for r in ledger.recent(4)] == [2, 2, 3, 3, 4]
    assert [r.iteration for r in ledger.recent(2)] == [1, 1, 2, 2]
    assert [r.iteration for r in AuditLedger(window=9, rows=ledger.rows).recent(4)] == [
        1,
        1,
        2,
        2,
        3,
        3,
        4,
    ]  # fewer audits than the window: everything
    again = AuditLedger.from_dict(ledger.to_dict())
    assert again == ledger
    again.truncate(2)
    assert [r.iteration for r in again.rows] == [1, 1, 2, 2]
    assert sorted(again.thresholds) == [1, 2]


def _drifting_run(audited: bool, seed: int, iters: int = 60, n: int = 40, start: float = 0.2):
    """A synthetic policy whose d_K-to-outcome relation drifts: for 20 iterations a group with
    d_K < 0.2 ends zero-variance 97 % of the time; after it only those with d_K < 0.08 do, those
    in [0.08, 0.2) 40 %. Returns (cuts, right cuts) over iterations 36..60, the last θ and the
    first iteration that cut."""
    rng = np.random.default_rng(seed)
    ledger, theta, cuts, right, opened = AuditLedger(), start, 0, 0, None
    for it in range(1, iters + 1):
        d = rng.uniform(0.0, 0.5, n)
        p = np.where(d < 0.2, 0.97, 0.1)
        if it > 20:
            p = np.where(d < 0.08, 0.97, np.where(d < 0.2, 0.4, 0.1))
        zero_var, cut = rng.random(n) < p, d < theta
        opened = it if opened is None and cut.any() else opened
        if it > 35:
            cuts, right = cuts + int(cut.sum()), right + int((cut & zero_var).sum())
        if audited:
            rows = []
            for g in range(n):
                if not cut[g]:
                    rows.append(Labelled(it, float(d[g]), bool(zero_var[g]), "through"))
                elif audit_pick(seed, it * n + g, 0.5):
                    rows.append(Labelled(it, float(d[g]), bool(zero_var[g]), "audit"))
            ledger.add(rows)
            theta = next_threshold(theta, ledger.recent(it), floor=0.85).threshold
    return cuts, right, theta, opened


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_audited_gate_holds_its_floor_where_a_fixed_threshold_falls_below_it(seed):
    cuts, right, _, _ = _drifting_run(False, seed)
    assert right / cuts < 0.70  # the fixed θ = 0.2: about (0.08 * 0.97 + 0.12 * 0.4) / 0.2 = 0.63
    cuts, right, theta, _ = _drifting_run(True, seed)
    assert cuts >= 10  # it still cuts, and what it cuts clears the floor
    assert right / cuts >= 0.85
    assert theta < 0.12


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_closed_start_cuts_nothing_until_the_groups_let_through_certify_a_band(seed):
    # d_L 0 cuts nothing; an iteration's 40 groups, all let through, carry ~16 with d_K < 0.2
    # (zero-variance at 0.97), too few for a band of 19 whose bound clears 0.85; two iterations'
    # ~32 are enough: the gate opens at iteration 3
    cuts, right, theta, opened = _drifting_run(True, seed, start=0.0)
    assert opened == 3
    assert cuts >= 10 and right / cuts >= 0.85  # after the drift it still holds the floor
    assert theta < 0.12


def test_best_band_is_the_prefix_of_groups_let_through_with_the_highest_bound():
    from srollout.core.audit import best_band

    rows = _through([0.1, 0.2, 0.3, 0.4, 0.5, 0.6], [True, True, False, True, True, True])
    rows += _audit([0.25], [False])  # an audited cut is no part of the band
    band = best_band(0.15, rows, min_n=3)  # from 0.2 on: T F T T T
    # prefixes of 3, 4, 5 hold 2, 3, 4 zero-variance; the bound grows with each: 4 of 5 is best
    assert (band.n, band.zero_var) == (5, 4)
    p = band.precision_lb  # P(X >= 4 | 5, p) = 5 p^4 (1 - p) + p^5 = 0.05
    assert 5 * p**4 - 4 * p**5 == pytest.approx(0.05, abs=1e-9) and p == pytest.approx(
        0.3426, abs=1e-4
    )
    assert best_band(0.45, rows, min_n=3) is None  # 2 let through at or above 0.45
