"""`srollout ab-rollout`: the matched-seed wall-clock A/B (the paper's Tier 1, §5.1), done so that
it holds up to a reviewer.

The story, top to bottom (:func:`run_ab_rollout`):

1. open the run directory (``--resume`` reopens it and checks the config matches);
2. load the task set and build the groups: group i plays task i, and every trajectory's seeds
   derive from (run seed, i, traj_idx) (:mod:`srollout.rollout.seeding`), so both arms see the
   same games and draw the same samples;
3. build the arms (``baseline``: no gate; ``gated``: the rule or gate.json), the policy and the
   environment factory — one policy object, shared by the arms;
4. warm up before any clock runs: every task's game is loaded once and a throw-away batch (other
   group indices, so other seeds) is rolled for 2 steps;
5. the schedule: R repeats × B blocks of tasks; in each block every arm rolls the block's groups
   through the same batched engine at the same concurrency, arms in ABBA order over blocks (A B |
   B A | ...); each (arm, repeat, block) run is timed alone, its records written after its clock
   stops, its totals saved as ``<arm>/r<repeat>/block-<b>.json`` (what makes ``--resume`` work);
6. merge each (arm, repeat) into steps/trajectories/groups/signals.parquet under ``<arm>/r<repeat>/``
   (each a collect-format buffer ``srollout analyze`` reads);
7. score (:func:`score_ab`): per (task, arm, repeat) costs with each run's wall-clock attributed
   to its tasks, the seed-match proof, cuts judged by the baseline arm's outcome of the same task
   and seeds, savings with paired bootstrap CIs over tasks; ``ab.parquet``, ``report.md``, figures.

Per-task wall-clock (a batched run has no per-task clock): a task is charged its groups' measured
generation time (each tick's ``policy.act`` time split over the tick's rows by generated tokens,
as the engine records it), its own env-step and env-reset times, and a share of the run's
remaining overhead (wall − generation − env) proportional to its env steps. The charges of a run
sum exactly to its measured wall-clock, so the task-bootstrap's point estimate is the measured
saving.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import polars as pl

from srollout.config import PAPER_D_L, PAPER_K, AbRolloutConfig
from srollout.errors import SrolloutError
from srollout.rollout.engine import (
    GroupRecord,
    GroupSpec,
    RolloutSettings,
    TickStats,
    make_specs,
    run_groups,
)

BASELINE = "baseline"
GATED = "gated"
# Warm-up groups get indices far past any run's groups: their seeds and ids never meet the A/B's.
WARMUP_INDEX = 1_000_000
WARMUP_STEPS = 2


# --- arms ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ArmSpec:
    """One arm of the A/B: ``name`` (the value of groups.arm), its gate (None = no gate, the
    baseline) and the step the engine applies it at. Every arm is compared with ``baseline``."""

    name: str
    gate: Any = None
    gate_K: int | None = None

    def settings(self, config: AbRolloutConfig) -> RolloutSettings:
        """The engine settings of this arm: everything but the gate is the same in every arm."""
        return RolloutSettings(
            G=config.G,
            T_max=config.T_max,
            seed=config.seed,
            concurrency=config.concurrency,
            signal_K=tuple(config.signal_K),
            gate=self.gate,
            gate_K=self.gate_K,
            arm=self.name,
        )

    def describe(self) -> dict[str, Any] | None:
        if self.gate is None:
            return None
        as_dict = self.gate.to_dict() if hasattr(self.gate, "to_dict") else {"repr": repr(self.gate)}
        return {**as_dict, "K": self.gate_K}


def gated_arm(config: AbRolloutConfig) -> ArmSpec:
    """The gated arm: --gate gate.json, or rule --rule at (--K, --d-L) (paper default (10, 0.12))."""
    from srollout.core.gate import GateRule, load_gate

    if config.gate is not None:
        gate = load_gate(config.gate)
        K = int(getattr(gate, "K", None) or PAPER_K)
    else:
        K = config.K if config.K is not None else PAPER_K
        gate = GateRule(rule=config.rule, K=K, d_L=config.d_L if config.d_L is not None else PAPER_D_L, t_high=config.t_high)
    if K > config.T_max:
        raise SrolloutError(f"gate K={K} is larger than --T-max {config.T_max}")
    return ArmSpec(GATED, gate, K)


def build_arms(config: AbRolloutConfig) -> tuple[ArmSpec, ...]:
    """The arms in schedule order; the first is the baseline every other arm is judged against."""
    return (ArmSpec(BASELINE), gated_arm(config))


# --- the schedule ---------------------------------------------------------------------------------


class Block(NamedTuple):
    """One timed run: ``arm`` rolls ``specs`` (block ``block`` of repeat ``repeat``); ``order`` is
    its 0-based position in the whole schedule."""

    order: int
    repeat: int
    block: int
    arm: ArmSpec
    specs: tuple[GroupSpec, ...]


def split_blocks(specs: Sequence[GroupSpec], n_blocks: int) -> list[tuple[GroupSpec, ...]]:
    """``specs`` cut into ``n_blocks`` contiguous chunks whose sizes differ by at most one."""
    n = len(specs)
    bounds = [round(i * n / n_blocks) for i in range(n_blocks + 1)]
    return [tuple(specs[bounds[i] : bounds[i + 1]]) for i in range(n_blocks)]


def make_schedule(arms: Sequence[ArmSpec], specs: Sequence[GroupSpec], repeats: int, n_blocks: int) -> list[Block]:
    """Every (repeat, block, arm) run in order: arms forward on even slots, reversed on odd ones
    (slot = repeat · B + block), so with 2 arms the runs go A B | B A | A B | ... (ABBA)."""
    out: list[Block] = []
    for r in range(repeats):
        for b, chunk in enumerate(split_blocks(specs, n_blocks)):
            for arm in arms if (r * n_blocks + b) % 2 == 0 else tuple(reversed(arms)):
                out.append(Block(len(out), r, b, arm, chunk))
    return out


def arm_dir(run_dir: Path, arm: str, repeat: int) -> Path:
    """Where the tables of one (arm, repeat) live: ``<run>/<arm>/r<repeat>/``."""
    return Path(run_dir) / arm / f"r{repeat}"


def block_file(run_dir: Path, block: Block) -> Path:
    return arm_dir(run_dir, block.arm.name, block.repeat) / f"block-{block.block}.json"


# --- the story ------------------------------------------------------------------------------------


class AbResult(NamedTuple):
    """run_dir; paths: output name -> path; comparisons: one per non-baseline arm."""

    run_dir: Path
    paths: dict[str, Path]
    comparisons: list[Any]


def run_ab_rollout(
    config: AbRolloutConfig,
    console: Any = None,
    progress: bool = True,
    *,
    policy: Any = None,
    env_factory: Callable[[], Any] | None = None,
) -> AbResult:
    """Run the A/B as configured; return where the files are and one comparison per gated arm.

    policy / env_factory: roll out with these instead of building them from the config (a test
    wraps a policy to count the rows it is asked to generate).
    """
    from srollout.rollout.parts import merge_parts, write_part
    from srollout.rollout.react import ReactPrompter
    from srollout.rollout.records import group_tables
    from srollout.rundir import Manifest, check_resumable, prepare_run_dir
    from srollout.schemas import write_json
    from srollout.stages.collect import build_env_factory, build_policy, load_tasks

    t0 = time.perf_counter()
    if config.resume and config.out is None:
        raise SrolloutError("--resume needs --out RUN_DIR (the run to continue)")
    # a bad gate.json or task set fails here, before anything is written
    arms = build_arms(config)
    tasks = load_tasks(config.tasks)
    if config.policy == "lm" and config.backend == "vllm" and policy is None:
        from srollout.policy.vllm_backend import require_vllm

        require_vllm()
    # 1. the run directory
    run_dir = prepare_run_dir(config.out, "ab-rollout", overwrite=config.overwrite, resume=config.resume)
    if config.resume:
        check_resumable(run_dir, "ab-rollout", config.resume_key(), "timed blocks")
    manifest = Manifest(run_dir, "ab-rollout", config)

    # 2. groups: the same specs, hence the same seeds, in every arm
    specs = make_specs(tasks, config.groups)
    schedule = make_schedule(arms, specs, config.repeats, config.blocks)
    todo = [b for b in schedule if not block_file(run_dir, b).exists()]
    manifest.update(arms={a.name: a.describe() for a in arms}, n_tasks_in_set=len(tasks), resumed_blocks=len(schedule) - len(todo))

    # 3. policy, environments, protocol
    prompter = ReactPrompter()
    if todo and policy is None:
        policy = build_policy(config)
    env_factory = env_factory or build_env_factory(config)
    manifest.update(policy=getattr(policy, "name", None))

    # 4. warm-up, then 5. the timed runs
    warm_s = warm_up([s.task for s in specs], policy, env_factory, prompter, config) if todo and config.warmup else 0.0
    with _Progress(console, total=sum(len(b.specs) for b in schedule), enabled=progress) as show:
        show.advance(sum(len(b.specs) for b in schedule if b not in todo))
        for block in todo:
            show.start(block)
            records: list[GroupRecord] = []

            def keep(record: GroupRecord, records: list[GroupRecord] = records) -> None:
                records.append(record)
                show.advance(1)

            summary = run_groups(block.specs, policy, env_factory, prompter, block.arm.settings(config), on_group=keep, on_tick=show.tick)
            # written after the clock stopped: disk I/O is no part of either arm's time
            for record in records:
                write_part(arm_dir(run_dir, block.arm.name, block.repeat), record.group_id, group_tables(record))
            write_json({"order": block.order, "repeat": block.repeat, "block": block.block, "arm": block.arm.name,
                        "group_ids": [s.group_id for s in block.specs], "summary": summary._asdict()}, block_file(run_dir, block))

    # 6. one collect-format buffer per (arm, repeat)
    ids = [s.group_id for s in specs]
    tables = {}
    for arm in arms:
        for r in range(config.repeats):
            tables[(arm.name, r)] = merge_parts(arm_dir(run_dir, arm.name, r), ids)

    # 7. score, report
    from srollout.report.ab import write_ab_outputs

    blocks = read_blocks(run_dir, schedule)
    table = ab_table(tables, blocks, schedule)
    comparisons = [compare_arms(table, tables, arm, config) for arm in arms[1:]]
    table = with_seed_match(table, comparisons, config.G)
    paths = write_ab_outputs(run_dir, config, table, blocks, comparisons, tables)
    manifest.data["timings_s"].update(warmup=round(warm_s, 3), timed_runs=round(float(blocks["wall_s"].sum()), 3))
    outputs = [*paths.values(), *(p for t in tables.values() for p in t.values())]
    manifest.complete(outputs, comparisons=[c.headline() for c in comparisons], wall_s_process=round(time.perf_counter() - t0, 3))
    return AbResult(run_dir, paths, comparisons)


def warm_up(tasks: Sequence[Any], policy: Any, env_factory: Callable[[], Any], prompter: Any, config: AbRolloutConfig) -> float:
    """Load every task's game once, then roll one throw-away batch (as many groups as fit in
    ``concurrency``, group indices from WARMUP_INDEX, so other seeds) for WARMUP_STEPS steps.
    Returns the seconds spent. Nothing is recorded."""
    t0 = time.perf_counter()
    env = env_factory()
    try:
        for task in tasks:  # the engine caches parsed games per process: the first arm would pay it alone
            env.reset(task, 0)
    finally:
        env.close()
    n = max(1, min(len(tasks), config.concurrency // config.G))
    specs = [GroupSpec(WARMUP_INDEX + i, tasks[i]) for i in range(n)]
    settings = RolloutSettings(G=config.G, T_max=min(WARMUP_STEPS, config.T_max), seed=config.seed, concurrency=config.concurrency, signal_K=(), arm="warmup")
    run_groups(specs, policy, env_factory, prompter, settings)
    return time.perf_counter() - t0


def read_blocks(run_dir: Path, schedule: Sequence[Block]) -> pl.DataFrame:
    """One row per timed run (schedule order): the engine's totals from its block-<b>.json."""
    rows = []
    for b in schedule:
        data = json.loads(block_file(run_dir, b).read_text())
        rows.append({"order": b.order, "arm": b.arm.name, "repeat": b.repeat, "block": b.block, "groups": len(b.specs), **data["summary"]})
    return pl.DataFrame(rows)


# --- scoring: pure functions of the tables --------------------------------------------------------


def attribute_wall(gen_s: np.ndarray, env_s: np.ndarray, reset_s: np.ndarray, n_steps: np.ndarray, wall_s: float) -> tuple[np.ndarray, np.ndarray]:
    """Charge one batched run's wall-clock to its groups: (wall_s per group [N], overhead per group [N]).

    gen_s / env_s / reset_s: [N] measured seconds per group (generation already split by tokens);
    n_steps: [N] env steps per group; wall_s: the run's measured wall-clock. The rest
    (wall − Σ gen − Σ env − Σ reset: batching, parsing, signals, the gate) is shared in proportion
    to env steps (evenly if no steps). The result sums to ``wall_s``.
    """
    base = gen_s + env_s + reset_s
    rest = wall_s - float(base.sum())
    steps = n_steps.astype(np.float64)
    share = steps / steps.sum() if steps.sum() > 0 else np.full(len(steps), 1.0 / max(len(steps), 1))
    overhead = rest * share
    return base + overhead, overhead


def ab_table(tables: dict[tuple[str, int], dict[str, Path]], blocks: pl.DataFrame, schedule: Sequence[Block]) -> pl.DataFrame:
    """ab.parquet: one row per (task, arm, repeat), costs attributed per block (see module doc),
    and for every arm the baseline's outcome of the same task, seeds and repeat."""
    block_of = {(b.arm.name, b.repeat, s.group_id): b.block for b in schedule for s in b.specs}
    frames = []
    for (arm, r), paths in tables.items():
        g = pl.read_parquet(paths["groups"]).with_columns(pl.lit(arm).alias("arm"), pl.lit(r, pl.Int64).alias("repeat"))
        g = g.with_columns(pl.Series("block", [block_of[(arm, r, gid)] for gid in g["group_id"]], dtype=pl.Int64))
        frames.append(g)
    groups = pl.concat(frames, how="vertical")
    out = []
    for row in blocks.iter_rows(named=True):
        part = groups.filter((pl.col("arm") == row["arm"]) & (pl.col("repeat") == row["repeat"]) & (pl.col("block") == row["block"]))
        wall, overhead = attribute_wall(*(part[c].to_numpy().astype(np.float64) for c in ("gen_s", "env_s", "reset_s", "n_steps")), float(row["wall_s"]))
        out.append(part.with_columns(pl.Series("wall_s_attributed", wall), pl.Series("overhead_s", overhead), pl.lit(row["order"], pl.Int64).alias("order")))
    df = pl.concat(out, how="vertical")
    base = df.filter(pl.col("arm") == BASELINE).select("group_id", "repeat", pl.col("zero_var").alias("baseline_zero_var"), pl.col("label").alias("baseline_label"))
    df = df.join(base, on=["group_id", "repeat"], how="left")
    return df.select(
        "task_id", "task_type", "group_id", "group_index", "arm", "repeat", "block", "order", "cut", "cut_step", "gate_K",
        "n_steps", "n_gen_tokens", "n_prompt_tokens", "gen_s", "env_s", "reset_s", "overhead_s",
        pl.col("wall_s_attributed").alias("wall_s"), pl.col("wall_s").alias("group_wall_s"),
        "reward_mean", "reward_var", "zero_var", "label", "success_rate", "baseline_zero_var", "baseline_label",
        (pl.col("cut") & pl.col("baseline_zero_var")).alias("tp"), (pl.col("cut") & ~pl.col("baseline_zero_var")).alias("fp"),
    ).sort("group_index", "arm", "repeat")


class Confusion(NamedTuple):
    """Cuts of one arm judged by the baseline arm (pooled over repeats).

    n: (task, repeat) pairs; zero_var: of them, baseline groups with σ_r = 0; precision = TP/cut
    (nan without cuts); recall = TP/zero_var (nan when none); own_precision: the same cuts judged
    by the arm's own truncated rewards (the reference code's mistake, shown for contrast);
    safe / raw: the paper's step-based savings Σ_TP (T − K_cut) / (n·T) and Σ_cut (T − K_cut) / (n·T).
    """

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
    """Confusion of an arm's rows of ab.parquet (columns cut, cut_step, zero_var, baseline_zero_var)."""
    n = arm_rows.height
    cut = arm_rows.filter(pl.col("cut"))
    tp_rows = cut.filter(pl.col("baseline_zero_var"))
    n_cut, tp = cut.height, tp_rows.height
    zero = int(arm_rows["baseline_zero_var"].sum())
    own_tp = int(cut["zero_var"].sum())

    def post_K(rows: pl.DataFrame) -> float:
        return float((T_max - rows["cut_step"]).sum()) / (n * T_max) if rows.height else 0.0

    return Confusion(
        n=n, zero_var=zero, cut=n_cut, tp=tp, fp=n_cut - tp,
        precision=tp / n_cut if n_cut else math.nan,
        recall=tp / zero if zero else math.nan,
        own_precision=own_tp / n_cut if n_cut else math.nan,
        safe=post_K(tp_rows), raw=post_K(cut),
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
    baseline twins up to step K (the group's cut step, or the gate's K; fewer if they ended
    earlier); n_match identical in actions, responses and generated token ids; ``tokens_checked``
    False when the policy records no token ids (non-LLM policies)."""

    n_traj: int
    n_match: int
    share: float
    tokens_checked: bool
    mismatches: list[Mismatch]


def seed_match(base: dict[str, pl.DataFrame], arm: dict[str, pl.DataFrame], gate_K: int, repeat: int = 0) -> SeedMatch:
    """Compare the gated arm's trajectories with the baseline's (same repeat); ``base``/``arm``:
    table name -> DataFrame of the steps, trajectories and groups tables."""
    cut_step = dict(zip(arm["groups"]["group_id"], arm["groups"]["cut_step"], strict=True))

    def per_traj(steps: pl.DataFrame) -> dict[tuple[str, int], list[tuple[int, str, str]]]:
        out: dict[tuple[str, int], list[tuple[int, str, str]]] = {}
        for gid, ti, st, a, resp in steps.sort("group_id", "traj_idx", "step").select("group_id", "traj_idx", "step", "action", "response").iter_rows():
            out.setdefault((gid, ti), []).append((st, a, resp))
        return out

    bs, gs = per_traj(base["steps"]), per_traj(arm["steps"])
    btok = {(g, i): (t, m) for g, i, t, m in base["trajectories"].select("group_id", "traj_idx", "token_ids", "action_mask").iter_rows()}
    tokens_checked = any(len(t) for t, _ in btok.values())
    mismatches = []
    n = 0
    for gid, ti, tok, mask in arm["trajectories"].select("group_id", "traj_idx", "token_ids", "action_mask").iter_rows():
        n += 1
        k = cut_step.get(gid) or gate_K
        mine, twin = gs.get((gid, ti), [])[:k], bs.get((gid, ti), [])[:k]
        if mine != twin:
            first = next((a[0] for a, b in zip(mine, twin, strict=False) if a != b), min(len(mine), len(twin)) + 1)
            mismatches.append(Mismatch(repeat, gid, ti, first))
        elif tokens_checked and tokens_through_step(tok, mask, k) != tokens_through_step(*btok[(gid, ti)], k):
            mismatches.append(Mismatch(repeat, gid, ti, None))
    return SeedMatch(n, n - len(mismatches), (n - len(mismatches)) / n if n else math.nan, tokens_checked, mismatches)


def with_seed_match(table: pl.DataFrame, comparisons: Sequence[Comparison], G: int) -> pl.DataFrame:
    """``table`` plus ``n_traj_matched``: per non-baseline row, how many of the group's G
    trajectories are identical to their baseline twin up to K (null on baseline rows)."""
    missed: dict[tuple[str, int, str], int] = {}
    for c in comparisons:
        for m in c.match.mismatches:
            key = (c.arm, m.repeat, m.group_id)
            missed[key] = missed.get(key, 0) + 1
    values = [None if arm == BASELINE else G - missed.get((arm, r, gid), 0) for arm, r, gid in table.select("arm", "repeat", "group_id").iter_rows()]
    return table.with_columns(pl.Series("n_traj_matched", values, dtype=pl.Int64))


class Saving(NamedTuple):
    """One cost in both arms: totals over tasks (each task's mean over repeats), the share saved
    1 − arm/baseline, and its percentile-bootstrap CI over tasks (paired: both arms' values of a
    task resampled together)."""

    metric: str
    baseline: float
    arm: float
    saving: float
    low: float
    high: float


SAVED_COSTS = (("wall_s", "wall-clock (s)"), ("n_gen_tokens", "generated tokens"), ("n_prompt_tokens", "prompt tokens"), ("n_steps", "environment steps"))


@dataclass(frozen=True)
class Comparison:
    """Everything the report says about one arm against the baseline.

    savings: metric -> Saving (wall_s, n_gen_tokens, n_prompt_tokens, n_steps);
    ratio: (estimate, low, high) of wall-clock saving ÷ generated-token saving (target ≥ 0.9);
    task_diff: paired bootstrap of the mean per-task wall-clock, arm − baseline (s);
    decomposition: seconds saved in generation / environment (steps + resets) / overhead, and the
    baseline wall they are shares of.
    """

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
            "arm": self.arm, "gate": self.gate, "n_tasks": self.n_tasks, "repeats": self.repeats,
            "confusion": self.confusion._asdict(), "seed_match": {"n_traj": self.match.n_traj, "n_match": self.match.n_match, "share": self.match.share},
            "savings": {k: v._asdict() for k, v in self.savings.items()}, "wall_over_token_saving": list(self.ratio),
            "mean_task_wall_diff_s": self.task_diff._asdict(), "decomposition_s": self.decomposition,
        }


def per_task_means(table: pl.DataFrame, arm: str) -> pl.DataFrame:
    """One row per task of ``arm``: each cost's mean over repeats, in group order."""
    cols = ["wall_s", "n_gen_tokens", "n_prompt_tokens", "n_steps", "gen_s", "env_s", "reset_s", "overhead_s"]
    return table.filter(pl.col("arm") == arm).group_by("group_index", "group_id", "task_id").agg(pl.col(c).cast(pl.Float64).mean() for c in cols).sort("group_index")


def compare_arms(table: pl.DataFrame, tables: dict[tuple[str, int], dict[str, Path]], arm: ArmSpec, config: AbRolloutConfig) -> Comparison:
    """Score ``arm`` against the baseline: savings with CIs, the cuts judged by the baseline, the
    seed-match proof over every repeat."""
    from srollout.core.stats import bootstrap_ci, paired_bootstrap, relative_saving_ci

    b, a = per_task_means(table, BASELINE), per_task_means(table, arm.name)
    savings = {}
    for col, label in SAVED_COSTS:
        if float(b[col].sum()) > 0:
            ci = relative_saving_ci(b[col].to_numpy(), a[col].to_numpy(), n_resamples=config.n_boot, seed=config.seed)
            savings[col] = Saving(label, float(b[col].sum()), float(a[col].sum()), ci.estimate, ci.low, ci.high)
        else:  # a non-LLM policy generates no tokens: no saving share is defined
            savings[col] = Saving(label, 0.0, float(a[col].sum()), math.nan, math.nan, math.nan)
    pairs = np.stack([b["wall_s"].to_numpy(), a["wall_s"].to_numpy(), b["n_gen_tokens"].to_numpy(), a["n_gen_tokens"].to_numpy()], axis=1)

    def ratio_stat(x: np.ndarray) -> np.ndarray:
        with np.errstate(divide="ignore", invalid="ignore"):
            wall = 1.0 - x[..., 1].sum(-1) / x[..., 0].sum(-1)
            tok = 1.0 - x[..., 3].sum(-1) / x[..., 2].sum(-1)
            return np.where(tok > 0, wall / tok, np.nan)

    if savings["n_gen_tokens"].saving > 0:
        rc = bootstrap_ci(pairs, ratio_stat, n_resamples=config.n_boot, seed=config.seed, batched=True)
        ratio = (rc.estimate, rc.low, rc.high)
    else:
        ratio = (math.nan, math.nan, math.nan)
    diff = paired_bootstrap(b["wall_s"].to_numpy(), a["wall_s"].to_numpy(), n_resamples=config.n_boot, seed=config.seed)
    decomposition = {
        "baseline_wall": float(b["wall_s"].sum()),
        "generation": float(b["gen_s"].sum() - a["gen_s"].sum()),
        "environment": float((b["env_s"] + b["reset_s"]).sum() - (a["env_s"] + a["reset_s"]).sum()),
        "overhead": float(b["overhead_s"].sum() - a["overhead_s"].sum()),
    }
    matches = []
    for r in range(config.repeats):
        base = {name: pl.read_parquet(tables[(BASELINE, r)][name]) for name in ("steps", "trajectories", "groups")}
        mine = {name: pl.read_parquet(tables[(arm.name, r)][name]) for name in ("steps", "trajectories", "groups")}
        matches.append(seed_match(base, mine, arm.gate_K or config.T_max, repeat=r))
    n_traj = sum(m.n_traj for m in matches)
    n_match = sum(m.n_match for m in matches)
    match = SeedMatch(n_traj, n_match, n_match / n_traj if n_traj else math.nan, any(m.tokens_checked for m in matches), [x for m in matches for x in m.mismatches])
    return Comparison(
        arm=arm.name, gate=arm.describe(), n_tasks=b.height, repeats=config.repeats,
        confusion=judge_cuts(table.filter(pl.col("arm") == arm.name), config.T_max), match=match,
        savings=savings, ratio=ratio, task_diff=diff, decomposition=decomposition,
    )


# --- progress -------------------------------------------------------------------------------------


class _Progress:
    """A rich progress bar over all (arm, repeat, block) runs: groups done, tokens/s, the run in
    progress, ETA (no-op when disabled)."""

    def __init__(self, console: Any, total: int, enabled: bool) -> None:
        self.enabled = enabled
        self.tokens = 0
        self.t0 = time.perf_counter()
        if not enabled:
            return
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )

        self.bar = Progress(
            TextColumn("[bold]ab-rollout"), TextColumn("{task.fields[run]}"), BarColumn(), MofNCompleteColumn(), TextColumn("groups"),
            TextColumn("{task.fields[rate]}"), TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn(), console=console, transient=False,
        )
        self.task = self.bar.add_task("ab-rollout", total=total, run="", rate="")

    def __enter__(self) -> _Progress:
        if self.enabled:
            self.bar.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.enabled:
            self.bar.__exit__(*exc)

    def start(self, block: Block) -> None:
        if self.enabled:
            self.bar.update(self.task, run=f"{block.arm.name} r{block.repeat} b{block.block}")

    def advance(self, n: int) -> None:
        if self.enabled and n:
            self.bar.advance(self.task, n)

    def tick(self, stats: TickStats) -> None:
        self.tokens += stats.gen_tokens
        if self.enabled:
            rate = self.tokens / max(time.perf_counter() - self.t0, 1e-9)
            self.bar.update(self.task, rate=f"{rate:,.0f} tok/s, {stats.rows} in flight")


__all__: Sequence[str] = (
    "AbResult", "ArmSpec", "Block", "Comparison", "Confusion", "SeedMatch", "Saving", "attribute_wall", "build_arms",
    "judge_cuts", "make_schedule", "run_ab_rollout", "seed_match", "tokens_through_step",
)
