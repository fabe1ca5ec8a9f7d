"""srollout.core.learned_gate / adaptive_gate: the logistic fit, cross-fitting that never scores a
group with a model fit on it, thresholds under a precision floor, gate.json round trips, and the
adaptive gate's first-confident-step cut."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from srollout.core.adaptive_gate import (
    AdaptiveGate,
    choose_step_thresholds,
    evaluate_variable_cuts,
    fit_adaptive_gate,
)
from srollout.core.gate import GateRule, load_gate
from srollout.core.learned_gate import (
    FEATURE_NAMES,
    LearnedGate,
    LogisticModel,
    assign_folds,
    choose_threshold,
    cross_fit_proba,
    fit_learned_gate,
    fit_logistic,
    gate_selector,
    nested_heldout_cuts,
    row_table,
)
from srollout.core.signals import GroupSignals
from srollout.errors import SrolloutError


def _signals(d: float, tau: float = 0.0) -> GroupSignals:
    return GroupSignals(d, 0.0, 0.0, 0.0, 0.0, 0.0, tau)


def _toy(N: int = 40, seed: int = 0, Ks=(5, 10, 15)) -> tuple[dict[int, np.ndarray], np.ndarray]:
    """N groups; zero-variance ones have a small d_K (with overlap); column 0 is unused noise."""
    rng = np.random.default_rng(seed)
    zv = np.arange(N) % 2 == 0
    signals = {}
    for K in Ks:
        s = rng.random((N, 7)) * 0.2
        s[:, 0] = np.where(zv, rng.random(N) * 0.4, 0.2 + rng.random(N) * 0.6) * (10 / K)
        s[:, 6] = 0.0
        signals[K] = s
    return signals, zv


# --- the logistic fit ------------------------------------------------------------------------


def test_logistic_fit_matches_the_closed_form_of_a_binary_feature() -> None:
    # Unpenalised MLE with one 0/1 feature: sigmoid(b) = mean y at x=0, sigmoid(b+w) = at x=1.
    X = np.array([[0.0]] * 4 + [[1.0]] * 4)
    y = np.array([1, 0, 0, 0, 1, 1, 1, 0])
    fit = fit_logistic(X, y, l2=0.0)
    assert fit.converged
    assert fit.intercept == pytest.approx(math.log(1 / 3), abs=1e-9)  # logit(0.25)
    assert fit.coef[0] == pytest.approx(2 * math.log(3), abs=1e-9)  # logit(0.75) - logit(0.25)


def test_logistic_fit_matches_scipy_on_an_overlapping_toy_with_l2() -> None:
    from scipy.optimize import minimize

    rng = np.random.default_rng(1)
    X = rng.normal(size=(60, 3))
    y = (X @ [2.0, -1.0, 0.0] + rng.normal(size=60) > 0).astype(float)
    l2 = 0.7

    def loss(beta: np.ndarray) -> float:
        z = beta[0] + X @ beta[1:]
        return float(np.sum(np.logaddexp(0, z) - y * z) + 0.5 * l2 * beta[1:] @ beta[1:])

    ref = minimize(loss, np.zeros(4), method="BFGS", options={"gtol": 1e-10}).x
    fit = fit_logistic(X, y, l2=l2)
    assert fit.intercept == pytest.approx(ref[0], abs=1e-5)
    assert fit.coef == pytest.approx(ref[1:], abs=1e-5)


def test_logistic_fit_refuses_one_class_and_separable_data_stays_finite() -> None:
    with pytest.raises(SrolloutError, match="both zero-variance and non-zero-variance"):
        fit_logistic(np.zeros((3, 1)), np.ones(3))
    fit = fit_logistic(np.array([[-1.0], [1.0]]), np.array([0.0, 1.0]), l2=1.0)
    assert fit.converged and np.all(np.isfinite(fit.coef)) and fit.coef[0] > 0


def test_model_standardises_and_imputes_nan_with_the_training_mean() -> None:
    X = np.zeros((4, 8))
    X[:, 0] = [0.0, 0.0, 1.0, 1.0]
    X[:, 5] = np.nan  # obs_unique_ratio missing (signals without observations)
    model = LogisticModel.fit(X, np.array([1, 1, 0, 0]), l2=1.0)
    assert model.mean[0] == pytest.approx(0.5) and model.std[0] == pytest.approx(0.5)
    assert model.std[7] == 1.0  # constant feature: std 1, its coefficient 0
    p = model.proba(X)
    assert np.all(np.isfinite(p)) and p[0] > 0.5 > p[3]


# --- folds and cross-fitting -----------------------------------------------------------------


def test_folds_are_stratified_seeded_and_cover_every_group() -> None:
    zv = np.array([True] * 10 + [False] * 5)
    f = assign_folds(zv, 5, seed=3)
    assert np.array_equal(f, assign_folds(zv, 5, seed=3))
    assert sorted(np.bincount(f).tolist()) == [3, 3, 3, 3, 3]
    assert all(np.sum(zv[f == k]) == 2 for k in range(5))  # 10 zero-variance groups, 2 per fold


def test_cross_fitting_never_scores_a_group_with_a_model_fit_on_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    signals, zv = _toy(30)
    for (
        K
    ) in signals:  # column 1 = the group's index: lets the instrument see which groups a call got
        signals[K][:, 1] = np.arange(30)
    rows = row_table(signals, zv, (5, 10, 15))
    calls: list[tuple[str, set[int]]] = []
    real_fit, real_proba = LogisticModel.fit.__func__, LogisticModel.proba

    def fit(cls, X, y, l2=1.0, names=None):
        calls.append(("fit", set(np.asarray(X)[:, 1].astype(int).tolist())))
        return real_fit(cls, X, y, l2, names)

    def proba(self, X):
        calls.append(("score", set(np.atleast_2d(X)[:, 1].astype(int).tolist())))
        return real_proba(self, X)

    monkeypatch.setattr(LogisticModel, "fit", classmethod(fit))
    monkeypatch.setattr(LogisticModel, "proba", proba)
    folds = assign_folds(zv, 5, seed=0)
    cf = cross_fit_proba(rows, folds)
    assert [c[0] for c in calls] == ["fit", "score"] * 5
    scored: list[int] = []
    for (_, fitted), (_, scored_now) in zip(calls[::2], calls[1::2], strict=True):
        assert fitted.isdisjoint(scored_now)
        assert fitted | scored_now == set(range(30))
        scored += sorted(scored_now)
    assert sorted(scored) == list(range(30))  # every group scored exactly once
    for rec in cf.folds:
        assert set(rec.train_groups).isdisjoint(rec.test_groups)
    assert np.all(np.isfinite(cf.proba))


def test_nested_selection_only_ever_fits_on_the_outer_training_groups(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    signals, zv = _toy(30)
    for K in signals:
        signals[K][:, 1] = np.arange(30)
    current: dict[str, set[int]] = {}
    real_fit = LogisticModel.fit.__func__
    n_fits = []

    def fit(cls, X, y, l2=1.0, names=None):
        seen = set(np.asarray(X)[:, 1].astype(int).tolist())
        assert seen <= current["train"], "a model saw a held-out group"
        n_fits.append(1)
        return real_fit(cls, X, y, l2, names)

    monkeypatch.setattr(LogisticModel, "fit", classmethod(fit))
    inner = gate_selector(
        lambda train: (
            fit_learned_gate(signals, zv, (10,), (5, 10, 15), 30, 0.8, n_folds=3, groups=train).gate
        ),
        lambda gate, test: (gate.decide_matrix(signals[10][test]), np.full(test.size, 10)),
    )

    def select(train):
        current["train"] = set(train.tolist())
        decide = inner(train)

        def judged(test):
            assert current["train"].isdisjoint(test.tolist())
            return decide(test)

        return judged

    h = nested_heldout_cuts(select, assign_folds(zv, 5, seed=0))
    assert len(h.folds) == 5 and len(n_fits) == 5 * (
        3 + 1
    )  # per outer fold: 3 inner fits + the refit
    assert sorted(np.concatenate([r.test_groups for r in h.folds]).tolist()) == list(range(30))


# --- thresholds under the precision floor ----------------------------------------------------


@pytest.mark.parametrize(
    ("floor", "threshold", "n_cut", "tp"),
    [(0.75, 0.6, 4, 3), (0.8, 0.8, 2, 2), (1.0, 0.8, 2, 2), (0.5, 0.6, 4, 3)],
)
def test_choose_threshold_hand_numbers(floor: float, threshold: float, n_cut: int, tp: int) -> None:
    # sorted scores 0.9 0.8 0.7 0.6 0.5 with labels 1 1 0 1 0: precision 1, 1, 2/3, 3/4, 3/5
    choice = choose_threshold([0.5, 0.9, 0.7, 0.8, 0.6], [False, True, False, True, True], floor)
    assert (choice.threshold, choice.n_cut, choice.tp) == (threshold, n_cut, tp)
    assert choice.precision >= floor


def test_choose_threshold_keeps_tied_scores_together_and_may_find_none() -> None:
    # cutting at 0.9 cuts both tied groups (1 of 2 zero-variance: 0.5 < 0.6); 0.5 cuts 2 of 3
    choice = choose_threshold([0.9, 0.9, 0.5], [True, False, True], 0.6)
    assert (choice.threshold, choice.n_cut, choice.tp) == (0.5, 3, 2)
    none = choose_threshold([0.9, 0.8], [False, False], 0.5)
    assert none.threshold is None and none.n_cut == 0


def test_learned_gate_threshold_clears_the_floor_on_held_out_scores() -> None:
    signals, zv = _toy(60, seed=2)
    fit = fit_learned_gate(
        signals, zv, (10,), (5, 10, 15), T_max=30, precision_floor=0.9, n_folds=5
    )
    gate = fit.gate
    assert gate.K == 10 and gate.threshold is not None
    rows = row_table(signals, zv, (5, 10, 15))
    held_out = fit.oof_proba[rows.K == 10]
    cut = held_out >= gate.threshold
    assert cut.sum() == gate.meta["heldout_n_cut"] > 0
    assert zv[cut].mean() >= 0.9 and gate.meta["heldout_precision"] >= 0.9
    # the final model is refit on every group: in-sample scores differ from the held-out ones
    in_sample = gate.decide_matrix(signals[10])
    assert in_sample.shape == (60,)


# --- the adaptive gate -----------------------------------------------------------------------


def _d_only_model(weight: float = -10.0) -> LogisticModel:
    """P(zero-variance) = sigmoid(weight · d_K): mean 0, std 1, one non-zero coefficient."""
    coef = [0.0] * len(FEATURE_NAMES)
    coef[0] = weight
    return LogisticModel(mean=(0.0,) * 8, std=(1.0,) * 8, coef=tuple(coef), intercept=0.0)


def test_adaptive_gate_cuts_at_the_first_confident_step() -> None:
    gate = AdaptiveGate(_d_only_model(), (5, 10, 15), (0.9, 0.5, None))
    # group 0: sure at K=5 (p = sigmoid(3) = 0.95); group 1: not at 5 (p 0.0067), p = 0.5 at 10;
    # group 2: confident only at 15, where the gate never cuts; group 3: never confident
    signals = {
        5: np.array([-0.3, 0.5, 0.5, 0.5]),
        10: np.array([-0.3, 0.0, 0.5, 0.5]),
        15: np.array([0.0, 0.0, -1.0, 0.5]),
    }
    by_K = {K: np.column_stack([v, np.zeros((4, 6))]) for K, v in signals.items()}
    cut, cut_K = gate.decide_matrix(by_K)
    assert cut.tolist() == [True, True, False, False]
    assert cut_K.tolist() == [5, 10, 0, 0]
    assert gate.decide_at(5, _signals(-0.3)) and not gate.decide_at(5, _signals(0.5))
    assert gate.decide_at(10, _signals(0.0)) and not gate.decide_at(15, _signals(-1.0))
    assert gate.K == 5 and gate.decide(_signals(-0.3)) == gate.decide_at(5, _signals(-0.3))
    with pytest.raises(SrolloutError, match="checks at K = 5, 10, 15"):
        gate.decide_at(7, _signals(0.0))
    assert gate.check_steps() == (5, 10, 15) and gate.check_steps(T_max=12) == (5, 10)
    rule = GateRule(rule="r1", K=10, d_L=0.12)
    assert rule.check_steps() == (10,) and rule.check_steps(T_max=9) == ()
    assert rule.decide_at(10, _signals(0.05)) and not rule.decide_at(5, _signals(0.05))


def test_variable_cut_savings_count_the_real_cut_step() -> None:
    # N=4, T_max=20: group 0 (zero-var) cut at 5 saves 15/20; group 1 (mixed) cut at 10 saves 10/20
    out = evaluate_variable_cuts(
        [True, True, False, False],
        [5, 10, 0, 0],
        [True, False, True, False],
        20,
        remaining_steps=[30, 20, 0, 0],
        total_steps=[60, 60, 40, 40],
    )
    assert (out.n_cut, out.tp, out.fp) == (2, 1, 1)
    assert out.precision == 0.5 and out.recall == 0.5
    assert out.safe_savings == pytest.approx(0.75 / 4)
    assert out.raw_savings == pytest.approx((0.75 + 0.5) / 4)
    assert out.measured_step_savings == pytest.approx(50 / 200)


def test_step_thresholds_hold_the_floor_per_step_among_groups_still_running() -> None:
    zv = np.array([True, True, False, True, False])
    p5 = np.array(
        [0.9, 0.2, 0.8, 0.3, 0.1]
    )  # sorted labels T F T T F: precision 1, .5, .67, .75, .6
    # floor 1: K=5 cuts group 0 only (t=0.9). At K=10 among groups 1..4 (0.95 F first): nothing.
    strict = choose_step_thresholds(
        {5: p5, 10: np.array([0.0, 0.9, 0.95, 0.8, 0.1])}, zv, (5, 10), 1.0
    )
    assert [c.threshold for c in strict] == [0.9, None]
    # the same floor, K=10 scores 0.9 T, 0.8 T, 0.5 F, 0.1 F among groups 1..4: t=0.8 cuts 1 and 3
    # (group 0's score at 10 is ignored: it was cut at 5)
    later = choose_step_thresholds(
        {5: p5, 10: np.array([0.99, 0.9, 0.5, 0.8, 0.1])}, zv, (5, 10), 1.0
    )
    assert [(c.threshold, c.n_cut, c.tp) for c in later] == [(0.9, 1, 1), (0.8, 2, 2)]
    # floor 0.6: K=5 takes t=0.2 (3 TP at 0.75 beats 3 TP at 0.6); only group 4 (mixed) is left
    loose = choose_step_thresholds(
        {5: p5, 10: np.array([0.0, 0.9, 0.95, 0.8, 0.1])}, zv, (5, 10), 0.6
    )
    assert [(c.threshold, c.n_cut, c.tp) for c in loose] == [(0.2, 4, 3), (None, 0, 0)]


def test_fit_adaptive_gate_on_a_toy_meets_the_floor_on_held_out_scores() -> None:
    signals, zv = _toy(60, seed=4)
    fit = fit_adaptive_gate(signals, zv, (5, 10, 15), precision_floor=0.9, T_max=30)
    alive = np.ones(60, dtype=bool)
    for K, t in zip(fit.gate.check_K, fit.gate.thresholds, strict=True):
        if t is None:
            continue
        cut = alive & (fit.oof_proba[K] >= t)
        assert zv[cut].mean() >= 0.9
        alive &= ~cut
    assert (~alive).any()


# --- gate.json --------------------------------------------------------------------------------


def test_gate_json_round_trip_for_both_kinds(tmp_path: Path) -> None:
    signals, zv = _toy(40)
    learned = fit_learned_gate(signals, zv, (10,), (5, 10, 15), 30, 0.8).gate
    adaptive = fit_adaptive_gate(signals, zv, (5, 10, 15), 0.8, 30).gate
    for gate, name in ((learned, "learned.json"), (adaptive, "adaptive.json")):
        path = gate.save(tmp_path / name)
        back = load_gate(path)
        assert type(back) is type(gate) and back == gate and back.to_dict() == gate.to_dict()
        assert json.loads(path.read_text())["kind"] == gate.to_dict()["kind"]
    assert (
        LearnedGate.load(tmp_path / "learned.json").decide_matrix(signals[10]).tolist()
        == learned.decide_matrix(signals[10]).tolist()
    )
    with pytest.raises(SrolloutError, match="expected a learned gate"):
        LearnedGate.load(tmp_path / "adaptive.json")
    bad = learned.to_dict() | {"threshold": 1.5}
    (tmp_path / "bad.json").write_text(json.dumps(bad))
    with pytest.raises(SrolloutError, match="bad.json.*threshold must be in"):
        load_gate(tmp_path / "bad.json")


def test_load_gate_reads_the_new_kinds_without_importing_them_first(tmp_path: Path) -> None:
    gate = AdaptiveGate(_d_only_model(), (5, 10), (0.9, None))
    path = gate.save(tmp_path / "gate.json")
    code = (
        "import sys; from srollout.core.gate import load_gate; "
        f"g = load_gate({str(path)!r}); print(type(g).__name__, g.check_K)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "AdaptiveGate (5, 10)"


def test_a_model_is_fit_on_the_signals_it_is_given_by_name():
    # two signals, hand-picked: the model reads exactly them, in that order, and K
    rng = np.random.default_rng(0)
    X = np.column_stack([rng.random(40), rng.random(40), np.full(40, 10.0)])
    y = (X[:, 1] > 0.5).astype(float)  # only invalid_action_rate says it
    model = LogisticModel.fit(X, y, 1.0, names=("termination_fraction", "invalid_action_rate"))
    assert model.feature_names == ("termination_fraction", "invalid_action_rate", "K")
    assert model.feature_set == "custom"
    assert abs(model.coef[1]) > 5 * abs(model.coef[0])
    assert LogisticModel.from_dict(model.to_dict()) == model  # a custom set round-trips
    with pytest.raises(SrolloutError, match="2 signal names for 1 signal columns"):
        LogisticModel.fit(X[:, 1:], y, 1.0, names=("termination_fraction", "invalid_action_rate"))
    with pytest.raises(SrolloutError, match="distinct signal names then K"):
        LogisticModel.fit(X, y, 1.0, names=("d_K", "invalid_action_rate"))
    with pytest.raises(SrolloutError, match="1 signals given, the model reads 2"):
        model.proba(X[:, 1:])
