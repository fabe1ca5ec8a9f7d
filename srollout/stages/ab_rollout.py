"""`srollout ab-rollout`: the matched-seed wall-clock A/B (the paper's Tier 1, §5.1), done so that
it holds up to a reviewer.

The story, top to bottom (:func:`run_ab_rollout`):

1. open the run directory (``--resume`` reopens it and checks the config matches);
2. load the task set and build the groups: group i plays task i, and every trajectory's seeds
   derive from (run seed, i, traj_idx) (:mod:`srollout.rollout.seeding`), so both arms see the
   same games and draw the same samples;
3. build the arms (``--arms``, default ``baseline,gated``; any of :data:`srollout.core.arms.ARM_NAMES`:
   the gate, DAPO and GRESO switches), the policy and the environment factory — one policy
   object, shared by the arms;
4. warm up before any clock runs: every task's game is loaded once and a throw-away batch (other
   group indices, so other seeds) is rolled to T_max;
5. the schedule: R repeats × B blocks of tasks; in each block every arm rolls the block's groups
   through the same batched engine at the same concurrency, arms in ABBA order over blocks (A B |
   B A | ...); each (arm, repeat, block) run is timed alone (:func:`run_block`: GRESO skips tasks
   first, DAPO adds extra rounds), its records written after its clock stops, its totals saved
   as ``<arm>/r<repeat>/block-<b>.json`` (what makes ``--resume`` work); with ``--workers N``
   (N > 1) every rollout call runs on N Ray workers (:mod:`srollout.rollout.ray_pool`);
6. merge each (arm, repeat) into steps/trajectories/groups/signals.parquet under ``<arm>/r<repeat>/``
   (each a collect-format buffer ``srollout analyze`` reads);
7. score: per (task, arm, repeat) costs with each run's wall-clock attributed to its tasks, the
   seed-match proof, cuts judged by the baseline arm's outcome of the same task and seeds,
   savings with paired bootstrap CIs over tasks (:func:`compare_arms`, arms without DAPO), and
   per arm wall-clock, tokens and useful groups per second (:func:`arms_table`);
   ``ab.parquet``, ``arms.parquet``, ``report.md``, figures.

DAPO and GRESO without training (docs/ab-rollout.md): a DAPO arm rolls the block's tasks, drops
the groups that are not useful (cut, or zero reward variance) and rolls out the next tasks of
the task set (group indices after the A/B's, so seeds follow the same scheme) until the block
has as many useful groups as tasks or ``--dapo-max-rounds`` extra rounds ran. A GRESO arm skips,
before the rollout, a task whose last z groups (``--greso-history``, then the arm's own groups of
earlier repeats) gave no gradient, unless a seeded draw keeps it (probability p^z).

Per-task wall-clock (a batched run has no per-task clock): a task is charged its groups' measured
generation time (each tick's ``policy.act`` time split over the tick's rows by generated tokens,
as the engine records it), its own env-step and env-reset times, and a share of the run's
remaining overhead (wall − generation − env) proportional to its env steps. The charges of a run
sum exactly to its measured wall-clock, so the task-bootstrap's point estimate is the measured
saving.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import polars as pl

from srollout.config import PAPER_D_L, PAPER_K, AbRolloutConfig, DistConfig
from srollout.core.arms import ArmSpec as ArmKind
from srollout.core.arms import (
    DapoRound,
    GresoOutcome,
    GresoSkipper,
    arm_summary,
    dapo_fill,
    greso_filter,
    is_useful,
    parse_arm,
)
from srollout.errors import SrolloutError
from srollout.progress import StageBar
from srollout.rollout.engine import (
    GroupRecord,
    GroupSpec,
    RolloutSettings,
    RolloutSummary,
    TickStats,
    make_specs,
    run_groups,
)

BASELINE = "baseline"
GATED = "gated"
# Warm-up groups get indices far past any run's groups: their seeds and ids never meet the A/B's.
WARMUP_INDEX = 1_000_000


# --- arms ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ArmSpec:
    """One arm of the A/B: ``name`` (the value of groups.arm; one of ``srollout.core.arms.ARM_NAMES``
    for the DAPO and GRESO arms), its gate (None = no gate) and the step the engine applies it at.
    Every arm is compared with ``baseline``."""

    name: str
    gate: Any = None
    gate_K: int | None = None

    @property
    def kind(self) -> ArmKind:
        """The arm's switches (gate / dapo / greso) from its name; a name outside ARM_NAMES is a
        plain arm, gated iff it has a gate."""
        try:
            return parse_arm(self.name)
        except SrolloutError:
            return ArmKind(self.name, gate=self.gate is not None, dapo=False, greso=False)

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
    gate, K = build_gate(config)
    return ArmSpec(GATED, gate, K)


def build_gate(config: AbRolloutConfig) -> tuple[Any, int]:
    """(gate, K) of the gated arms: --gate gate.json, or rule --rule at (--K, --d-L)."""
    from srollout.core.gate import GateRule, load_gate

    if config.gate is not None:
        gate = load_gate(config.gate)
        K = int(getattr(gate, "K", None) or PAPER_K)
    else:
        K = config.K if config.K is not None else PAPER_K
        gate = GateRule(rule=config.rule, K=K, d_L=config.d_L if config.d_L is not None else PAPER_D_L, t_high=config.t_high)
    if K > config.T_max:
        raise SrolloutError(f"gate K={K} is larger than --T-max {config.T_max}")
    return gate, K


def build_arms(config: AbRolloutConfig) -> tuple[ArmSpec, ...]:
    """The arms of ``--arms`` in schedule order; the first is the baseline every other arm is
    judged against. The arms with the gate share one gate object."""
    kinds = [parse_arm(name) for name in config.arms]
    gate, K = build_gate(config) if any(k.gate for k in kinds) else (None, None)
    return tuple(ArmSpec(k.name, gate, K) if k.gate else ArmSpec(k.name) for k in kinds)


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


# --- DAPO and GRESO inside one timed run ----------------------------------------------------------


def extra_start(config: AbRolloutConfig, block: Block) -> int:
    """First group index of DAPO's extra groups in ``block``.

    A block whose tasks start at group index s owns the indices groups + R·s .. groups + R·(s + n) − 1
    (n tasks, R = --dapo-max-rounds): room for every extra group its rounds can ask for (each round
    asks for at most n). So a block's extra groups — their tasks (group i plays task i mod the set's
    size) and seeds — depend neither on other blocks nor on the arm: ``dapo`` and ``gated+dapo``
    draw from the same sequence."""
    return config.groups + config.dapo_max_rounds * block.specs[0].index


def load_greso_history(path: Path) -> list[GresoOutcome]:
    """``--greso-history``: a groups.parquet (or a run directory holding one) -> one GRESO outcome
    per row (columns task_id, zero_var and, if present, cut: a cut group gave no gradient either).
    The n rows of one task count in file order as iterations −n .. −1 (the last row the most
    recent), so they all come before repeat 0 (iteration 0)."""
    path = Path(path)
    file = path / "groups.parquet" if path.is_dir() else path
    if not file.exists():
        raise SrolloutError(f"--greso-history {path}: no groups.parquet there")
    try:
        df = pl.read_parquet(file)
    except Exception as err:  # polars raises several error types for a non-Parquet file
        raise SrolloutError(f"--greso-history {file}: not a readable Parquet file ({type(err).__name__})") from err
    for col in ("task_id", "zero_var"):
        if col not in df.columns:
            raise SrolloutError(f"--greso-history {file}: missing column '{col}' (a groups table has it)")
    cut = df["cut"].fill_null(False).to_list() if "cut" in df.columns else [False] * df.height
    tasks = df["task_id"].cast(pl.Utf8).to_list()
    total = {t: tasks.count(t) for t in set(tasks)}
    seen: dict[str, int] = {}
    out = []
    for task, zero, was_cut in zip(tasks, df["zero_var"].fill_null(False).to_list(), cut, strict=True):
        seen[task] = seen.get(task, 0) + 1
        out.append(GresoOutcome(task, seen[task] - 1 - total[task], bool(zero) or bool(was_cut)))
    return out


class BlockRun(NamedTuple):
    """One timed (arm, repeat, block) run.

    records: every group rolled out, round by round (each round in group order); summary: the
    engine's totals summed over the rounds (wall_s: their measured seconds; see :func:`add_summaries`);
    skipped: group ids GRESO skipped; rounds: one DapoRound per round that rolled out groups (one
    round for arms without DAPO; none when every task was skipped); round_ids: the group ids of
    each round; hit_cap: DAPO still had fewer useful groups than tasks after --dapo-max-rounds
    extra rounds.
    """

    records: list[GroupRecord]
    summary: RolloutSummary
    skipped: list[str]
    rounds: tuple[DapoRound, ...]
    round_ids: list[list[str]]
    hit_cap: bool


# roll(specs, arm) -> (records, summary): one timed engine call, in this process or on Ray workers
Roller = Callable[[Sequence[GroupSpec], ArmSpec], tuple[list[GroupRecord], RolloutSummary]]


def run_block(block: Block, roll: Roller, config: AbRolloutConfig, tasks: Sequence[Any],
              skipper: GresoSkipper | None = None, workers: int = 1) -> BlockRun:
    """Run ``block`` in its arm's way: GRESO (``skipper``, iteration = the repeat) drops tasks
    first; the rest is one ``roll`` call, or, in a DAPO arm, :func:`srollout.core.arms.dapo_fill`
    over rounds: round 0 rolls the block's tasks, round r >= 1 the next n_needed groups from
    :func:`extra_start` on (``tasks``: the task set). Never raises at DAPO's cap."""
    kind = block.arm.kind
    specs = list(block.specs)
    skipped: list[str] = []
    if kind.greso and skipper is not None:
        keep, skip = greso_filter(skipper, [s.task.task_id for s in specs], block.repeat)
        skipped = [specs[i].group_id for i in skip]
        specs = [specs[i] for i in keep]
    summaries: list[RolloutSummary] = []
    round_ids: list[list[str]] = []

    def sample_round(n_needed: int, r: int) -> list[GroupRecord]:
        if r == 0:
            batch = specs
        else:
            start = extra_start(config, block) + sum(len(ids) for ids in round_ids[1:])
            batch = make_specs(tasks, start + n_needed, start)
        if not batch:
            return []
        records, summary = roll(batch, block.arm)
        summaries.append(summary)
        round_ids.append([s.group_id for s in batch])
        return sorted(records, key=lambda rec: rec.spec.index)

    def n_tokens(record: GroupRecord) -> int:
        return sum(t.n_gen_tokens for t in record.trajs)

    if kind.dapo:
        with _quiet("srollout.core.arms"):  # its warning speaks of training; the report says it here
            filled = dapo_fill(len(specs), sample_round, config.dapo_max_rounds, tokens=n_tokens)
        records, rounds, hit_cap = list(filled.generated), filled.rounds, filled.hit_cap
    else:
        records = sample_round(len(specs), 0)
        rounds = (DapoRound(0, len(specs), len(records), sum(map(is_useful, records)), sum(map(n_tokens, records))),) if records else ()
        hit_cap = False
    return BlockRun(records, add_summaries(summaries, workers), skipped, tuple(rounds), round_ids, hit_cap)


def add_summaries(summaries: Sequence[RolloutSummary], workers: int = 1) -> RolloutSummary:
    """The rounds of one timed run as one summary: counts and measured seconds summed, wall_s the
    sum of the rounds' wall-clocks, overhead_s = workers · wall_s − generation − env steps − resets
    (worker-seconds on Ray). One round in this process is returned as it is."""
    if len(summaries) == 1 and workers == 1:
        return summaries[0]
    wall = sum(s.wall_s for s in summaries)
    gen, env, reset = (sum(getattr(s, f) for s in summaries) for f in ("gen_s", "env_s", "reset_s"))
    ticks, rows = sum(s.ticks for s in summaries), sum(s.rows for s in summaries)
    return RolloutSummary(
        groups=sum(s.groups for s in summaries), wall_s=wall, gen_s=gen, env_s=env, reset_s=reset,
        overhead_s=workers * wall - gen - env - reset, ticks=ticks, rows=rows, mean_batch=rows / ticks if ticks else 0.0,
        n_gen_tokens=sum(s.n_gen_tokens for s in summaries), n_prompt_tokens=sum(s.n_prompt_tokens for s in summaries),
        n_cut=sum(s.n_cut for s in summaries),
    )


@contextlib.contextmanager
def _quiet(logger: str) -> Iterator[None]:
    log = logging.getLogger(logger)
    before, log.disabled = log.disabled, True
    try:
        yield
    finally:
        log.disabled = before


# --- the story ------------------------------------------------------------------------------------


class AbResult(NamedTuple):
    """run_dir; paths: output name -> path; comparisons: one per non-baseline arm without DAPO;
    arms: arms.parquet (one row per arm: wall-clock, tokens, useful groups per second, ...)."""

    run_dir: Path
    paths: dict[str, Path]
    comparisons: list[Any]
    arms: pl.DataFrame | None = None


def run_ab_rollout(
    config: AbRolloutConfig,
    console: Any = None,
    progress: bool = True,
    *,
    policy: Any = None,
    env_factory: Callable[[], Any] | None = None,
    tasks: Sequence[Any] | None = None,
    dist: DistConfig | None = None,
) -> AbResult:
    """Run the A/B as configured; return where the files are, one comparison per arm without
    DAPO and the per-arm summary.

    policy / env_factory / tasks: roll out with these instead of building them from the config (a
    test wraps a policy to count the rows it is asked to generate, or plays a scripted env);
    with ``dist.workers`` > 1 they are pickled to every Ray worker. dist: ``--workers`` (None or
    1: in this process, Ray never imported); not part of the resume key.
    """
    from srollout.rollout.parts import merge_parts, write_part
    from srollout.rollout.records import group_tables
    from srollout.rundir import Manifest, check_resumable, prepare_run_dir
    from srollout.schemas import write_json
    from srollout.stages.collect import load_tasks

    t0 = time.perf_counter()
    dist = dist or DistConfig()
    if dist.workers > 1:  # before the run directory exists: a missing extra leaves nothing behind
        from srollout.rollout.ray_pool import require_ray

        require_ray(dist.workers)
    if config.resume and config.out is None:
        raise SrolloutError("--resume needs --out RUN_DIR (the run to continue)")
    # a bad gate.json, task set or GRESO history fails here, before anything is written
    arms = build_arms(config)
    tasks = list(tasks) if tasks is not None else load_tasks(config.tasks, config.difficulty)
    history = load_greso_history(config.greso_history) if config.greso_history is not None and any(a.kind.greso for a in arms) else []
    if policy is None:  # a missing backend, a damaged model or a silent server: nothing written
        from srollout.policy import preflight

        preflight(config.policy, config.model, config.backend, adapter=config.adapter, base_url=config.base_url)
    # 1. the run directory
    run_dir = prepare_run_dir(config.out, "ab-rollout", overwrite=config.overwrite, resume=config.resume)
    if config.resume:
        check_resumable(run_dir, "ab-rollout", config.resume_key(), "timed blocks")
    manifest = Manifest(run_dir, "ab-rollout", config)

    # 2. groups: the same specs, hence the same seeds, in every arm
    specs = make_specs(tasks, config.groups)
    schedule = make_schedule(arms, specs, config.repeats, config.blocks)
    todo = [b for b in schedule if not block_file(run_dir, b).exists()]
    manifest.update(arms={a.name: a.describe() for a in arms}, n_tasks_in_set=len(tasks), resumed_blocks=len(schedule) - len(todo),
                    workers=dist.workers, greso_history=len(history) if history else None)
    # GRESO: one skipper per arm, fed the history, then every finished block's groups (resume too)
    skippers = {a.name: GresoSkipper(config.greso_p_explore, config.seed, history) for a in arms if a.kind.greso}
    for b in schedule:
        if b not in todo and b.arm.name in skippers:
            _record_greso(skippers[b.arm.name], b, json.loads(block_file(run_dir, b).read_text()))

    # 3-5. policy, environments, warm-up, the timed runs
    distributed = dist.workers > 1 and bool(todo)
    # --- workers > 1: each Ray worker builds (and warms up) its own policy replica
    roller = _Roller(config, dist.workers if distributed else 1, policy, env_factory, _warm_tasks(config, arms, specs, tasks), specs,
                     chunk_groups=dist.chunk_groups) if todo else None
    manifest.update(policy=roller.policy_name if roller is not None else None)
    with (_ray(dist.workers) if distributed else contextlib.nullcontext()) as where, \
            _Progress(console, total=sum(len(b.specs) for b in schedule), enabled=progress) as show:
        if roller is not None:
            roller.show = show
        show.advance(sum(len(b.specs) for b in schedule if b not in todo))
        for block in todo:
            show.start(block)
            run = run_block(block, roller.roll, config, tasks, skippers.get(block.arm.name), workers=roller.workers)
            show.advance(len(run.skipped))
            # written after the clock stopped: disk I/O is no part of any arm's time
            for record in run.records:
                write_part(arm_dir(run_dir, block.arm.name, block.repeat), record.group_id, group_tables(record))
            data = block_data(block, run, roller.workers, roller.take_dist())
            write_json(data, block_file(run_dir, block))
            if block.arm.name in skippers:
                _record_greso(skippers[block.arm.name], block, data)
    if distributed:
        manifest.update(dist={"ray": where, "workers": dist.workers})

    # 6. one collect-format buffer per (arm, repeat), groups in index order
    datas = [json.loads(block_file(run_dir, b).read_text()) for b in schedule]
    rolled: dict[tuple[str, int], list[str]] = {}
    for b, data in zip(schedule, datas, strict=True):
        rolled.setdefault((b.arm.name, b.repeat), []).extend(data["group_ids"])
    tables = {}
    for arm in arms:
        for r in range(config.repeats):
            tables[(arm.name, r)] = merge_parts(arm_dir(run_dir, arm.name, r), sorted(rolled.get((arm.name, r), [])))

    # 7. score, report
    from srollout.report.ab import write_ab_outputs

    blocks = blocks_table(schedule, datas)
    table = ab_table(tables, blocks, schedule, datas)
    comparisons = [compare_arms(table, tables, arm, config, blocks) for arm in arms[1:] if not arm.kind.dapo]
    matches = [*comparisons, *(ArmMatch(arm.name, arm_seed_match(tables, arm, config)) for arm in arms[1:] if arm.kind.dapo)]
    table = with_seed_match(table, matches, config.G)
    table = table.select([*(c for c in table.columns if c not in NEW_AB_COLUMNS), *NEW_AB_COLUMNS])
    summary = arms_table(table, blocks, arms, {m.arm: m.match for m in matches}, config)
    paths = write_ab_outputs(run_dir, config, table, blocks, comparisons, tables, arms=summary)
    manifest.data["timings_s"].update(warmup=round(roller.warm_s if roller else 0.0, 3), timed_runs=round(float(blocks["wall_s"].sum()), 3))
    outputs = [*paths.values(), *(p for t in tables.values() for p in t.values())]
    manifest.complete(outputs, comparisons=[c.headline() for c in comparisons], arms_summary=summary.to_dicts(),
                      wall_s_process=round(time.perf_counter() - t0, 3))
    return AbResult(run_dir, paths, comparisons, summary)


# the columns ab.parquet gained with --arms (after n_traj_matched, so the older columns keep their place)
NEW_AB_COLUMNS = ("skipped", "dapo_round", "useful")


def block_data(block: Block, run: BlockRun, workers: int, dist: dict[str, Any] | None) -> dict[str, Any]:
    """What ``block-<b>.json`` keeps of a timed run: its place in the schedule, the groups rolled
    out (all rounds), the engine's totals, GRESO's skips and outcomes, DAPO's rounds."""
    kind = block.arm.kind
    data = {"order": block.order, "repeat": block.repeat, "block": block.block, "arm": block.arm.name,
            "group_ids": [r.group_id for r in run.records], "summary": run.summary._asdict(), "workers": workers,
            "skipped_ids": run.skipped, "hit_cap": run.hit_cap, "n_useful": sum(map(is_useful, run.records)),
            "rounds": [{**rd._asdict(), "group_ids": ids} for rd, ids in zip(run.rounds, run.round_ids, strict=True)]}
    if kind.greso:  # a cut group gave no gradient: it counts as zero-variance
        data["greso_outcomes"] = [[r.spec.task.task_id, not is_useful(r)] for r in run.records]
    if dist is not None:
        data["dist"] = dist
    return data


def _record_greso(skipper: GresoSkipper, block: Block, data: dict[str, Any]) -> None:
    for task_id, no_gradient in data.get("greso_outcomes", []):
        skipper.record(task_id, block.repeat, bool(no_gradient))


def _warm_tasks(config: AbRolloutConfig, arms: Sequence[ArmSpec], specs: Sequence[GroupSpec], tasks: Sequence[Any]) -> list[Any]:
    """The tasks whose games the warm-up loads: the A/B's, and with a DAPO arm every task its
    extra rounds may reach (so extra rounds do not pay first loads the other arms never pay)."""
    out = {s.task.task_id: s.task for s in specs}
    if any(a.kind.dapo for a in arms):
        for s in make_specs(tasks, config.groups * (1 + config.dapo_max_rounds), config.groups):
            out.setdefault(s.task.task_id, s.task)
    return list(out.values())


@contextlib.contextmanager
def _ray(workers: int) -> Iterator[str]:
    from srollout.rollout.ray_pool import ray_session

    with ray_session(workers) as where:
        yield where


class _Roller:
    """The timed engine call of every block: ``roll(specs, arm) -> (records, summary)``.

    In this process (workers == 1): the policy is built here (unless given) and warmed up once
    before any clock (:func:`warm_up`); each call is :func:`srollout.rollout.engine.run_groups`.
    On Ray (workers > 1): each call is :func:`srollout.rollout.ray_pool.run_groups_distributed` with
    the arm's settings; every worker builds its policy replica and warms up *before* the clock
    (:func:`worker_policy`), and the call's time is counted from the moment all workers are up
    (wall − start_s); ``overhead_s`` then counts worker-seconds (workers × wall − measured).
    """

    def __init__(self, config: AbRolloutConfig, workers: int, policy: Any, env_factory: Callable[[], Any] | None,
                 warm_tasks: Sequence[Any], planned: Sequence[GroupSpec], chunk_groups: int | None = None) -> None:
        from srollout.stages.collect import build_env_factory, build_policy, build_prompter

        self.config, self.workers, self.chunk_groups = config, workers, chunk_groups
        self.show = _Progress(None, 0, enabled=False)  # the stage hands over its bar
        self.planned = {s.group_id for s in planned}  # in the bar's total; DAPO's extra groups are not
        self.prompter = build_prompter(config)
        self.env_factory = env_factory or build_env_factory(config)
        self.warm_tasks = list(warm_tasks)
        self.warm_s = 0.0
        self._dist: list[dict[str, Any]] = []
        if workers == 1:
            self.policy = policy if policy is not None else build_policy(config)
            self.policy_name = getattr(self.policy, "name", None)
            if config.warmup:
                self.warm_s = warm_up(self.warm_tasks, self.policy, self.env_factory, self.prompter, config)
        else:
            self.policy = policy  # shipped to the workers when given
            self.policy_name = getattr(policy, "name", None) or f"{config.policy} (built by each Ray worker)"
            if policy is None and config.policy == "lm" and config.backend == "transformers":
                from dataclasses import replace

                from srollout.policy import resolve_model

                # resolved (and built, for the default policy) here once rather than by every worker
                self.config = replace(config, model=resolve_model(config.model if config.model is not None else "default"))

    def _keep(self, records: list[GroupRecord]) -> Callable[[GroupRecord], None]:
        def keep(record: GroupRecord) -> None:
            records.append(record)
            self.show.advance(1)

        return keep

    def roll(self, specs: Sequence[GroupSpec], arm: ArmSpec) -> tuple[list[GroupRecord], RolloutSummary]:
        records: list[GroupRecord] = []
        self.show.extend(sum(s.group_id not in self.planned for s in specs))
        settings = arm.settings(self.config)
        if self.workers == 1:
            summary = run_groups(list(specs), self.policy, self.env_factory, self.prompter, settings, on_group=self._keep(records), on_tick=self.show.tick)
            return records, summary
        from functools import partial

        from srollout.rollout.ray_pool import WorkerRecipe, run_groups_distributed

        recipe = WorkerRecipe(
            make_policy=partial(worker_policy, self.config, self.policy, self.env_factory, self.warm_tasks),
            env_factory=self.env_factory, prompter=self.prompter, settings=settings,
            threads=1 if self.config.policy == "lm" else None,
        )
        result = run_groups_distributed(list(specs), recipe, self.workers, on_group=self._keep(records), on_tick=self.show.tick,
                                        chunk_groups=self.chunk_groups)
        s = result.summary
        timed = max(s.wall_s - result.start_s, 0.0)
        self._dist.append({"start_s": round(result.start_s, 3), "replaced": result.replaced, "chunks": result.chunks,
                           "worker_slots": result.workers, "policy_build_s": [round(x, 3) for x in result.build_s]})
        return records, s._replace(wall_s=timed, overhead_s=self.workers * timed - s.gen_s - s.env_s - s.reset_s)

    def take_dist(self) -> dict[str, Any] | None:
        """The Ray calls of the block just run (start-up seconds, restarts, chunks), then forget them."""
        if self.workers == 1:
            return None
        calls, self._dist = self._dist, []
        return {"calls": calls}


def worker_policy(config: AbRolloutConfig, policy: Any, env_factory: Callable[[], Any], warm_tasks: Sequence[Any]) -> Any:
    """A Ray worker's ``make_policy`` (runs in the worker, before the clock): the policy (``policy``
    when given, else built from the config), warmed up in the worker's own process with
    :func:`warm_up` when ``--warmup`` is on (its games loaded, a throw-away batch)."""
    from srollout.stages.collect import build_policy, build_prompter

    built = policy if policy is not None else build_policy(config)
    if config.warmup:
        warm_up(warm_tasks, built, env_factory, build_prompter(config), config)
    return built


def warm_up(tasks: Sequence[Any], policy: Any, env_factory: Callable[[], Any], prompter: Any, config: AbRolloutConfig) -> float:
    """Load every task's game once, then roll one throw-away batch (as many groups as fit in
    ``concurrency``, group indices from WARMUP_INDEX, so other seeds) to T_max: every context
    length the timed runs reach is warmed (with a 2-step warm-up the first timed run, always the
    baseline's, ran 8–20 % slower than the others in an A/A run). Returns the seconds spent.
    Nothing is recorded."""
    t0 = time.perf_counter()
    env = env_factory()
    try:
        for task in tasks:  # the engine caches parsed games per process: the first arm would pay it alone
            env.reset(task, 0)
    finally:
        env.close()
    n = max(1, min(len(tasks), config.concurrency // config.G))
    specs = [GroupSpec(WARMUP_INDEX + i, tasks[i]) for i in range(n)]
    settings = RolloutSettings(G=config.G, T_max=config.T_max, seed=config.seed, concurrency=config.concurrency, signal_K=(), arm="warmup")
    run_groups(specs, policy, env_factory, prompter, settings)
    return time.perf_counter() - t0


def read_blocks(run_dir: Path, schedule: Sequence[Block]) -> pl.DataFrame:
    """One row per timed run (schedule order) from its block-<b>.json (:func:`blocks_table`)."""
    return blocks_table(schedule, [json.loads(block_file(run_dir, b).read_text()) for b in schedule])


def blocks_table(schedule: Sequence[Block], datas: Sequence[dict[str, Any]]) -> pl.DataFrame:
    """One row per timed run (schedule order): the engine's totals (summed over DAPO's rounds;
    ``groups`` = groups rolled out), ``workers``, and what the arms did: n_skipped (GRESO),
    n_extra / extra_rounds / hit_cap (DAPO), n_useful (groups not cut with σ_r > 0)."""
    rows = []
    for b, data in zip(schedule, datas, strict=True):
        rounds = data.get("rounds", [])
        rows.append({"order": b.order, "arm": b.arm.name, "repeat": b.repeat, "block": b.block, "groups": len(b.specs), **data["summary"],
                     "workers": data.get("workers", 1), "n_skipped": len(data.get("skipped_ids", [])),
                     "n_extra": sum(len(rd["group_ids"]) for rd in rounds[1:]), "extra_rounds": max(len(rounds) - 1, 0),
                     "hit_cap": bool(data.get("hit_cap", False)), "n_useful": data.get("n_useful")})
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


def ab_table(tables: dict[tuple[str, int], dict[str, Path]], blocks: pl.DataFrame, schedule: Sequence[Block],
             datas: Sequence[dict[str, Any]] | None = None) -> pl.DataFrame:
    """ab.parquet: one row per (task, arm, repeat), costs attributed per block (see module doc),
    and for every arm the baseline's outcome of the same task, seeds and repeat.

    With the arms: a DAPO arm has one more row per extra group (``dapo_round`` >= 1; no baseline
    twin, so baseline_zero_var is null); a GRESO arm has a row of zero cost per skipped task
    (``skipped``). A run's rows sum to ``workers`` × its wall-clock (worker-seconds on Ray).
    datas: the block-<b>.json contents in schedule order (None: every block rolled its tasks in
    one round, nothing skipped).
    """
    datas = datas if datas is not None else [{"group_ids": [s.group_id for s in b.specs]} for b in schedule]
    where: dict[tuple[str, int, str], tuple[int, int]] = {}  # (arm, repeat, group) -> (block, round)
    skipped_rows = []
    for b, data in zip(schedule, datas, strict=True):
        for rd in data.get("rounds") or [{"round_index": 0, "group_ids": data["group_ids"]}]:
            for gid in rd["group_ids"]:
                where[(b.arm.name, b.repeat, gid)] = (b.block, rd["round_index"])
        skipped = set(data.get("skipped_ids", []))
        skipped_rows += [
            {"task_id": s.task.task_id, "task_type": s.task.task_type, "group_id": s.group_id, "group_index": s.index,
             "arm": b.arm.name, "repeat": b.repeat, "block": b.block, "order": b.order, "dapo_round": 0, "skipped": True,
             "cut": False, "n_steps": 0, "n_gen_tokens": 0, "n_prompt_tokens": 0, "gen_s": 0.0, "env_s": 0.0, "reset_s": 0.0,
             "overhead_s": 0.0, "wall_s_attributed": 0.0}
            for s in b.specs if s.group_id in skipped
        ]
    frames = []
    for (arm, r), paths in tables.items():
        g = pl.read_parquet(paths["groups"]).with_columns(pl.lit(arm).alias("arm"), pl.lit(r, pl.Int64).alias("repeat"))
        places = [where[(arm, r, gid)] for gid in g["group_id"]]
        g = g.with_columns(pl.Series("block", [p[0] for p in places], dtype=pl.Int64), pl.Series("dapo_round", [p[1] for p in places], dtype=pl.Int64),
                           pl.lit(False).alias("skipped"))
        frames.append(g)
    groups = pl.concat(frames, how="vertical")
    out = []
    for row in blocks.iter_rows(named=True):
        part = groups.filter((pl.col("arm") == row["arm"]) & (pl.col("repeat") == row["repeat"]) & (pl.col("block") == row["block"]))
        capacity = float(row["wall_s"]) * int(row.get("workers") or 1)
        wall, overhead = attribute_wall(*(part[c].to_numpy().astype(np.float64) for c in ("gen_s", "env_s", "reset_s", "n_steps")), capacity)
        out.append(part.with_columns(pl.Series("wall_s_attributed", wall, dtype=pl.Float64), pl.Series("overhead_s", overhead, dtype=pl.Float64),
                                     pl.lit(row["order"], pl.Int64).alias("order")))
    df = pl.concat(out, how="vertical")
    if skipped_rows:
        df = pl.concat([df, pl.DataFrame(skipped_rows)], how="diagonal_relaxed")
    base = df.filter(pl.col("arm") == BASELINE).select("group_id", "repeat", pl.col("zero_var").alias("baseline_zero_var"), pl.col("label").alias("baseline_label"))
    df = df.join(base, on=["group_id", "repeat"], how="left")
    return df.select(
        "task_id", "task_type", "group_id", "group_index", "arm", "repeat", "block", "order", "cut", "cut_step", "gate_K",
        "n_steps", "n_gen_tokens", "n_prompt_tokens", "gen_s", "env_s", "reset_s", "overhead_s",
        pl.col("wall_s_attributed").alias("wall_s"), pl.col("wall_s").alias("group_wall_s"),
        "reward_mean", "reward_var", "zero_var", "label", "success_rate", "baseline_zero_var", "baseline_label",
        (pl.col("cut") & pl.col("baseline_zero_var")).alias("tp"), (pl.col("cut") & ~pl.col("baseline_zero_var")).alias("fp"),
        "skipped", "dapo_round", (~pl.col("skipped") & ~pl.col("cut") & ~pl.col("zero_var")).fill_null(False).alias("useful"),
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
        (pl.col("dapo_round") > 0) if "dapo_round" in table.columns else pl.lit(False))
    rows = table.select("arm", "repeat", "group_id", twinless.fill_null(False).alias("twinless")).iter_rows()
    values = [None if arm == BASELINE or arm not in compared or alone else G - missed.get((arm, r, gid), 0) for arm, r, gid, alone in rows]
    return table.with_columns(pl.Series("n_traj_matched", values, dtype=pl.Int64))


class ArmMatch(NamedTuple):
    """The seed-match proof of an arm that gets no Comparison (a DAPO arm: its groups with a
    baseline twin, i.e. the A/B's own tasks)."""

    arm: str
    match: SeedMatch


class Saving(NamedTuple):
    """One cost in both arms: totals over tasks (each task's mean over repeats), the share saved
    1 − arm/baseline, and its CI. Token and step counts are fixed by the seeds, so their CI is a
    percentile bootstrap over tasks (paired: both arms' values of a task resampled together);
    wall-clock also carries run-to-run drift, so its CI is over timed-run pairs
    (:func:`~srollout.core.stats.run_pair_saving_ci`). ``ci_over`` says which."""

    metric: str
    baseline: float
    arm: float
    saving: float
    low: float
    high: float
    ci_over: str = "tasks"


SAVED_COSTS = (("wall_s", "wall-clock (s)"), ("n_gen_tokens", "generated tokens"), ("n_prompt_tokens", "prompt tokens"), ("n_steps", "environment steps"))


@dataclass(frozen=True)
class Comparison:
    """Everything the report says about one arm against the baseline.

    savings: metric -> Saving (wall_s, n_gen_tokens, n_prompt_tokens, n_steps);
    ratio: (estimate, low, high) of wall-clock saving ÷ generated-token saving (target ≥ 0.9);
        the interval is the wall-clock saving's run-pair interval over the (seed-fixed) token saving;
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


def compare_arms(table: pl.DataFrame, tables: dict[tuple[str, int], dict[str, Path]], arm: ArmSpec, config: AbRolloutConfig,
                 blocks: pl.DataFrame) -> Comparison:
    """Score ``arm`` against the baseline: savings with CIs (wall-clock over the timed-run pairs
    of ``blocks``, counts over tasks), the cuts judged by the baseline, the seed-match proof over
    every repeat."""
    from srollout.core.stats import paired_bootstrap, relative_saving_ci, run_pair_saving_ci

    b, a = per_task_means(table, BASELINE), per_task_means(table, arm.name)
    savings = {}
    for col, label in SAVED_COSTS:
        if float(b[col].sum()) > 0:
            ci = relative_saving_ci(b[col].to_numpy(), a[col].to_numpy(), n_resamples=config.n_boot, seed=config.seed)
            savings[col] = Saving(label, float(b[col].sum()), float(a[col].sum()), ci.estimate, ci.low, ci.high)
        else:  # a non-LLM policy generates no tokens: no saving share is defined
            savings[col] = Saving(label, 0.0, float(a[col].sum()), math.nan, math.nan, math.nan)
    runs = run_pairs(blocks, arm.name)
    wall = savings["wall_s"]
    rp = run_pair_saving_ci(runs["baseline_s"].to_numpy(), runs["arm_s"].to_numpy())
    savings["wall_s"] = wall._replace(low=rp.low, high=rp.high, ci_over=f"{rp.n_pairs} timed-run pair(s)")
    tok = savings["n_gen_tokens"].saving
    ratio = (wall.saving / tok, rp.low / tok, rp.high / tok) if tok > 0 else (math.nan, math.nan, math.nan)
    diff = paired_bootstrap(b["wall_s"].to_numpy(), a["wall_s"].to_numpy(), n_resamples=config.n_boot, seed=config.seed)
    decomposition = {
        "baseline_wall": float(b["wall_s"].sum()),
        "generation": float(b["gen_s"].sum() - a["gen_s"].sum()),
        "environment": float((b["env_s"] + b["reset_s"]).sum() - (a["env_s"] + a["reset_s"]).sum()),
        "overhead": float(b["overhead_s"].sum() - a["overhead_s"].sum()),
    }
    return Comparison(
        arm=arm.name, gate=arm.describe(), n_tasks=b.height, repeats=config.repeats,
        confusion=judge_cuts(table.filter(pl.col("arm") == arm.name), config.T_max), match=arm_seed_match(tables, arm, config),
        savings=savings, ratio=ratio, task_diff=diff, decomposition=decomposition,
    )


def run_pairs(blocks: pl.DataFrame, arm: str) -> pl.DataFrame:
    """Per (repeat, block), the baseline's and ``arm``'s timed runs of the same groups:
    repeat, block, baseline_s, arm_s (machine-seconds: wall-clock × workers)."""
    def runs(name: str, col: str) -> pl.DataFrame:
        return blocks.filter(pl.col("arm") == name).select("repeat", "block", (pl.col("wall_s") * pl.col("workers")).alias(col))

    return runs(BASELINE, "baseline_s").join(runs(arm, "arm_s"), on=["repeat", "block"]).sort("repeat", "block")


def arm_seed_match(tables: dict[tuple[str, int], dict[str, Path]], arm: ArmSpec, config: AbRolloutConfig) -> SeedMatch:
    """:func:`seed_match` of ``arm`` against the baseline over every repeat, on the arm's groups
    that have a baseline twin (GRESO-skipped tasks have no trajectories; DAPO's extra groups no twin)."""
    names = ("steps", "trajectories", "groups")
    matches = []
    for r in range(config.repeats):
        base = {name: pl.read_parquet(tables[(BASELINE, r)][name]) for name in names}
        ids = base["groups"]["group_id"]
        mine = {name: pl.read_parquet(tables[(arm.name, r)][name]).filter(pl.col("group_id").is_in(ids.to_list())) for name in names}
        matches.append(seed_match(base, mine, arm.gate_K or config.T_max, repeat=r))
    n_traj = sum(m.n_traj for m in matches)
    n_match = sum(m.n_match for m in matches)
    return SeedMatch(n_traj, n_match, n_match / n_traj if n_traj else math.nan, any(m.tokens_checked for m in matches), [x for m in matches for x in m.mismatches])


ARMS_COLUMNS = (
    "arm", "gate", "dapo", "greso", "repeats", "n_tasks", "groups", "wall_s", "gen_tokens", "n_steps", "useful_groups",
    "useful_per_s", "wall_vs_baseline", "useful_per_s_vs_baseline", "cuts", "cut_tp", "cut_fp", "skipped", "skip_tp",
    "skip_fp", "extra_groups", "extra_rounds", "cap_hits", "traj_compared", "traj_matched",
)


def arms_table(table: pl.DataFrame, blocks: pl.DataFrame, arms: Sequence[ArmSpec], matches: dict[str, SeedMatch],
               config: AbRolloutConfig) -> pl.DataFrame:
    """arms.parquet: one row per arm, totals over every repeat (the same seeds each repeat; only
    timing differs), from ab.parquet (``table``) and blocks.parquet (``blocks``).

    wall_s: Σ of the arm's measured timed runs (all DAPO rounds); gen_tokens, n_steps, groups
    (rolled out); useful_groups: groups not cut with σ_r > 0 (``core.arms.is_useful``);
    useful_per_s = useful_groups / wall_s (``core.arms.arm_summary``); *_vs_baseline: ratios to the
    baseline arm; cuts with cut_tp / cut_fp judged by the baseline's group of the same task
    (cuts of DAPO's extra groups have no twin and are in neither); skipped with skip_tp / skip_fp
    (GRESO: the skipped task's baseline group was / was not zero-variance); extra_groups,
    extra_rounds and cap_hits (timed runs whose DAPO was still short at --dapo-max-rounds);
    traj_compared / traj_matched: the seed-match proof (null on the baseline).
    """
    rows = []
    for arm in arms:
        kind = arm.kind
        mine = table.filter(pl.col("arm") == arm.name)
        runs = blocks.filter(pl.col("arm") == arm.name)
        total = arm_summary([{"iter_s": w, "n_gen_tokens": t, "n_useful": u or 0} for w, t, u in runs.select("wall_s", "n_gen_tokens", "n_useful").iter_rows()])
        twins = mine.filter(pl.col("baseline_zero_var").is_not_null())
        cut, skipped = twins.filter(pl.col("cut")), mine.filter(pl.col("skipped"))
        match = matches.get(arm.name)
        rows.append({
            "arm": arm.name, "gate": kind.gate, "dapo": kind.dapo, "greso": kind.greso, "repeats": config.repeats, "n_tasks": config.groups,
            "groups": mine.filter(~pl.col("skipped")).height, "wall_s": total["wall_s"], "gen_tokens": total["gen_tokens"],
            "n_steps": int(mine["n_steps"].sum()), "useful_groups": total["useful"], "useful_per_s": total["useful_per_s"],
            "cuts": int(mine["cut"].sum()), "cut_tp": int(cut["baseline_zero_var"].sum()), "cut_fp": int((~cut["baseline_zero_var"]).sum()),
            "skipped": skipped.height, "skip_tp": int(skipped["baseline_zero_var"].sum()), "skip_fp": int((~skipped["baseline_zero_var"]).sum()),
            "extra_groups": int(runs["n_extra"].sum()), "extra_rounds": int(runs["extra_rounds"].sum()), "cap_hits": int(runs["hit_cap"].sum()),
            "traj_compared": match.n_traj if match is not None else None, "traj_matched": match.n_match if match is not None else None,
        })
    df = pl.DataFrame(rows, schema_overrides={"traj_compared": pl.Int64, "traj_matched": pl.Int64})
    base = df.filter(pl.col("arm") == BASELINE).row(0, named=True)

    def ratio(col: str) -> pl.Expr:
        return pl.col(col) / base[col] if base[col] and not math.isnan(base[col]) else pl.lit(math.nan)

    return df.with_columns(ratio("wall_s").alias("wall_vs_baseline"), ratio("useful_per_s").alias("useful_per_s_vs_baseline")).select(ARMS_COLUMNS)


# --- progress -------------------------------------------------------------------------------------


class _Progress(StageBar):
    """A rich progress bar over all (arm, repeat, block) runs: groups done, tokens/s, the run in
    progress, ETA (no-op when disabled)."""

    def __init__(self, console: Any, total: int, enabled: bool) -> None:
        super().__init__(console, "ab-rollout", total, enabled=enabled, before=("run",), unit="groups", after=("rate",))
        self.tokens = 0

    def start(self, block: Block) -> None:
        self.update(run=f"{block.arm.name} r{block.repeat} b{block.block}")

    def advance(self, n: int) -> None:
        if n:
            self.update(advance=n)

    def extend(self, n: int) -> None:
        """``n`` more groups than planned (DAPO's extra rounds)."""
        if n:
            self.total += n
            self.update(total=self.total)

    def tick(self, stats: TickStats) -> None:
        self.tokens += stats.gen_tokens
        if self.enabled:
            rate = self.tokens / max(time.perf_counter() - self.t0, 1e-9)
            self.update(rate=f"{rate:,.0f} tok/s, {stats.rows} in flight")


__all__: Sequence[str] = (
    "AbResult", "ArmSpec", "Block", "Comparison", "Confusion", "SeedMatch", "Saving", "attribute_wall", "build_arms",
    "judge_cuts", "make_schedule", "run_ab_rollout", "seed_match", "tokens_through_step",
)
