"""Scoring of a matched-seed A/B run (``srollout ab-rollout``): pure functions of its tables (Polars
DataFrames in, NamedTuples out: ab.parquet's rows, columns in ``srollout.schemas.AB``, and
blocks.parquet), so every number of the report can be checked on a table made by hand
(tests/unit/test_ab_scoring.py). Cuts are judged by the *baseline* arm's outcome of the same task
and seeds, never by the arm's own truncated rewards. What each number means: docs/ab-rollout.md.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np
import polars as pl

BASELINE = "baseline"


def attribute_wall(
    gen_s: np.ndarray, env_s: np.ndarray, reset_s: np.ndarray, n_steps: np.ndarray, wall_s: float
) -> tuple[np.ndarray, np.ndarray]:
    """Charge one batched run's wall-clock to its groups: (wall_s [N], overhead [N]) per group, as
    docs/ab-rollout.md ("Per-task wall-clock") says. gen_s / env_s / reset_s / n_steps: [N] per
    group; wall_s: the run's measured wall-clock. Overhead goes evenly when no group took a step.
    """
    base = gen_s + env_s + reset_s
    rest = wall_s - float(base.sum())
    steps = n_steps.astype(np.float64)
    share = (
        steps / steps.sum() if steps.sum() > 0 else np.full(len(steps), 1.0 / max(len(steps), 1))
    )
    overhead = rest * share
    return base + overhead, overhead


class Confusion(NamedTuple):
    """Cuts of one arm judged by the baseline arm (pooled over repeats; each number as
    docs/ab-rollout.md's "What the report says" defines it). n: (task, repeat) pairs; zero_var:
    of them, baseline groups with σ_r = 0; precision and recall nan without cuts or
    zero-variance groups; own_precision: judged by the arm's own truncated rewards."""

    n: int
    zero_var: int
    cut: int
    tp: int
    fp: int
    precision: float
    recall: float
    own_precision: float
    safe: float
    raw: float


def judge_cuts(arm_rows: pl.DataFrame, T_max: int) -> Confusion:
    """Confusion of an arm's rows of ab.parquet (columns cut, cut_step, zero_var,
    baseline_zero_var)."""
    n = arm_rows.height
    cut = arm_rows.filter(pl.col("cut"))
    tp_rows = cut.filter(pl.col("baseline_zero_var"))
    n_cut, tp = cut.height, tp_rows.height
    zero = int(arm_rows["baseline_zero_var"].sum())
    own_tp = int(cut["zero_var"].sum())

    def post_K(rows: pl.DataFrame) -> float:
        return float((T_max - rows["cut_step"]).sum()) / (n * T_max) if rows.height else 0.0

    return Confusion(
        n=n,
        zero_var=zero,
        cut=n_cut,
        tp=tp,
        fp=n_cut - tp,
        precision=tp / n_cut if n_cut else math.nan,
        recall=tp / zero if zero else math.nan,
        own_precision=own_tp / n_cut if n_cut else math.nan,
        safe=post_K(tp_rows),
        raw=post_K(cut),
    )


def tokens_through_step(token_ids: Sequence[int], action_mask: Sequence[bool], k: int) -> list[int]:
    """The token ids up to the end of the k-th response (the k-th run of generated tokens in
    ``action_mask``); all of them when the trajectory has fewer responses."""
    runs = 0
    for i, m in enumerate(action_mask):
        if m and (i + 1 == len(action_mask) or not action_mask[i + 1]):
            runs += 1
            if runs == k:
                return list(token_ids[: i + 1])
    return list(token_ids)


class Mismatch(NamedTuple):
    """A gated trajectory that differs from its baseline twin before step K: the first step
    whose action or response differs (None when only the token ids differ)."""

    repeat: int
    group_id: str
    traj_idx: int
    step: int | None


class SeedMatch(NamedTuple):
    """The proof that both arms drew the same samples: n_traj gated trajectories compared with their
    baseline twins up to step K (the group's cut step, or the gate's K; a trajectory the
    trajectory gate stopped, up to its stop; fewer if they ended earlier); n_match identical in
    actions, responses, the observations the environment answered (a game that draws its own
    randomness must have drawn the same) and generated token ids; ``tokens_checked`` False when
    the policy records no token ids (non-LLM policies)."""

    n_traj: int
    n_match: int
    share: float
    tokens_checked: bool
    mismatches: list[Mismatch]


def seed_match(
    base: dict[str, pl.DataFrame], arm: dict[str, pl.DataFrame], gate_K: int, repeat: int = 0
) -> SeedMatch:
    """Compare the gated arm's trajectories with the baseline's (same repeat); ``base``/``arm``:
    table name -> DataFrame of the steps, trajectories and groups tables."""
    cut_step = dict(zip(arm["groups"]["group_id"], arm["groups"]["cut_step"], strict=True))

    def per_traj(steps: pl.DataFrame) -> dict[tuple[str, int], list[tuple[Any, ...]]]:
        out: dict[tuple[str, int], list[tuple[Any, ...]]] = {}
        cols = ["step", "action", "response", "observation"]
        cols = [c for c in cols if c in steps.columns]
        for gid, ti, *row in (
            steps.sort("group_id", "traj_idx", "step")
            .select("group_id", "traj_idx", *cols)
            .iter_rows()
        ):
            out.setdefault((gid, ti), []).append(tuple(row))
        return out

    bs, gs = per_traj(base["steps"]), per_traj(arm["steps"])
    btok = {
        (g, i): (t, m)
        for g, i, t, m in base["trajectories"]
        .select("group_id", "traj_idx", "token_ids", "action_mask")
        .iter_rows()
    }
    tokens_checked = any(len(t) for t, _ in btok.values())
    mismatches = []
    n = 0
    trajs = arm["trajectories"]
    if "ended_by" not in trajs.columns:  # a table without it: nothing was stalled
        trajs = trajs.with_columns(ended_by=pl.lit(None, pl.Utf8), n_steps=pl.lit(None, pl.Int64))
    columns = ("group_id", "traj_idx", "token_ids", "action_mask", "ended_by", "n_steps")
    for gid, ti, tok, mask, ended_by, n_steps in trajs.select(columns).iter_rows():
        n += 1
        k = cut_step.get(gid) or gate_K
        if ended_by == "stalled":  # the trajectory gate stopped it: the same up to its stop
            k = min(k, n_steps)
        mine, twin = gs.get((gid, ti), [])[:k], bs.get((gid, ti), [])[:k]
        if mine != twin:
            first = next(
                (a[0] for a, b in zip(mine, twin, strict=False) if a != b),
                min(len(mine), len(twin)) + 1,
            )
            mismatches.append(Mismatch(repeat, gid, ti, first))
        elif tokens_checked and tokens_through_step(tok, mask, k) != tokens_through_step(
            *btok[(gid, ti)], k
        ):
            mismatches.append(Mismatch(repeat, gid, ti, None))
    return SeedMatch(
        n,
        n - len(mismatches),
        (n - len(mismatches)) / n if n else math.nan,
        tokens_checked,
        mismatches,
    )


class StopJudgment(NamedTuple):
    """An arm's trajectory-gate stops judged by their baseline twins (same task and seeds, so the
    same prefix): tp = the twin failed (the stop was right), fp = the twin succeeded."""

    stops: int
    tp: int
    fp: int


def judge_stops(base_trajs: pl.DataFrame, arm_trajs: pl.DataFrame) -> StopJudgment:
    """Judge the arm's stalled trajectories (``ended_by == "stalled"``) by the success of their
    baseline twins (the same group_id and traj_idx); stops without a twin count in neither."""
    keys = ["group_id", "traj_idx"]
    stopped = arm_trajs.filter(pl.col("ended_by") == "stalled").select(keys)
    twins = stopped.join(base_trajs.select(*keys, "success"), on=keys, how="inner")
    tp = int((~twins["success"]).sum())
    return StopJudgment(stopped.height, tp, twins.height - tp)


def with_seed_match(table: pl.DataFrame, comparisons: Sequence[Any], G: int) -> pl.DataFrame:
    """``table`` plus ``n_traj_matched``: per row of a compared arm (``comparisons``: objects with
    ``arm`` and ``match``, a Comparison or an ArmMatch), how many of the group's G trajectories are
    identical to their baseline twin up to K; null on baseline rows, on GRESO-skipped tasks and on
    DAPO's extra groups (no twin)."""
    missed: dict[tuple[str, int, str], int] = {}
    for c in comparisons:
        for m in c.match.mismatches:
            key = (c.arm, m.repeat, m.group_id)
            missed[key] = missed.get(key, 0) + 1
    compared = {c.arm for c in comparisons}
    twinless = (pl.col("skipped") if "skipped" in table.columns else pl.lit(False)) | (
        (pl.col("dapo_round") > 0) if "dapo_round" in table.columns else pl.lit(False)
    )
    rows = table.select(
        "arm", "repeat", "group_id", twinless.fill_null(False).alias("twinless")
    ).iter_rows()
    values = [
        None
        if arm == BASELINE or arm not in compared or alone
        else G - missed.get((arm, r, gid), 0)
        for arm, r, gid, alone in rows
    ]
    return table.with_columns(pl.Series("n_traj_matched", values, dtype=pl.Int64))


class ArmMatch(NamedTuple):
    """The seed-match proof of an arm that gets no Comparison (a DAPO arm: its groups with a
    baseline twin, i.e. the A/B's own tasks)."""

    arm: str
    match: SeedMatch


class Saving(NamedTuple):
    """One cost in both arms: totals over tasks (each task's mean over repeats), the share saved
    1 − arm/baseline, and its CI, over tasks or timed-run pairs as ``ci_over`` says (why which:
    docs/ab-rollout.md, "What the report says")."""

    metric: str
    baseline: float
    arm: float
    saving: float
    low: float
    high: float
    ci_over: str = "tasks"


SAVED_COSTS = (
    ("wall_s", "wall-clock (s)"),
    ("n_gen_tokens", "generated tokens"),
    ("n_prompt_tokens", "prompt tokens"),
    ("n_steps", "environment steps"),
)


@dataclass(frozen=True)
class Comparison:
    """Everything the report says about one arm against the baseline (docs/ab-rollout.md, "What
    the report says"): savings, metric -> Saving; ratio, (estimate, low, high) of wall-clock
    saving ÷ generated-token saving; task_diff, the paired bootstrap of the mean per-task
    wall-clock, arm − baseline (s); decomposition, the seconds saved by source and the baseline
    wall they are shares of."""

    arm: str
    gate: dict[str, Any] | None
    n_tasks: int
    repeats: int
    confusion: Confusion
    match: SeedMatch
    savings: dict[str, Saving]
    ratio: tuple[float, float, float]
    task_diff: Any
    decomposition: dict[str, float]

    def headline(self) -> dict[str, Any]:
        """The numbers the manifest keeps."""
        return {
            "arm": self.arm,
            "gate": self.gate,
            "n_tasks": self.n_tasks,
            "repeats": self.repeats,
            "confusion": self.confusion._asdict(),
            "seed_match": {
                "n_traj": self.match.n_traj,
                "n_match": self.match.n_match,
                "share": self.match.share,
            },
            "savings": {k: v._asdict() for k, v in self.savings.items()},
            "wall_over_token_saving": list(self.ratio),
            "mean_task_wall_diff_s": self.task_diff._asdict(),
            "decomposition_s": self.decomposition,
        }


def per_task_means(table: pl.DataFrame, arm: str) -> pl.DataFrame:
    """One row per task of ``arm``: each cost's mean over repeats, in group order."""
    cols = (*(c for c, _ in SAVED_COSTS), "gen_s", "env_s", "reset_s", "overhead_s")
    return (
        table.filter(pl.col("arm") == arm)
        .group_by("group_index", "group_id", "task_id")
        .agg(pl.col(c).cast(pl.Float64).mean() for c in cols)
        .sort("group_index")
    )


def compare_arms(
    table: pl.DataFrame,
    blocks: pl.DataFrame,
    arm: str,
    match: SeedMatch,
    *,
    gate: dict[str, Any] | None,
    T_max: int,
    repeats: int,
    n_boot: int,
    seed: int,
) -> Comparison:
    """Score ``arm`` against the baseline: savings with CIs (wall-clock over the timed-run pairs
    of ``blocks``, counts over tasks, ``n_boot`` resamples seeded by ``seed``), the cuts judged by
    the baseline (:func:`judge_cuts` at ``T_max``), and ``match``, the arm's seed-match proof
    over every repeat. ``gate``: the arm's gate as the report describes it (None without one)."""
    from srollout.core.stats import paired_bootstrap, relative_saving_ci, run_pair_saving_ci

    b, a = per_task_means(table, BASELINE), per_task_means(table, arm)
    savings = {}
    for col, label in SAVED_COSTS:
        if float(b[col].sum()) > 0:
            ci = relative_saving_ci(
                b[col].to_numpy(), a[col].to_numpy(), n_resamples=n_boot, seed=seed
            )
            savings[col] = Saving(
                label, float(b[col].sum()), float(a[col].sum()), ci.estimate, ci.low, ci.high
            )
        else:  # a non-LLM policy generates no tokens: no saving share is defined
            savings[col] = Saving(label, 0.0, float(a[col].sum()), math.nan, math.nan, math.nan)
    runs = run_pairs(blocks, arm)
    wall = savings["wall_s"]
    rp = run_pair_saving_ci(runs["baseline_s"].to_numpy(), runs["arm_s"].to_numpy())
    savings["wall_s"] = wall._replace(
        low=rp.low, high=rp.high, ci_over=f"{rp.n_pairs} timed-run pair(s)"
    )
    tok = savings["n_gen_tokens"].saving
    ratio = (
        (wall.saving / tok, rp.low / tok, rp.high / tok)
        if tok > 0
        else (math.nan, math.nan, math.nan)
    )
    diff = paired_bootstrap(
        b["wall_s"].to_numpy(), a["wall_s"].to_numpy(), n_resamples=n_boot, seed=seed
    )
    decomposition = {
        "baseline_wall": float(b["wall_s"].sum()),
        "generation": float(b["gen_s"].sum() - a["gen_s"].sum()),
        "environment": float((b["env_s"] + b["reset_s"]).sum() - (a["env_s"] + a["reset_s"]).sum()),
        "overhead": float(b["overhead_s"].sum() - a["overhead_s"].sum()),
    }
    return Comparison(
        arm=arm,
        gate=gate,
        n_tasks=b.height,
        repeats=repeats,
        confusion=judge_cuts(table.filter(pl.col("arm") == arm), T_max),
        match=match,
        savings=savings,
        ratio=ratio,
        task_diff=diff,
        decomposition=decomposition,
    )


def merge_matches(matches: Sequence[SeedMatch]) -> SeedMatch:
    """The seed-match proofs of several repeats as one (counts summed, mismatches in order)."""
    n_traj = sum(m.n_traj for m in matches)
    n_match = sum(m.n_match for m in matches)
    return SeedMatch(
        n_traj,
        n_match,
        n_match / n_traj if n_traj else math.nan,
        any(m.tokens_checked for m in matches),
        [x for m in matches for x in m.mismatches],
    )


def run_pairs(blocks: pl.DataFrame, arm: str) -> pl.DataFrame:
    """Per (repeat, block), the baseline's and ``arm``'s timed runs of the same groups:
    repeat, block, baseline_s, arm_s (machine-seconds: wall-clock × workers)."""

    def runs(name: str, col: str) -> pl.DataFrame:
        return blocks.filter(pl.col("arm") == name).select(
            "repeat", "block", (pl.col("wall_s") * pl.col("workers")).alias(col)
        )

    return (
        runs(BASELINE, "baseline_s")
        .join(runs(arm, "arm_s"), on=["repeat", "block"])
        .sort("repeat", "block")
    )
