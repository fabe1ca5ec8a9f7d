"""srollout.core.step_signals: the signals at K read from the steps' own records, worked by hand,
and their agreement with the Parquet contract (schemas.STEP_SIGNAL_NAMES)."""

from __future__ import annotations

import math

import pytest

from srollout import schemas
from srollout.core.step_signals import (
    STEP_COLUMNS,
    STEP_SIGNALS,
    action_logprob_mean,
    invalid_action_rate,
    step_signals,
)

# G = 3 trajectories; trajectory 1 ended after 2 steps, so at K = 3 the group has 3 + 2 + 3 steps.
LOGPROB = [[-0.1, -0.3, -0.2, -5.0], [-1.0, -2.0], [-0.4, float("nan"), -0.6, -0.6]]
VALID = [[True, False, True, True], [False, False], [True, True, True, False]]


def test_action_logprob_mean_worked_by_hand():
    # K = 3: (-0.1 - 0.3 - 0.2) + (-1.0 - 2.0) + (-0.4 - 0.6, the NaN step skipped) = -4.6 over 7
    assert action_logprob_mean(LOGPROB, 3) == pytest.approx(-4.6 / 7)
    # K = 1: first steps only, -0.1, -1.0, -0.4
    assert action_logprob_mean(LOGPROB, 1) == pytest.approx(-0.5)
    # K = 10: every step there is; trajectory 0's -5.0 at step 4 now counts
    assert action_logprob_mean(LOGPROB, 10) == pytest.approx((-0.6 - 5.0 - 3.0 - 1.6) / 9)
    assert math.isnan(action_logprob_mean([[float("nan")], [float("nan")]], 1))  # the planners


def test_invalid_action_rate_worked_by_hand():
    # K = 3: rejected steps 0:2, 1:1, 1:2 -> 3 of the 8 steps there are
    assert invalid_action_rate(VALID, 3) == pytest.approx(3 / 8)
    assert invalid_action_rate(VALID, 1) == pytest.approx(1 / 3)
    # K = 4: all 4 + 2 + 4 steps; rejected: 0:2, 1:1, 1:2, 2:4
    assert invalid_action_rate(VALID, 4) == pytest.approx(4 / 10)


def test_step_signals_reads_the_columns_it_is_given_and_nan_for_the_rest():
    both = step_signals({"logprob_mean": LOGPROB, "valid": VALID}, 3)
    assert list(both) == list(schemas.STEP_SIGNAL_NAMES)
    assert both["action_logprob_mean"] == pytest.approx(-4.6 / 7)
    assert both["invalid_action_rate"] == pytest.approx(3 / 8)
    old = step_signals({"valid": VALID}, 3)  # a steps table written before the log-probs
    assert math.isnan(old["action_logprob_mean"]) and old["invalid_action_rate"] == 3 / 8


def test_the_registry_is_the_contract():
    assert tuple(STEP_SIGNALS) == schemas.STEP_SIGNAL_NAMES
    assert set(STEP_COLUMNS) <= set(schemas.STEPS.columns) | set(schemas.STEPS.optional)
    assert set(schemas.STEP_SIGNAL_NAMES) == set(schemas.SIGNALS.optional)
    assert schemas.signal_names(["x", "invalid_action_rate"]) == (
        *schemas.SIGNAL_NAMES, "invalid_action_rate",
    )  # fmt: skip
