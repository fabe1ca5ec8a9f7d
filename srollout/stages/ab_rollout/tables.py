"""The A/B's tables from its files: ab.parquet (one row per (task, arm, repeat)), blocks.parquet
(one row per timed run), arms.parquet (one row per arm), and each arm's seed-match proof.

These read the merged collect-format tables and the ``block-<b>.json`` files the timed runs left;
the scoring itself (attribution, confusion, savings, seed match) is pure and lives in
:mod:`srollout.core.ab_scoring`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from srollout.config import AbRolloutConfig
from srollout.core.ab_scoring import (
    BASELINE,
    SeedMatch,
    StopJudgment,
    attribute_wall,
    judge_stops,
    merge_matches,
    seed_match,
)
from srollout.core.arms import ArmSpec, arm_summary
from srollout.stages.ab_rollout.audit import AUDIT_BLOCK_COLUMNS, AUDIT_DTYPES, arm_audit_totals
from srollout.stages.ab_rollout.schedule import Block

# the columns ab.parquet gained with --arms; written last (after n_traj_matched) so the older
# columns keep their place
ARMS_AB_COLUMNS = ("skipped", "dapo_round", "useful")


def blocks_table(schedule: Sequence[Block], block_jsons: Sequence[dict[str, Any]]) -> pl.DataFrame:
    """One row per timed run (schedule order): the engine's totals (summed over DAPO's rounds),
    ``workers``, and what the arms did (GRESO's skips, DAPO's extra groups and rounds, useful
    groups); with ``--audit``, each gated arm's audit (:data:`AUDIT_BLOCK_COLUMNS`, null on the
    others). Columns: docs/artifacts.md."""
    audited = any("audit" in data for data in block_jsons)
    rows = []
    for b, data in zip(schedule, block_jsons, strict=True):
        rounds = data.get("rounds", [])
        rows.append(
            {
                "order": b.order,
                "arm": b.arm.name,
                "repeat": b.repeat,
                "block": b.block,
                "groups": len(b.specs),
                **data["summary"],
                "workers": data.get("workers", 1),
                "n_skipped": len(data.get("skipped_ids", [])),
                "n_extra": sum(len(rd["group_ids"]) for rd in rounds[1:]),
                "extra_rounds": max(len(rounds) - 1, 0),
                "hit_cap": bool(data.get("hit_cap", False)),
                "n_useful": data.get("n_useful"),
                **(
                    {c: data.get("audit", {}).get(c) for c in AUDIT_BLOCK_COLUMNS}
                    if audited
                    else {}
                ),
            }
        )
    return pl.DataFrame(rows, schema_overrides=AUDIT_DTYPES if audited else None)


# --- scoring: pure functions of the tables --------------------------------------------------------


def ab_table(
    tables: dict[tuple[str, int], dict[str, Path]],
    blocks: pl.DataFrame,
    schedule: Sequence[Block],
    block_jsons: Sequence[dict[str, Any]] | None = None,
) -> pl.DataFrame:
    """ab.parquet: one row per (task, arm, repeat), costs attributed per block (docs/ab-rollout.md),
    and for every arm the baseline's outcome of the same task, seeds and repeat; a DAPO arm's extra
    groups (``dapo_round`` >= 1) and a GRESO arm's skipped tasks (zero cost) have rows too. A run's
    rows sum to ``workers`` × its wall-clock. block_jsons: the block-<b>.json contents in schedule
    order (None: every block rolled its tasks in one round, nothing skipped)."""
    block_jsons = (
        block_jsons
        if block_jsons is not None
        else [{"group_ids": [s.group_id for s in b.specs]} for b in schedule]
    )
    # (arm, repeat, group) -> (block, round)
    where: dict[tuple[str, int, str], tuple[int, int]] = {}
    skipped_rows = []
    for b, data in zip(schedule, block_jsons, strict=True):
        for rd in data.get("rounds") or [{"round_index": 0, "group_ids": data["group_ids"]}]:
            for gid in rd["group_ids"]:
                where[(b.arm.name, b.repeat, gid)] = (b.block, rd["round_index"])
        skipped = set(data.get("skipped_ids", []))
        skipped_rows += [
            {
                "task_id": s.task.task_id,
                "task_type": s.task.task_type,
                "group_id": s.group_id,
                "group_index": s.index,
                "arm": b.arm.name,
                "repeat": b.repeat,
                "block": b.block,
                "order": b.order,
                "dapo_round": 0,
                "skipped": True,
                "cut": False,
                **dict.fromkeys(("n_steps", "n_gen_tokens", "n_prompt_tokens"), 0),
                **dict.fromkeys(("gen_s", "env_s", "reset_s", "overhead_s"), 0.0),
                "wall_s_attributed": 0.0,
            }
            for s in b.specs
            if s.group_id in skipped
        ]
    frames = []
    for (arm, r), paths in tables.items():
        g = pl.read_parquet(paths["groups"]).with_columns(
            pl.lit(arm).alias("arm"), pl.lit(r, pl.Int64).alias("repeat")
        )
        places = [where[(arm, r, gid)] for gid in g["group_id"]]
        g = g.with_columns(
            pl.Series("block", [p[0] for p in places], dtype=pl.Int64),
            pl.Series("dapo_round", [p[1] for p in places], dtype=pl.Int64),
            pl.lit(False).alias("skipped"),
        )
        frames.append(g)
    groups = pl.concat(frames, how="vertical")
    out = []
    for row in blocks.iter_rows(named=True):
        part = groups.filter(
            (pl.col("arm") == row["arm"])
            & (pl.col("repeat") == row["repeat"])
            & (pl.col("block") == row["block"])
        )
        capacity = float(row["wall_s"]) * int(row.get("workers") or 1)
        wall, overhead = attribute_wall(
            *(
                part[c].to_numpy().astype(np.float64)
                for c in ("gen_s", "env_s", "reset_s", "n_steps")
            ),
            capacity,
        )
        out.append(
            part.with_columns(
                pl.Series("wall_s_attributed", wall, dtype=pl.Float64),
                pl.Series("overhead_s", overhead, dtype=pl.Float64),
                pl.lit(row["order"], pl.Int64).alias("order"),
            )
        )
    df = pl.concat(out, how="vertical")
    if skipped_rows:
        df = pl.concat([df, pl.DataFrame(skipped_rows)], how="diagonal_relaxed")
    base = df.filter(pl.col("arm") == BASELINE).select(
        "group_id",
        "repeat",
        pl.col("zero_var").alias("baseline_zero_var"),
        pl.col("label").alias("baseline_label"),
    )
    df = df.join(base, on=["group_id", "repeat"], how="left")
    return df.select(
        "task_id",
        "task_type",
        "group_id",
        "group_index",
        "arm",
        "repeat",
        "block",
        "order",
        "cut",
        "cut_step",
        "gate_K",
        "n_steps",
        "n_gen_tokens",
        "n_prompt_tokens",
        "gen_s",
        "env_s",
        "reset_s",
        "overhead_s",
        pl.col("wall_s_attributed").alias("wall_s"),
        pl.col("wall_s").alias("group_wall_s"),
        "reward_mean",
        "reward_var",
        "zero_var",
        "label",
        "success_rate",
        "baseline_zero_var",
        "baseline_label",
        (pl.col("cut") & pl.col("baseline_zero_var")).alias("tp"),
        (pl.col("cut") & ~pl.col("baseline_zero_var")).alias("fp"),
        "skipped",
        "dapo_round",
        (~pl.col("skipped") & ~pl.col("cut") & ~pl.col("zero_var"))
        .fill_null(False)
        .alias("useful"),
        # --audit: the cut ran on to T_max (its own outcome is then full, not truncated)
        *([pl.col("audited").fill_null(False)] if "audited" in df.columns else []),
    ).sort("group_index", "arm", "repeat")


def arm_seed_match(
    tables: dict[tuple[str, int], dict[str, Path]], arm: ArmSpec, config: AbRolloutConfig
) -> SeedMatch:
    """:func:`seed_match` of ``arm`` against the baseline over every repeat, on the arm's groups
    that have a baseline twin (GRESO-skipped tasks have no trajectories; DAPO's extra groups no
    twin)."""
    names = ("steps", "trajectories", "groups")
    matches = []
    for r in range(config.repeats):
        base = {name: pl.read_parquet(tables[(BASELINE, r)][name]) for name in names}
        ids = base["groups"]["group_id"]
        mine = {
            name: pl.read_parquet(tables[(arm.name, r)][name]).filter(
                pl.col("group_id").is_in(ids.to_list())
            )
            for name in names
        }
        matches.append(seed_match(base, mine, arm.gate_K or config.T_max, repeat=r))
    return merge_matches(matches)


def arm_stops(
    tables: dict[tuple[str, int], dict[str, Path]], arm: ArmSpec, config: AbRolloutConfig
) -> StopJudgment:
    """The arm's trajectory-gate stops over every repeat, judged by their baseline twins
    (:func:`srollout.core.ab_scoring.judge_stops`)."""
    judged = [
        judge_stops(
            pl.read_parquet(tables[(BASELINE, r)]["trajectories"]),
            pl.read_parquet(tables[(arm.name, r)]["trajectories"]),
        )
        for r in range(config.repeats)
    ]
    return StopJudgment(*(sum(j[i] for j in judged) for i in range(3)))


def arms_table(
    table: pl.DataFrame,
    blocks: pl.DataFrame,
    arms: Sequence[ArmSpec],
    matches: dict[str, SeedMatch],
    config: AbRolloutConfig,
    stops: dict[str, StopJudgment] | None = None,
) -> pl.DataFrame:
    """arms.parquet: one row per arm, totals over every repeat, from ab.parquet (``table``) and
    blocks.parquet (``blocks``); the columns are docs/artifacts.md's ("arms.parquet — one row per
    arm"). Cuts, skips and stops are judged by the baseline's group of the same task (DAPO's extra
    groups have no twin and count in neither); with ``--audit``, the audit's totals of each gated
    arm (:func:`arm_audit_totals`)."""
    audited = config.audit > 0 and "audited" in blocks.columns
    rows = []
    for arm in arms:
        mine = table.filter(pl.col("arm") == arm.name)
        runs = blocks.filter(pl.col("arm") == arm.name)
        total = arm_summary(
            [
                {"iter_s": w, "n_gen_tokens": t, "n_useful": u or 0}
                for w, t, u in runs.select("wall_s", "n_gen_tokens", "n_useful").iter_rows()
            ]
        )
        twins = mine.filter(pl.col("baseline_zero_var").is_not_null())
        cut, skipped = twins.filter(pl.col("cut")), mine.filter(pl.col("skipped"))
        match = matches.get(arm.name)
        stop = (stops or {}).get(arm.name, StopJudgment(0, 0, 0))
        rows.append(
            {
                "arm": arm.name,
                "gate": arm.gate,
                "stall": arm.stall,
                "dapo": arm.dapo,
                "greso": arm.greso,
                "repeats": config.repeats,
                "n_tasks": config.groups,
                "groups": mine.filter(~pl.col("skipped")).height,
                "wall_s": total["wall_s"],
                "gen_tokens": total["gen_tokens"],
                "n_steps": int(mine["n_steps"].sum()),
                "useful_groups": total["useful"],
                "useful_per_s": total["useful_per_s"],
                "wall_vs_baseline": math.nan,  # the two ratios: set below, once all rows exist
                "useful_per_s_vs_baseline": math.nan,
                "cuts": int(mine["cut"].sum()),
                "cut_tp": int(cut["baseline_zero_var"].sum()),
                "cut_fp": int((~cut["baseline_zero_var"]).sum()),
                "skipped": skipped.height,
                "skip_tp": int(skipped["baseline_zero_var"].sum()),
                "skip_fp": int((~skipped["baseline_zero_var"]).sum()),
                "extra_groups": int(runs["n_extra"].sum()),
                "extra_rounds": int(runs["extra_rounds"].sum()),
                "cap_hits": int(runs["hit_cap"].sum()),
                "traj_compared": match.n_traj if match is not None else None,
                "traj_matched": match.n_match if match is not None else None,
                "stalls": stop.stops,
                "stall_tp": stop.tp,
                "stall_fp": stop.fp,
            }
        )
        if audited:  # the audit's totals (null on an arm without a gate)
            rows[-1].update(
                arm_audit_totals(runs.sort("order").to_dicts() if arm.gate or arm.stall else [])
            )
    df = pl.DataFrame(
        rows,
        schema_overrides={
            "traj_compared": pl.Int64,
            "traj_matched": pl.Int64,
            **(AUDIT_DTYPES if audited else {}),
        },
    )
    base = df.filter(pl.col("arm") == BASELINE).row(0, named=True)

    def ratio(col: str) -> pl.Expr:
        return (
            pl.col(col) / base[col] if base[col] and not math.isnan(base[col]) else pl.lit(math.nan)
        )

    return df.with_columns(
        ratio("wall_s").alias("wall_vs_baseline"),
        ratio("useful_per_s").alias("useful_per_s_vs_baseline"),
    )
