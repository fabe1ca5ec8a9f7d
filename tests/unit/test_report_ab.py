"""srollout.report.ab: what `srollout ab-rollout` shows, on a comparison worked out by hand.

The comparison below: 4 tasks, one repeat, T_max = 10, the gate at K = 4. The baseline took
40 s, the gated arm 30 s (saving 1 − 30/40 = 25 %); 2 groups cut, 1 of them zero-variance in
the baseline (TP) of the baseline's 2 zero-variance groups: precision = recall = 0.5; the
paper's safe saving 1 · (10 − 4) / (4 · 10) = 15 %, raw 2 · 6 / 40 = 30 %. Timed runs in ABBA
order: block 0 baseline 12 s then gated 9 s (saves 25 %), block 1 gated 10 s then baseline
8 s (costs 25 %).
"""

from __future__ import annotations

import math

import polars as pl
import pytest
from conftest import linked_docs

from srollout.config import AbRolloutConfig
from srollout.core.ab_scoring import Comparison, Confusion, Mismatch, Saving, SeedMatch
from srollout.core.stats import PairedBootstrap
from srollout.report.ab import (
    _mismatch_text,
    arms_text,
    arms_view,
    block_savings_frame,
    blocks_frame,
    confusion_frame,
    drift_text,
    method_text,
    same_work,
    savings_frame,
)

NAN = math.nan


def _comparison(cut: int = 2, tp: int = 1, arm_steps: float = 34.0) -> Comparison:
    savings = {
        "wall_s": Saving("wall-clock (s)", 40.0, 30.0, 0.25, 0.1, 0.4, "2 timed-run pair(s)"),
        "n_gen_tokens": Saving("generated tokens", 1000.0, 800.0, 0.2, 0.15, 0.25),
        "n_prompt_tokens": Saving("prompt tokens", 5000.0, 4500.0, 0.1, 0.05, 0.15),
        "n_steps": Saving("environment steps", 40.0, arm_steps, 1 - arm_steps / 40, 0.1, 0.2),
    }
    n, T, K = 4, 10, 4
    confusion = Confusion(
        n=n,
        zero_var=2,
        cut=cut,
        tp=tp,
        fp=cut - tp,
        precision=tp / cut if cut else NAN,
        recall=tp / 2,
        own_precision=1.0,
        safe=tp * (T - K) / (n * T),
        raw=cut * (T - K) / (n * T),
    )
    match = SeedMatch(8, 7, 7 / 8, True, [Mismatch(0, "g1", 2, 3)])
    return Comparison(
        arm="gated",
        gate={"rule": "r1", "K": 4, "d_L": 0.12},
        n_tasks=n,
        repeats=1,
        confusion=confusion,
        match=match,
        savings=savings,
        ratio=(0.25 / 0.2, 0.1 / 0.2, 0.4 / 0.2),
        task_diff=PairedBootstrap(-2.5, -4.0, -1.0, 0.01, n),
        decomposition={
            "baseline_wall": 40.0,
            "generation": 6.0,
            "environment": 3.0,
            "overhead": 1.0,
        },
    )


def _blocks() -> pl.DataFrame:
    return pl.DataFrame(
        {
            "order": [0, 1, 2, 3],
            "arm": ["baseline", "gated", "gated", "baseline"],
            "repeat": [0, 0, 0, 0],
            "block": [0, 0, 1, 1],
            "groups": [2, 2, 2, 2],
            "wall_s": [12.0, 9.0, 10.0, 8.0],
            "gen_s": [8.0, 6.0, 7.0, 5.0],
            "env_s": [2.0, 1.5, 1.5, 1.5],
            "reset_s": [0.5, 0.5, 0.5, 0.5],
            "overhead_s": [1.5, 1.0, 1.0, 1.0],
            "ticks": [10, 8, 9, 7],
            "mean_batch": [6.0, 5.0, 5.5, 6.5],
            "n_gen_tokens": [500, 380, 420, 500],
            "n_cut": [0, 1, 1, 0],
            "workers": [1, 1, 1, 1],
        }
    )


def test_per_block_savings_pair_the_runs_by_block_not_by_schedule_position():
    got = block_savings_frame(_blocks(), "gated")
    assert got.columns == [
        "repeat",
        "block",
        "baseline_s",
        "baseline_order",
        "gated_s",
        "gated_order",
        "n_cut",
        "saving",
    ]
    assert got["baseline_s"].to_list() == [12.0, 8.0] and got["gated_s"].to_list() == [9.0, 10.0]
    assert got["baseline_order"].to_list() == [0, 3] and got["gated_order"].to_list() == [1, 2]
    assert got["saving"].to_list() == pytest.approx([0.25, -0.25])


def test_the_savings_table_in_words_and_numbers():
    got = savings_frame(_comparison(), _blocks())
    assert got.columns == ["metric", "baseline", "gated", "saving", "95% CI (over)"]
    assert got.rows() == [
        ("wall-clock (s)", "40.00", "30.00", "25.0 %", "[10.0 %, 40.0 %] (2 timed-run pair(s))"),
        ("mean per-task wall-clock (s)", "10.00", "7.50", "-2.50 s", ""),
        ("generated tokens", "1,000", "800", "20.0 %", "[15.0 %, 25.0 %] (tasks)"),
        ("prompt tokens", "5,000", "4,500", "10.0 %", "[5.0 %, 15.0 %] (tasks)"),
        ("environment steps", "40", "34", "15.0 %", "[10.0 %, 20.0 %] (tasks)"),
        ("wall-clock saving per timed block", "", "", "-25.0 % … 25.0 %", "2 block(s)"),
        ("wall-clock saving ÷ token saving", "", "", "1.25", "[0.50, 2.00] (target ≥ 0.9)"),
        ("groups cut (TP / FP by baseline)", "0", "2 (1 / 1)", "", ""),
        ("precision / recall (baseline-judged)", "", "", "0.50 / 0.50", ""),
        ("paper step-based safe / raw saving", "", "", "15.0 % / 30.0 %", ""),
        ("seed match up to K", "", "7/8", "87.5 %", ""),
    ]
    assert savings_frame(_comparison()).height == 10  # without blocks: no per-block row


def test_undefined_numbers_show_as_a_dash_not_nan():
    c = _comparison(cut=0, tp=0)
    none = Saving("generated tokens", 0.0, 0.0, NAN, NAN, NAN)  # a policy without tokens
    c = Comparison(
        **{**c.__dict__, "savings": {**c.savings, "n_gen_tokens": none}, "ratio": (NAN, NAN, NAN)}
    )
    rows = {r[0]: r for r in savings_frame(c).rows()}
    assert rows["generated tokens"] == ("generated tokens", "0", "0", "—", "[—, —] (tasks)")
    assert rows["wall-clock saving ÷ token saving"][3:] == ("—", "[—, —] (target ≥ 0.9)")
    assert rows["precision / recall (baseline-judged)"][3] == "— / 0.00"


def test_confusion_table():
    assert confusion_frame(_comparison()).rows() == [
        ("(task, repeat) pairs", "4"),
        ("zero-variance groups in the baseline arm", "2"),
        ("groups cut", "2"),
        ("TP (cut, baseline zero-variance)", "1"),
        ("FP (cut, baseline has variance)", "1"),
        ("precision TP / cut", "0.500"),
        ("recall TP / zero-variance", "0.500"),
        ("precision by the arm's own truncated rewards (wrong; for contrast)", "1.000"),
        ("paper safe saving TP·(T−K)/(N·T)", "15.0 %"),
        ("paper raw saving cut·(T−K)/(N·T)", "30.0 %"),
        ("measured env-step saving", "15.0 %"),
    ]


def test_an_arm_that_cut_nothing_and_took_the_same_steps_is_called_an_a_a_test():
    blocks = _blocks()
    per_block = block_savings_frame(blocks, "gated")
    assert not same_work(_comparison())
    text = drift_text(_comparison(), per_block)
    assert text.startswith("Wall-clock saving per timed block ranges from -25.0 % to 25.0 %.")
    assert "[10.0 %, 40.0 %] over 2 timed-run pair(s)" in text
    assert "cut no group" not in text
    # why the pairs, not the tasks, are the samples: in the doc section the report links to
    assert "the wall-clock interval is computed over the timed-run pairs" in linked_docs(text)
    idle = _comparison(cut=0, tp=0, arm_steps=40.0)
    assert same_work(idle)
    assert (
        "**The gate cut no group**: both arms did identical work (1,000 generated tokens"
        in drift_text(idle, per_block)
    )
    skipped = _comparison(cut=0, tp=0, arm_steps=36.0)  # no cut, but fewer steps (a GRESO skip)
    assert not same_work(skipped)


def test_blocks_table_keeps_the_schedule_columns_and_only_the_optional_ones_present():
    blocks = _blocks().with_columns(pl.lit(0).alias("extra_rounds"), pl.lit("x").alias("note"))
    got = blocks_frame(blocks)
    assert got.columns == [
        "order",
        "arm",
        "repeat",
        "block",
        "groups",
        "wall_s",
        "gen_s",
        "env_s",
        "reset_s",
        "overhead_s",
        "ticks",
        "mean_batch",
        "n_gen_tokens",
        "n_cut",
        "extra_rounds",
        "workers",
    ]
    assert got["arm"].to_list() == ["baseline", "gated", "gated", "baseline"]


def test_arms_table_formats_each_arm_by_what_it_did():
    base = {
        "gate": False,
        "cuts": 0,
        "cut_tp": 0,
        "cut_fp": 0,
        "greso": False,
        "skipped": 0,
        "skip_tp": 0,
        "skip_fp": 0,
        "dapo": False,
        "extra_rounds": 0,
        "extra_groups": 0,
        "cap_hits": 0,
        "traj_compared": None,
        "traj_matched": None,
        "useful_per_s_vs_baseline": None,
        "wall_vs_baseline": None,
    }
    arms = pl.DataFrame(
        [
            {
                **base,
                "arm": "baseline",
                "wall_s": 40.0,
                "gen_tokens": 12345,
                "groups": 4,
                "useful_groups": 2,
                "useful_per_s": 2 / 40,
            },
            {
                **base,
                "arm": "gated",
                "wall_s": 30.0,
                "gen_tokens": 9876,
                "groups": 4,
                "useful_groups": 2,
                "useful_per_s": 2 / 30,
                "useful_per_s_vs_baseline": 4 / 3,
                "wall_vs_baseline": 0.75,
                "gate": True,
                "cuts": 2,
                "cut_tp": 1,
                "cut_fp": 1,
                "traj_compared": 8,
                "traj_matched": 7,
            },
            {
                **base,
                "arm": "dapo",
                "wall_s": 50.0,
                "gen_tokens": 15000,
                "groups": 7,
                "useful_groups": 4,
                "useful_per_s": 4 / 50,
                "useful_per_s_vs_baseline": 1.6,
                "wall_vs_baseline": 1.25,
                "dapo": True,
                "extra_rounds": 2,
                "extra_groups": 3,
                "cap_hits": 1,
            },
        ]
    )
    got = arms_view(arms)
    assert got.columns[0] == "arm" and got.columns[-1] == "seed match"
    assert got.rows() == [
        ("baseline", "40.00", "12,345", "4", "2", "0.050", "", "—", "—", "—", ""),
        (
            "gated",
            "30.00",
            "9,876",
            "4",
            "2",
            "0.067",
            "1.33× / 0.75×",
            "2 (1 / 1)",
            "—",
            "—",
            "7/8",
        ),
        ("dapo", "50.00", "15,000", "7", "4", "0.080", "1.60× / 1.25×", "—", "—", "2 / 3, 1", ""),
    ]


def test_the_arms_paragraph_gives_the_settings_and_cap_hits_and_links_what_the_columns_count():
    config = AbRolloutConfig(
        groups=4, repeats=2, seed=3, dapo_max_rounds=2, greso_p_explore=0.25, policy="expert"
    )
    arms = pl.DataFrame(
        {
            "arm": ["baseline", "dapo", "greso"],
            "dapo": [False, True, False],
            "greso": [False, False, True],
            "cap_hits": [0, 1, 0],
        }
    )
    text = arms_text(config, arms)
    assert text.startswith("Totals over 2 repeat(s) of 4 tasks per arm;")
    assert "**dapo**: DAPO, at most 2 extra round(s) a block." in text
    assert "**1 timed block(s) hit the cap** (`--dapo-max-rounds 2`)" in text
    assert "**GRESO**: p = 0.25, seed 3, no `--greso-history`: an optimistic GRESO" in text
    # what the columns count, and why a GRESO without a history is optimistic: the doc linked
    docs = linked_docs(text)
    assert "useful groups per second" in docs and "optimistic GRESO" in docs
    no_cap = arms.with_columns(pl.lit(0).alias("cap_hits"))
    assert "hit the cap" not in arms_text(config, no_cap)


def test_method_names_the_abba_order_and_the_settings():
    config = AbRolloutConfig(
        groups=4,
        G=4,
        T_max=10,
        seed=3,
        repeats=1,
        blocks=2,
        concurrency=16,
        warmup=False,
        n_boot=200,
        policy="expert",
    )
    text = method_text(config, _blocks().drop("workers"))
    assert text.startswith(
        "Both arms roll the same 4 tasks of `eval` (small rooms) (G=4, T_max=10,"
    )
    assert "seed 3) through the same batched engine at concurrency 16 trajectories" in text
    assert "run order: B G G B (ABBA over blocks)" in text
    assert "No warm-up (--no-warmup)." in text and "(200 resamples" in text
    assert "Ray workers" not in text
    ray = method_text(config, _blocks().with_columns(pl.lit(2).alias("workers")))
    assert "went through 2 Ray workers (`--workers 2`)" in ray
    # how the tasks are matched, the wall-clock attributed and the intervals computed: the doc
    docs = linked_docs(text)
    assert "(`srollout.rollout.seeding`), never from" in docs
    assert "**attribute** each run's measured wall-clock to its tasks" in docs
    assert "R · exp(±t_{P−1} · sd(l) / √P)" in docs
    assert "Its per-task charges are worker-seconds" in linked_docs(ray)


def test_seed_match_lists_the_first_mismatches_and_links_to_their_causes():
    text = _mismatch_text(_comparison())
    assert text.startswith(
        "7 of 8 gated-arm trajectories (87.5 %) are identical to their baseline twin up to step K "
        "in actions, raw responses and token ids: [docs/ab-rollout.md"
    )
    assert text.endswith("**1 differ** — first: g1/2 (repeat 0, step 3).")
    assert "sampling that depends on the batch a row shares" in linked_docs(text)
