"""Hand-worked numbers for the training summaries: the off-policy plan, per-seed aggregation,
the dilution prediction and the paired tests over (seed, task) outcomes."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest

from srollout.report.onpolicy import mean_std, paired_test, per_seed
from srollout.stages.train_offpolicy import sample_plan


def test_plan_uses_every_group_once_before_repeating():
    ids = [f"g{i}" for i in range(10)]
    plan = sample_plan(ids, steps=5, per_step=4, seed=42)
    flat = [g for step in plan for g in step]
    assert len(plan) == 5 and all(len(s) == 4 for s in plan)
    assert sorted(flat[:8]) == sorted(set(flat[:8])) and set(flat[:8]) <= set(ids)  # steps 1-2: 8 distinct
    assert plan == sample_plan(ids, steps=5, per_step=4, seed=42)  # seeded
    assert plan != sample_plan(ids, steps=5, per_step=4, seed=7)


def _metrics(arm, grad, zadv, iter_s, cuts):
    n = len(grad)
    return pl.DataFrame({
        "arm": [arm] * n, "seed": [7] * n, "iteration": list(range(1, n + 1)), "grad_l2": grad,
        "zero_adv_frac": zadv, "iter_s": iter_s, "n_cut": cuts, "n_groups": [10] * n, "stepped": [True] * n,
        "n_kept": [10 - c for c in cuts], "n_zero_var_kept": [4 - c for c in cuts],
    })


def test_per_seed_numbers_and_dilution_prediction():
    # baseline: z = 0.4 on average, gated: z = 0.25 -> prediction (1-0.25)/(1-0.4) = 1.25
    m = pl.concat([
        _metrics("baseline", [0.10, 0.14], [0.4, 0.4], [10.0, 10.0], [0, 0]),
        _metrics("gated", [0.12, 0.18], [0.2, 0.3], [9.0, 8.0], [2, 1]),
    ])
    ev = pl.DataFrame({"arm": ["baseline", "gated"] * 2, "seed": [7] * 4, "iteration": [0, 0, 2, 2],
                       "task_id": ["t"] * 4, "success": [False, False, True, False]})
    row = per_seed(m, ev).row(0, named=True)
    assert row["wall_saving"] == pytest.approx(3 / 20)
    assert row["cuts_gated"] == 3 and row["cuts_baseline"] == 0
    assert row["grad_l2_ratio"] == pytest.approx(0.15 / 0.12)
    assert row["dilution_prediction"] == pytest.approx(0.75 / 0.6)
    assert row["eval_last_delta"] == pytest.approx(-1.0) and row["eval0_gated"] == 0.0
    assert mean_std([1.0, 3.0]) == (2.0, pytest.approx(np.sqrt(2.0)))


def test_paired_test_counts_discordant_pairs():
    # 2 seeds x 5 tasks; baseline wins 3, gated wins 6; gated-only 4 pairs, baseline-only 1
    base = [1, 0, 0, 0, 1, 0, 0, 1, 0, 0]
    gated = [1, 1, 1, 0, 0, 1, 0, 1, 1, 0]
    rows = []
    for arm, xs in (("baseline", base), ("gated", gated)):
        for i, x in enumerate(xs):
            rows.append({"arm": arm, "seed": 7 + i // 5, "iteration": 4, "task_id": f"t{i % 5}", "success": bool(x)})
    t = paired_test(pl.DataFrame(rows), ("baseline", 4), ("gated", 4), "gated - baseline")
    assert t.n == 10 and t.rate_a == 0.3 and t.rate_b == 0.6
    assert t.diff == pytest.approx(0.3) and t.b01 == 4 and t.b10 == 1
    assert t.p_mcnemar == pytest.approx(0.375)  # exact binomial: 2 * P(X <= 1 | n=5, p=1/2) = 12/32
    assert t.ci_low <= 0.3 <= t.ci_high
