"""Unit tests of srollout.core.grpo: advantages, labels, loss denominators."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from srollout.core.grpo import (
    LOSS_DENOMINATORS,
    group_advantages,
    group_label,
    is_zero_variance,
    reward_variance,
    sequence_weights,
    zero_advantage_fraction,
)
from srollout.errors import SrolloutError


def test_advantages_hand_worked():
    # rewards [1,0,0,1]: mean 0.5, population std 0.5 -> A = ±0.5 / (0.5 + eps) ≈ ±1.
    eps = 1e-6
    a = group_advantages([1, 0, 0, 1], eps=eps)
    want = 0.5 / (0.5 + eps)
    np.testing.assert_allclose(a, [want, -want, -want, want], rtol=0, atol=1e-15)
    # [1,0,0,0]: mean 0.25, var = (0.5625 + 3*0.0625)/4 = 0.1875, std = 0.4330.
    b = group_advantages([1, 0, 0, 0], eps=0.0)
    std = np.sqrt(0.1875)
    np.testing.assert_allclose(b, [0.75 / std, -0.25 / std, -0.25 / std, -0.25 / std])


def test_population_not_sample_std():
    # Sample std of [0, 1] is 0.707; population std is 0.5.
    np.testing.assert_allclose(group_advantages([0, 1], eps=0.0), [-1.0, 1.0])
    assert reward_variance([0, 1]) == pytest.approx(0.25)
    assert reward_variance([1, 0, 0, 0]) == pytest.approx(0.1875)


def test_zero_variance_group_has_zero_advantages():
    for r in ([0] * 8, [1] * 8, [0.3] * 5):
        assert np.all(group_advantages(r) == 0.0)
        assert is_zero_variance(r)
        assert reward_variance(r) == 0.0
    assert not is_zero_variance([0, 0, 1e-6])
    assert is_zero_variance([0, 0, 1e-13])


@settings(max_examples=100, deadline=None)
@given(st.lists(st.sampled_from([0.0, 1.0]), min_size=2, max_size=16))
def test_advantages_are_z_scores(rewards):
    a = group_advantages(rewards, eps=0.0)
    assert abs(a.sum()) < 1e-9
    if not is_zero_variance(rewards):
        assert np.mean(a**2) == pytest.approx(1.0)


def test_labels():
    assert group_label([0, 0, 0]) == "all_fail"
    assert group_label([1, 1, 1]) == "all_succeed"
    assert group_label([0, 1, 0]) == "mixed"
    assert group_label([0.4, 0.4]) == "all_fail"
    assert group_label([0.4, 0.4], success_threshold=0.4) == "all_succeed"


def test_sequence_weights_hand_worked():
    lens = [2, 3, 5]
    np.testing.assert_allclose(sequence_weights("paper", lens), [1 / 3] * 3)
    np.testing.assert_allclose(sequence_weights("token_mean", lens), [1 / 10] * 3)
    np.testing.assert_allclose(sequence_weights("seq_mean", lens), [1 / 6, 1 / 9, 1 / 15])
    np.testing.assert_allclose(sequence_weights("constant", lens, constant=400), [1 / 400] * 3)
    np.testing.assert_allclose(sequence_weights("seq_mean", [0, 4]), [0.0, 1 / 8])
    assert set(LOSS_DENOMINATORS) == {"paper", "token_mean", "seq_mean", "constant"}
    for kind in ("paper", "token_mean", "seq_mean"):
        assert sequence_weights(kind, []).shape == (0,)


def test_loss_weights_reproduce_paper_loss():
    # L = -(1/N) Σ A_i log p(τ_i): with w = 1/N the weighted sum equals the paper's mean.
    rng = np.random.default_rng(0)
    A = rng.normal(size=6)
    logp = rng.normal(size=6)
    w = sequence_weights("paper", [3] * 6)
    assert -(w * A * logp).sum() == pytest.approx(-np.mean(A * logp))


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda: sequence_weights("mean", [1]), "one of paper"),
        (lambda: sequence_weights("constant", [1]), "constant > 0"),
        (lambda: sequence_weights("paper", [-1]), "non-negative"),
        (lambda: group_advantages([]), "non-empty"),
        (lambda: group_advantages([[1, 0]]), "1-D"),
        (lambda: group_advantages([1, float("nan")]), "finite"),
        (lambda: group_advantages([1, 0], eps=-1), "eps"),
    ],
)
def test_bad_inputs(call, match):
    with pytest.raises(SrolloutError, match=match):
        call()


def test_zero_advantage_fraction():
    advs = [
        group_advantages([0, 0, 0, 0]),
        group_advantages([1, 0, 0, 1]),
        group_advantages([1, 1]),
    ]
    # 4 + 2 zero-advantage trajectories out of 10.
    assert zero_advantage_fraction(advs) == pytest.approx(0.6)
    assert np.isnan(zero_advantage_fraction([]))


def test_group_outcomes_are_the_per_group_functions_row_by_row():
    from srollout.core.grpo import group_label, group_outcomes, is_zero_variance, reward_variance

    rng = np.random.default_rng(0)
    rewards = np.vstack(
        [
            (rng.random((40, 8)) < 0.5).astype(float),
            rng.random((10, 8)),
            np.ones((3, 8)),
            np.zeros((3, 8)),
        ]
    )
    out = group_outcomes(rewards)
    assert out.reward_var.tolist() == [reward_variance(r) for r in rewards]  # the same floats
    assert out.zero_var.tolist() == [is_zero_variance(r) for r in rewards]
    assert out.label.tolist() == [group_label(r) for r in rewards]
    with pytest.raises(SrolloutError, match="finite"):
        group_outcomes(np.array([[1.0, np.nan]]))


def test_labels_come_from_success_not_from_a_reward_threshold():
    # a game that pays 0.5 on every loss: four lost trajectories are all_fail, not all_succeed
    assert group_label([0.5] * 4) == "all_succeed"  # a table without success: mean >= 0.5
    assert group_label([0.5] * 4, success=[False] * 4) == "all_fail"
    assert group_label([0.0] * 4, success=[True] * 4) == "all_succeed"  # won, paid nothing
    # equal rewards, split outcomes: all_succeed from half of them on
    assert group_label([1.0] * 4, success=[True, True, False, False]) == "all_succeed"
    assert group_label([1.0] * 4, success=[True, False, False, False]) == "all_fail"
    # rewards that differ are mixed whatever the outcomes
    assert group_label([0.25, 0.5, 0.5, 0.5], success=[False] * 4) == "mixed"
    from srollout.core.grpo import group_outcomes

    out = group_outcomes(
        [[0.5] * 4, [0.5] * 4, [0.0, 1.0, 0.0, 0.0]],
        success=[[False] * 4, [True] * 4, [False, True, False, False]],
    )
    assert out.label.tolist() == ["all_fail", "all_succeed", "mixed"]
