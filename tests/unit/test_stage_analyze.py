"""srollout.stages.analyze: the correlation, stratification and false-positive tables."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import polars as pl
import pytest
from scipy import stats

from srollout import schemas
from srollout.stages.analyze import (
    correlation_table,
    false_positive_table,
    modal_prefix,
    per_task_type_table,
    stratification_table,
    task_type_summary,
)
from srollout.stages.buffer import load_buffer


def _random_signals(n: int, seed: int) -> pl.DataFrame:
    rng = np.random.default_rng(seed)
    var = np.where(rng.random(n) < 0.4, 0.0, rng.choice([0.1875, 0.25, 0.234375], n))
    label = np.where(var > 0, "mixed", np.where(rng.random(n) < 0.5, "all_fail", "all_succeed"))
    # coarse values on purpose: many ties
    data = {
        name: np.round(rng.random(n) * 8) / 8 + (var > 0) * 0.1 for name in schemas.SIGNAL_NAMES
    }
    return pl.DataFrame(
        {
            "group_id": [f"g{i}" for i in range(n)],
            "task_type": rng.choice(["p", "q"], n),
            "K": [10] * n,
            **data,
            "reward_var": var,
            "label": label,
            "zero_var": var == 0,
        }
    )


def _naive_auroc(score: np.ndarray, positive: np.ndarray) -> float:
    pos, neg = score[positive], score[~positive]
    wins = sum(1.0 if p > q else 0.5 if p == q else 0.0 for p in pos for q in neg)
    return wins / (len(pos) * len(neg))


def test_correlation_table_matches_scipy_and_naive_auroc() -> None:
    signals = _random_signals(60, seed=4)
    corr = correlation_table(signals)
    assert corr.height == 7 and corr["n"].to_list() == [60] * 7
    for row in corr.iter_rows(named=True):
        x = signals[row["metric"]].to_numpy()
        ref = stats.spearmanr(x, signals["reward_var"].to_numpy())
        assert row["spearman_rho"] == pytest.approx(ref.statistic, abs=1e-10)
        assert row["p_value"] == pytest.approx(ref.pvalue, rel=1e-6)
        assert row["auroc"] == pytest.approx(
            _naive_auroc(x, ~signals["zero_var"].to_numpy()), abs=1e-12
        )
    schemas.validate(corr, schemas.CORRELATION, "corr")


def test_nan_signal_values_are_left_out_of_n() -> None:
    signals = _random_signals(20, seed=1).with_columns(
        pl.when(pl.int_range(pl.len()) < 5)
        .then(float("nan"))
        .otherwise(pl.col("obs_unique_ratio"))
        .alias("obs_unique_ratio")
    )
    corr = correlation_table(signals)
    assert corr.filter(pl.col("metric") == "obs_unique_ratio")["n"][0] == 15
    assert corr.filter(pl.col("metric") == "action_entropy")["n"][0] == 20


def test_per_task_type_and_summary() -> None:
    signals = _random_signals(40, seed=2)
    per_type = per_task_type_table(signals)
    assert sorted(per_type["task_type"].unique().to_list()) == ["p", "q"]
    p = signals.filter(pl.col("task_type") == "p")
    assert per_type.filter(pl.col("task_type") == "p")["n_zv"][0] == int(p["zero_var"].sum())
    summary = task_type_summary(per_type, gate_K=10)
    for row in summary.iter_rows(named=True):
        cells = per_type.filter(pl.col("task_type") == row["task_type"])
        assert row["best_auroc"] == pytest.approx(cells["auroc"].max())
        assert (
            row["d_K_auroc"]
            == cells.filter(pl.col("metric") == "prefix_edit_distance_mean")["auroc"][0]
        )


def test_stratification_medians_and_quartiles() -> None:
    signals = pl.DataFrame(
        {
            "K": [5] * 5,
            "label": ["mixed"] * 4 + ["all_fail"],
            **{n: [0.0, 0.1, 0.2, 0.6, 0.3] for n in schemas.SIGNAL_NAMES},
        }
    )
    strat = stratification_table(signals)
    mixed = strat.filter((pl.col("metric") == "action_entropy") & (pl.col("label") == "mixed")).row(
        0, named=True
    )
    # 0, .1, .2, .6: median .15, linear quartiles .075 and .3
    assert (mixed["n"], mixed["median"], mixed["q25"], mixed["q75"]) == (
        4,
        pytest.approx(0.15),
        pytest.approx(0.075),
        pytest.approx(0.3),
    )
    assert strat["label"].to_list()[:2] == ["all_fail", "mixed"]  # paper's label order


def test_modal_prefix_prefers_the_most_common_then_the_earliest() -> None:
    assert modal_prefix([["a", "b", "x"], ["c"], ["a", "b", "y"]], 2) == ("a → b", 2)
    assert modal_prefix([["c", "d"], ["a", "b"]], 2) == ("c → d", 1)


def test_false_positive_table_on_the_hand_buffer(hand_buffer: Path) -> None:
    buffer = load_buffer(hand_buffer, [4], default_K=(4,))
    assert false_positive_table(buffer, 4, 0.12)["group_id"].to_list() == ["b"]
    assert false_positive_table(buffer, 4, 0.0).height == 0  # d_L = 0 never fires
    wide = false_positive_table(buffer, 4, 1.0)  # d < 1 cuts a, b, c: only b varies
    assert wide["group_id"].to_list() == ["b"]
