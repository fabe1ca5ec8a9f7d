"""Hand-worked numbers for the training summaries: the off-policy plan, per-seed aggregation,
the dilution prediction and the paired tests over (seed, task) outcomes."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest

from srollout.report.onpolicy import arms_frame, mean_std, paired_test, per_seed, success_by_eval
from srollout.stages.train_offpolicy import sample_plan


def test_plan_uses_every_group_once_before_repeating():
    ids = [f"g{i}" for i in range(10)]
    plan = sample_plan(ids, steps=5, per_step=4, seed=42)
    flat = [g for step in plan for g in step]
    assert len(plan) == 5 and all(len(s) == 4 for s in plan)
    assert sorted(flat[:8]) == sorted(set(flat[:8])) and set(flat[:8]) <= set(
        ids
    )  # steps 1-2: 8 distinct
    assert plan == sample_plan(ids, steps=5, per_step=4, seed=42)  # seeded
    assert plan != sample_plan(ids, steps=5, per_step=4, seed=7)


def _metrics(arm, grad, zadv, iter_s, cuts, tokens=None):
    n = len(grad)
    return pl.DataFrame(
        {
            "arm": [arm] * n,
            "seed": [7] * n,
            "iteration": list(range(1, n + 1)),
            "train/grad_l2": grad,
            "train/zero_adv_frac": zadv,
            "time/iter_s": iter_s,
            "gate/cuts": cuts,
            "rollout/groups": [10] * n,
            "train/stepped": [True] * n,
            "gate/kept": [10 - c for c in cuts],
            "gate/zero_var_kept": [4 - c for c in cuts],
            "rollout/gen_tokens": tokens or [100] * n,
        }
    )


def test_per_seed_numbers_and_dilution_prediction():
    # baseline: z = 0.4 on average, gated: z = 0.25 -> prediction (1-0.25)/(1-0.4) = 1.25
    m = pl.concat(
        [
            _metrics("baseline", [0.10, 0.14], [0.4, 0.4], [10.0, 10.0], [0, 0]),
            _metrics("gated", [0.12, 0.18], [0.2, 0.3], [9.0, 8.0], [2, 1], [90, 70]),
        ]
    )
    ev = pl.DataFrame(
        {
            "arm": ["baseline", "gated"] * 2,
            "seed": [7] * 4,
            "iteration": [0, 0, 2, 2],
            "task_id": ["t"] * 4,
            "success": [False, False, True, False],
        }
    )
    row = per_seed(m, ev).row(0, named=True)
    assert row["wall_saving"] == pytest.approx(3 / 20)
    assert (row["gen_tokens_baseline"], row["gen_tokens_gated"]) == (200, 160)
    assert row["token_saving"] == pytest.approx(0.2)
    assert "cut_precision" not in row  # only a --judge-cuts run judges its cuts
    assert row["cuts_gated"] == 3 and row["cuts_baseline"] == 0
    assert row["grad_l2_ratio"] == pytest.approx(0.15 / 0.12)
    assert row["dilution_prediction"] == pytest.approx(0.75 / 0.6)
    assert row["eval_last_delta"] == pytest.approx(-1.0) and row["eval0_gated"] == 0.0
    assert mean_std([1.0, 3.0]) == (2.0, pytest.approx(np.sqrt(2.0)))


def test_per_seed_judged_cuts_give_the_cut_precision():
    judged = _metrics("gated", [0.12, 0.18], [0.2, 0.3], [9.0, 8.0], [2, 1]).with_columns(
        pl.Series("gate/cut_tp", [2, 0]), pl.Series("gate/cut_fp", [0, 1])
    )
    base = _metrics("baseline", [0.10, 0.14], [0.4, 0.4], [10.0, 10.0], [0, 0]).with_columns(
        pl.Series("gate/cut_tp", [0, 0]), pl.Series("gate/cut_fp", [0, 0])
    )
    ev = pl.DataFrame(
        {"arm": ["baseline", "gated"], "seed": [7, 7], "iteration": [0, 0], "task_id": ["t"] * 2}
    ).with_columns(pl.lit(True).alias("success"))
    row = per_seed(pl.concat([base, judged]), ev).row(0, named=True)
    assert (row["cut_tp_gated"], row["cut_fp_gated"]) == (2, 1)
    assert row["cut_precision"] == pytest.approx(2 / 3)


def test_paired_test_counts_discordant_pairs():
    # 2 seeds x 5 tasks; baseline wins 3, gated wins 6; gated-only 4 pairs, baseline-only 1
    base = [1, 0, 0, 0, 1, 0, 0, 1, 0, 0]
    gated = [1, 1, 1, 0, 0, 1, 0, 1, 1, 0]
    rows = []
    for arm, xs in (("baseline", base), ("gated", gated)):
        for i, x in enumerate(xs):
            rows.append(
                {
                    "arm": arm,
                    "seed": 7 + i // 5,
                    "iteration": 4,
                    "task_id": f"t{i % 5}",
                    "success": bool(x),
                }
            )
    t = paired_test(pl.DataFrame(rows), ("baseline", 4), ("gated", 4), "gated - baseline")
    assert t.n == 10 and t.rate_a == 0.3 and t.rate_b == 0.6
    assert t.diff == pytest.approx(0.3) and t.b01 == 4 and t.b10 == 1
    assert t.p_mcnemar == pytest.approx(0.375)  # exact binomial: 2 * P(X <= 1 | n=5, p=1/2) = 12/32
    assert t.ci_low <= 0.3 <= t.ci_high


def test_arms_frame_totals_per_seed_and_savings_against_the_baseline():
    # baseline: 2 iterations of 10 s, 100 tokens, 3 useful groups each; dapo: 15 s, 200 tokens,
    # 5 useful, 2 rounds (1 extra) each, one cap hit -> useful/s 6/20 = 0.3 and 10/30 = 1/3
    def arm(name, iter_s, tokens, useful, rounds, cap):
        return pl.DataFrame(
            {
                "arm": [name] * 2,
                "seed": [7] * 2,
                "iteration": [1, 2],
                "time/iter_s": [iter_s] * 2,
                "rollout/gen_tokens": [tokens] * 2,
                "gate/useful": [useful] * 2,
                "rollout/groups": [8] * 2,
                "gate/cuts": [0] * 2,
                "gate/skipped": [0] * 2,
                "gate/dapo_rounds": [rounds] * 2,
                "gate/dapo_hit_cap": [False, cap],
            }
        )

    m = pl.concat([arm("baseline", 10.0, 100, 3, 1, False), arm("dapo", 15.0, 200, 5, 2, True)])
    ev = pl.DataFrame(
        {
            "arm": ["baseline", "dapo"],
            "seed": [7, 7],
            "iteration": [2, 2],
            "task_id": ["t", "t"],
            "success": [True, True],
        }
    )
    rows = {r["arm"]: r for r in arms_frame(m, ev).to_dicts()}
    base = rows["baseline"]
    assert base["wall_s"] == 20.0 and base["useful_per_s"] == pytest.approx(0.3)
    d = rows["dapo"]
    assert (d["wall_s"], d["gen_tokens"], d["useful_groups"]) == (30.0, 400.0, 10.0)
    assert d["useful_per_s"] == pytest.approx(1 / 3)
    assert d["extra_rounds"] == 2 and d["cap_hits"] == 1
    assert d["wall_saving"] == pytest.approx(-0.5) and d["token_saving"] == pytest.approx(-1.0)


def test_the_documented_rename_table_is_the_one_the_code_applies():
    """docs/artifacts.md's "old name -> new name" table lists exactly the renames of
    srollout.training.metrics (the ones a resumed old run gets)."""
    import re
    from pathlib import Path

    from srollout.training.metrics import OFFPOLICY_RENAMES, ONPOLICY_RENAMES

    doc = (Path(__file__).resolve().parents[2] / "docs" / "artifacts.md").read_text()
    section = doc[doc.index("### Column names before the namespacing") :]
    section = section[: section.index("\n## ")]
    found: dict[str, dict[str, str]] = {"train-onpolicy": {}, "train-offpolicy": {}}
    for old, new, stages in re.findall(r"^\| `([^`]+)` \| `([^`]+)` \| ([^|]+) \|", section, re.M):
        for stage in found:
            if stage in stages:
                found[stage][old] = new
    assert found["train-onpolicy"] == ONPOLICY_RENAMES
    assert found["train-offpolicy"] == OFFPOLICY_RENAMES


def test_success_at_each_evaluation_per_seed_and_over_seeds():
    # 2 tasks per evaluation. baseline: seed 7 wins 1/2 then 2/2, seed 13 wins 0/2 then 1/2
    # -> iteration 0: 50, 0 (mean 25, std 35.4); iteration 10: 100, 50 (mean 75, std 35.4)
    wins = {
        ("baseline", 7, 0): [1, 0],
        ("baseline", 7, 10): [1, 1],
        ("baseline", 13, 0): [0, 0],
        ("baseline", 13, 10): [1, 0],
        ("gated", 7, 0): [1, 0],
        ("gated", 7, 10): [0, 0],
    }
    ev = pl.DataFrame(
        [
            {"arm": a, "seed": s, "iteration": i, "task_id": f"t{k}", "success": bool(w)}
            for (a, s, i), ws in wins.items()
            for k, w in enumerate(ws)
        ]
    )
    table = success_by_eval(ev)
    assert table.columns == ["arm", "seed", "it 0", "it 10"]
    assert table.rows() == [
        ("baseline", "7", "50.0", "100.0"),
        ("baseline", "13", "0.0", "50.0"),
        ("baseline", "mean ± std", "25.0 ± 35.4", "75.0 ± 35.4"),
        ("gated", "7", "50.0", "0.0"),  # one seed: no mean row
    ]
