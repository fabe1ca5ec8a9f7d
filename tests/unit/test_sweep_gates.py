"""srollout.stages.sweep_gates: gates chosen on some groups and judged on others, on the hand
buffer of tests/conftest.py (T_max = 10; zero-variance groups a and c; d_K at K = 4:
a 0, b 0, c 0.125, d 1; real steps 12, 32, 24, 29 = 97 in all, remaining after K = 4:
0, 16, 8, 13 and after K = 2: 4, 24, 16, 21)."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from srollout.config import GateFitConfig, SweepConfig
from srollout.core.adaptive_gate import AdaptiveGate
from srollout.core.learned_gate import LearnedGate
from srollout.errors import SrolloutError
from srollout.stages.buffer import load_buffer
from srollout.stages.sweep import sweep_table
from srollout.stages.sweep_gates import (
    ADAPTIVE_FILE,
    GATES_TABLE,
    LEARNED_FILE,
    _label_K,
    _threshold_selector,
    compare_gates,
    group_data,
    score_row,
    write,
)

ALL = np.arange(4)


def _config(hand_buffer: Path, **kw) -> SweepConfig:
    return SweepConfig(
        input=hand_buffer,
        **{
            "K": (4,),
            "d_L_grid": (0.05, 0.13),
            "T_max": 10,
            "precision_floor": 0.6,
            "n_boot": 200,
            **kw,
        },
    )


def _data(hand_buffer: Path, Ks=(2, 4)):
    return group_data(load_buffer(hand_buffer, list(Ks), default_K=Ks), Ks)


def test_group_data_holds_the_hand_numbers_at_every_K(hand_buffer):
    data = _data(hand_buffer)
    assert data.zero_var.tolist() == [True, False, True, False]
    assert data.signals_by_K[4][:, 0].tolist() == [0.0, 0.0, 0.125, 1.0]  # d_4
    assert data.signals_by_K[4][:, 6].tolist() == [1.0, 0.0, 0.0, 0.0]  # τ_4: only a has ended
    assert data.signals_by_K[2][:, 0].tolist() == [0.0, 0.0, 0.0, 1.0]  # c differs at step 4 only
    assert data.remaining_by_K[4].tolist() == [0, 16, 8, 13]
    assert data.remaining_by_K[2].tolist() == [4, 24, 16, 21]
    assert data.total_steps.tolist() == [12, 32, 24, 29]
    assert len(data.advantages) == 4 and data.advantages[0].tolist() == [0, 0, 0, 0]


def test_a_row_scores_cuts_at_one_K_against_the_oracle(hand_buffer):
    config = _config(hand_buffer)
    cut = np.array([True, True, False, False])  # a (TP) and b (FP) at K = 4
    row = score_row("r1", "in-sample", 4, cut, np.full(4, 4), _data(hand_buffer), 4, config)
    assert (row["gate"], row["selection"], row["K"]) == ("r1", "in-sample", 4)
    assert (row["n_cut"], row["tp"], row["fp"]) == (1 + 1, 1, 1)
    assert (row["precision"], row["recall"]) == (0.5, 0.5)
    assert row["safe_savings"] == pytest.approx(1 * (10 - 4) / 10 / 4)  # 0.15
    assert row["raw_savings"] == pytest.approx(2 * (10 - 4) / 10 / 4)  # 0.3
    assert row["measured_step_savings"] == pytest.approx((0 + 16) / 97)
    # b and d carry all the advantage mass (|A|² = 4 each): cutting b keeps sqrt(4/8)
    assert row["adv_l2_kept"] == pytest.approx(math.sqrt(0.5), rel=1e-5)
    assert row["oracle_K"] == 4 and row["oracle_safe_savings"] == pytest.approx(2 * 0.6 / 4)
    assert row["share_of_oracle"] == pytest.approx(0.15 / 0.3)
    assert (row["n_groups"], row["n_zero_var"]) == (4, 2)
    for name in (
        "safe_savings",
        "raw_savings",
        "precision",
        "recall",
        "measured_step_savings",
        "share_of_oracle",
    ):
        low, high = row[f"{name}_ci_low"], row[f"{name}_ci_high"]
        assert 0.0 <= low <= high, name
    assert row["precision_ci_high"] <= 1.0 and row["raw_savings_ci_high"] <= 0.6


def test_a_row_counts_each_groups_own_cut_step(hand_buffer):
    # a cut at K = 2, c at K = 4: both zero-variance, so every cut is a TP
    cut, cut_K = np.array([True, False, True, False]), np.array([2, 0, 4, 0])
    row = score_row(
        "adaptive", "cross-fitted", 2, cut, cut_K, _data(hand_buffer), 4, _config(hand_buffer)
    )
    assert (row["precision"], row["recall"]) == (1.0, 1.0)
    assert row["safe_savings"] == pytest.approx((0.8 + 0.6) / 4)
    assert row["measured_step_savings"] == pytest.approx((4 + 8) / 97)  # a's steps after 2
    assert row["share_of_oracle"] == pytest.approx(0.35 / 0.3)  # earlier than the oracle's K


def test_a_row_without_cuts_has_no_precision_and_no_precision_interval(hand_buffer):
    none = np.zeros(4, dtype=bool)
    row = score_row(
        "learned",
        "cross-fitted",
        4,
        none,
        np.full(4, 4),
        _data(hand_buffer),
        4,
        _config(hand_buffer),
    )
    assert row["n_cut"] == 0 and math.isnan(row["precision"])
    assert math.isnan(row["precision_ci_low"]) and math.isnan(row["precision_ci_high"])
    assert (row["safe_savings"], row["share_of_oracle"]) == (0.0, 0.0)


def test_the_threshold_selector_chooses_on_the_training_groups_only(hand_buffer):
    data = _data(hand_buffer, (4,))
    select = _threshold_selector(data, data, "r1", _config(hand_buffer))
    # on all groups: d_L 0.05 cuts a, b (precision 1/2 < 0.6); 0.13 cuts a, b, c (2/3)
    cut, cut_K = select(ALL)(ALL)
    assert cut.tolist() == [True, True, True, False] and cut_K.tolist() == [4, 4, 4, 4]
    cut, _ = select(ALL)(np.array([3, 2]))  # the chosen gate decides any groups, in their order
    assert cut.tolist() == [False, True]
    # trained on b and d (no zero-variance group): no point clears the floor, nothing is cut
    cut, cut_K = select(np.array([1, 3]))(ALL)
    assert not cut.any() and cut_K.tolist() == [0, 0, 0, 0]


def test_the_label_of_a_fixed_K_family_is_its_most_common_cut_step():
    assert _label_K(np.array([True, True, True, False]), np.array([5, 10, 10, 5]), 7) == 10
    assert _label_K(np.array([True, True]), np.array([10, 5]), 7) == 5  # a tie: the smaller K
    assert _label_K(np.zeros(3, dtype=bool), np.array([5, 5, 5]), 7) == 7  # nothing cut


def test_judged_on_an_eval_buffer_every_row_is_worked_by_hand_and_the_gates_are_written(
    hand_buffer,
):
    config = _config(hand_buffer)
    gates = GateFitConfig(learned=True, adaptive=True, check_K=(2, 4), eval_buffer=hand_buffer)
    sweep = sweep_table(load_buffer(hand_buffer, [4], default_K=(4,)), config)
    got = compare_gates(config, gates, sweep)
    assert got.protocol == f"fit on {hand_buffer}, judged on {hand_buffer}"
    table = got.table
    assert table.select("gate", "selection", "K").rows() == [
        ("r1", "in-sample", 4),
        ("r1", "eval buffer", 4),
        ("learned", "eval buffer", 4),
        ("adaptive", "eval buffer", 2),
        ("oracle", "labels", 4),
    ]
    r1, r1_eval, learned, adaptive, oracle = table.iter_rows(named=True)
    # R1 at d_L 0.13 cuts a, b, c: 2 TP, 1 FP; safe 2·0.6/4, measured (0 + 16 + 8)/97
    for row in (r1, r1_eval):  # chosen on INPUT, judged on the same groups here
        assert (row["n_cut"], row["tp"], row["fp"]) == (3, 2, 1)
        assert row["safe_savings"] == pytest.approx(0.3)
        assert row["measured_step_savings"] == pytest.approx(24 / 97)
        assert row["share_of_oracle"] == pytest.approx(1.0)
    # four groups give the logistic models no threshold that clears the floor: nothing is cut
    assert got.learned.threshold is None and got.adaptive.thresholds == (None, None)
    assert learned["n_cut"] == adaptive["n_cut"] == 0
    assert (oracle["n_cut"], oracle["tp"], oracle["precision"], oracle["recall"]) == (2, 2, 1, 1)
    assert oracle["measured_step_savings"] == pytest.approx((0 + 8) / 97)

    run = hand_buffer.parent / "sweep"
    run.mkdir()
    paths = write(run, got)
    assert [p.name for p in paths] == [GATES_TABLE, LEARNED_FILE, ADAPTIVE_FILE]
    assert pl.read_parquet(run / GATES_TABLE).equals(table)
    assert LearnedGate.load(run / LEARNED_FILE).model.coef == got.learned.model.coef
    assert AdaptiveGate.load(run / ADAPTIVE_FILE).check_K == (2, 4)


def test_cross_fitting_needs_three_groups_of_each_kind(hand_buffer):
    config = _config(hand_buffer)
    sweep = sweep_table(load_buffer(hand_buffer, [4], default_K=(4,)), config)
    few = r"2 zero-variance and 2 other groups; the learned/adaptive gates need at least 3 of each"
    with pytest.raises(SrolloutError, match=few):
        compare_gates(config, GateFitConfig(learned=True, check_K=(4,)), sweep)


def test_check_steps_and_trajectories_beyond_T_max_are_refused(hand_buffer):
    config = _config(hand_buffer)
    with pytest.raises(SrolloutError, match=r"^check_K=12 is larger than T_max=10$"):
        compare_gates(config, GateFitConfig(adaptive=True, check_K=(4, 12)), pl.DataFrame())
    short = _config(hand_buffer, T_max=8)
    long = r"trajectories run up to 10 steps, more than --T-max 8; pass --T-max 10 or more"
    with pytest.raises(SrolloutError, match=long):
        compare_gates(short, GateFitConfig(adaptive=True, check_K=(4,)), pl.DataFrame())
