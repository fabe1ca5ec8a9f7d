"""`srollout ab-rollout`: the matched-seed wall-clock A/B (the paper's Tier 1, §5.1), done so that
it holds up to a reviewer.

The story, top to bottom (:func:`run_ab_rollout`):

1. open the run directory (``--resume`` reopens it and checks the config matches);
2. load the task set and build the groups: group i plays task i, and every trajectory's seeds
   derive from (run seed, i, traj_idx) (:mod:`srollout.rollout.seeding`), so both arms see the
   same games and draw the same samples;
3. build the arms (``--arms``, default ``baseline,gated``; any of
   :data:`srollout.core.arms.ARM_NAMES`: the gate, DAPO and GRESO switches), the policy and the
   environment factory — one policy object, shared by the arms;
4. warm up before any clock runs: every task's game is loaded once and a throw-away batch (other
   group indices, so other seeds) is rolled to T_max;
5. the schedule: R repeats × B blocks of tasks; in each block every arm rolls the block's groups
   through the same batched engine at the same concurrency, arms in ABBA order over blocks (A B |
   B A | ...); each (arm, repeat, block) run is timed alone (:func:`run_block`: GRESO skips tasks
   first, DAPO adds extra rounds), its records written after its clock stops, its totals saved
   as ``<arm>/r<repeat>/block-<b>.json`` (what makes ``--resume`` work); with ``--workers N``
   (N > 1) every rollout call runs on N Ray workers (:mod:`srollout.stages.ab_rollout.roller`);
   with ``--audit F`` each gated arm's threshold moves from one of its timed runs to the next
   (:mod:`srollout.stages.ab_rollout.audit`);
6. merge each (arm, repeat) into steps/trajectories/groups/signals.parquet under
   ``<arm>/r<repeat>/`` (each a collect-format buffer ``srollout analyze`` reads);
7. score: per (task, arm, repeat) costs with each run's wall-clock attributed to its tasks, the
   seed-match proof, cuts judged by the baseline arm's outcome of the same task and seeds,
   savings with paired bootstrap CIs over tasks (:func:`srollout.core.ab_scoring.compare_arms`,
   arms without DAPO), and per arm wall-clock, tokens and useful groups per second
   (:func:`srollout.stages.ab_rollout.tables.arms_table`); ``ab.parquet``, ``arms.parquet``,
   ``report.md``, figures.

DAPO and GRESO arms without training, and how a batched run's wall-clock is charged to its
tasks (the charges sum exactly to the measured wall-clock): docs/ab-rollout.md.

Where the pieces live: this module tells the story and runs the arms' blocks (DAPO, GRESO);
``schedule`` (the ABBA schedule, block files), ``roller`` (the timed engine call, in process or on
Ray, and the warm-up), ``tables`` (ab / blocks / arms tables from the files); the pure scoring is
:mod:`srollout.core.ab_scoring`, the shared builders :mod:`srollout.stages.rollout_setup`.
"""

from __future__ import annotations

import contextlib
import functools
import json
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import polars as pl

from srollout.config import AbRolloutConfig, DistConfig
from srollout.core.ab_scoring import ArmMatch, Comparison, compare_arms, with_seed_match
from srollout.core.arms import (
    ArmSpec,
    DapoRound,
    GresoOutcome,
    Skipper,
    greso_outcomes,
    is_useful,
    make_skipper,
    parse_arm,
    record_outcomes,
    roll_arm,
)
from srollout.core.gate import describe_gate
from srollout.errors import SrolloutError
from srollout.progress import RolloutBar
from srollout.rollout.engine import GroupRecord, GroupSpec, RolloutSummary, make_specs
from srollout.rollout.ray_pool import ray_session, require_ray
from srollout.stages.ab_rollout.audit import (
    arm_auditors,
    arm_iterations,
    audit_block,
    audited_block,
    check_auditable,
)
from srollout.stages.ab_rollout.roller import Roller
from srollout.stages.ab_rollout.schedule import (
    Block,
    arm_dir,
    block_file,
    extra_start,
    make_schedule,
    warm_tasks,
)
from srollout.stages.ab_rollout.tables import (
    ARMS_AB_COLUMNS,
    ab_table,
    arm_seed_match,
    arm_stops,
    arms_table,
    blocks_table,
)
from srollout.stages.rollout_setup import RolloutPlan, plan_rollout

# --- arms ---------------------------------------------------------------------------------------


def build_arms(config: AbRolloutConfig, plan: RolloutPlan) -> tuple[ArmSpec, ...]:
    """The arms of ``--arms`` in schedule order, the baseline first; the gated, stall and loop arms
    share the plan's gate objects (:func:`srollout.stages.rollout_setup.plan_gates`)."""
    return tuple(
        parse_arm(name).with_gate(plan.gate, plan.gate_K, plan.traj_gate, plan.loop_gate)
        for name in config.arms
    )


# --- DAPO and GRESO inside one timed run ----------------------------------------------------------


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
        raise SrolloutError(
            f"--greso-history {file}: not a readable Parquet file ({type(err).__name__})"
        ) from err
    for col in ("task_id", "zero_var"):
        if col not in df.columns:
            raise SrolloutError(
                f"--greso-history {file}: missing column '{col}' (a groups table has it)"
            )
    cut = pl.col("cut").fill_null(False) if "cut" in df.columns else pl.lit(False)
    rows = df.select(
        pl.col("task_id").cast(pl.Utf8),
        pl.int_range(pl.len()).over("task_id") - pl.len().over("task_id"),  # -n .. -1 per task
        pl.col("zero_var").fill_null(False) | cut,
    )
    return [GresoOutcome(task, int(i), bool(z)) for task, i, z in rows.iter_rows()]


class BlockRun(NamedTuple):
    """One timed (arm, repeat, block) run: ``records`` every group rolled out, round by round;
    ``summary`` the engine's totals summed over the rounds (wall_s: the sum of their wall-clocks);
    ``skipped`` the group ids GRESO skipped; ``rounds`` / ``round_ids`` each round that rolled out
    groups and its group ids; ``hit_cap``: DAPO was still short after --dapo-max-rounds."""

    records: list[GroupRecord]
    summary: RolloutSummary
    skipped: list[str]
    rounds: tuple[DapoRound, ...]
    round_ids: list[list[str]]
    hit_cap: bool


# roll(specs, arm) -> (records, summary): one timed engine call, in this process or on Ray workers
RollFn = Callable[[Sequence[GroupSpec], ArmSpec], tuple[list[GroupRecord], RolloutSummary]]


def run_block(
    block: Block,
    roll: RollFn,
    config: AbRolloutConfig,
    tasks: Sequence[Any],
    skipper: Skipper | None = None,
    workers: int = 1,
) -> BlockRun:
    """Run ``block`` in its arm's way: GRESO (``skipper``, iteration = the repeat) drops tasks
    first; the rest is one ``roll`` call, or, in a DAPO arm, :func:`srollout.core.arms.dapo_fill`
    over rounds: round 0 rolls the block's tasks, round r >= 1 the next n_needed groups from
    :func:`extra_start` on (``tasks``: the task set). Never raises at DAPO's cap."""
    specs = list(block.specs)
    summaries: list[RolloutSummary] = []
    round_ids: list[list[str]] = []

    def roll_round(batch: list[GroupSpec]) -> list[GroupRecord]:
        if not batch:
            return []
        records, summary = roll(batch, block.arm)
        summaries.append(summary)
        round_ids.append([s.group_id for s in batch])
        return sorted(records, key=lambda rec: rec.spec.index)

    def refill(r: int, n_needed: int) -> list[GroupRecord]:
        start = extra_start(config, block) + sum(len(ids) for ids in round_ids[1:])
        return roll_round(make_specs(tasks, start + n_needed, start))

    run = roll_arm(
        block.arm,
        specs,
        roll_round,
        refill,
        iteration=block.repeat,
        skipper=skipper,
        task_ids=[s.task.task_id for s in specs],
        max_rounds=config.dapo_max_rounds,
        tokens=lambda record: sum(t.n_gen_tokens for t in record.trajs),
        warn=False,  # its warning speaks of training; the report says it here
    )
    skipped = [specs[i].group_id for i in run.skipped]
    if len(summaries) == 1 and workers == 1:  # one round in this process: as it is
        summary = summaries[0]
    else:
        summary = RolloutSummary.total(summaries, sum(s.wall_s for s in summaries), workers)
    return BlockRun(list(run.generated), summary, skipped, run.rounds, round_ids, run.hit_cap)


# --- the story ------------------------------------------------------------------------------------


class AbResult(NamedTuple):
    """run_dir; paths: output name -> path; comparisons: one per non-baseline arm without DAPO;
    arms: arms.parquet (one row per arm: wall-clock, tokens, useful groups per second, ...)."""

    run_dir: Path
    paths: dict[str, Path]
    comparisons: list[Comparison]
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
    plan: RolloutPlan | None = None,
) -> AbResult:
    """Run the A/B as configured; return where the files are, one comparison per arm without DAPO
    and the per-arm summary.

    policy / env_factory / tasks: use these instead of building them (tests; pickled to every Ray
    worker with ``dist.workers`` > 1). dist: ``--workers`` (None or 1: in this process), not part of
    the resume key. plan: what :func:`srollout.stages.rollout_setup.plan_rollout` resolved once
    (resolved here when None).
    """
    from srollout.rollout.parts import merge_parts, write_part
    from srollout.rollout.records import group_tables
    from srollout.rundir import Manifest, check_resumable, prepare_run_dir
    from srollout.schemas import write_json

    t0 = time.perf_counter()
    dist = dist or DistConfig()
    if dist.workers > 1:  # before the run directory exists: a missing extra leaves nothing behind
        require_ray(dist.workers)
    # an unknown --env or one off the TextEnv protocol, a bad task set or gate.json (or one
    # --audit cannot move), a missing backend, a damaged model, a silent server or a bad GRESO
    # history fails here, before anything is written
    if plan is None:
        plan = plan_rollout(
            config,
            arms=[parse_arm(name) for name in config.arms],
            tasks=tasks,
            check_env=tasks is None and env_factory is None,
            check_policy=policy is None,
        )
    arms = build_arms(config, plan)
    check_auditable(config, arms)
    tasks = list(plan.tasks)
    history = (
        load_greso_history(config.greso_history)
        if config.greso_history is not None and any(a.greso for a in arms)
        else []
    )
    # 1. the run directory
    run_dir = prepare_run_dir(
        config.out, "ab-rollout", overwrite=config.overwrite, resume=config.resume
    )
    if config.resume:
        check_resumable(run_dir, "ab-rollout", config.resume_key(), "timed blocks")
    manifest = Manifest(run_dir, "ab-rollout", config)

    # 2. groups: the same specs, hence the same seeds, in every arm
    specs = make_specs(tasks, config.groups)
    schedule = make_schedule(arms, specs, config.repeats, config.blocks)
    todo = [b for b in schedule if not block_file(run_dir, b).exists()]
    manifest.update(
        arms={a.name: describe_gate(a.gate_rule, a.gate_K) for a in arms},
        traj_gates={a.name: a.traj_gate.to_dict() for a in arms if a.traj_gate is not None},
        n_tasks_in_set=len(tasks),
        env=config.env,
        resumed_blocks=len(schedule) - len(todo),
        workers=dist.workers,
        greso_history=len(history) if history else None,
    )
    # GRESO: one skipper per arm, fed the history, then every finished block's groups (resume too)
    skippers = {
        a.name: make_skipper(a, seed=config.seed, p_explore=config.greso_p_explore, history=history)
        for a in arms
        if a.greso
    }
    for b in schedule:
        if b not in todo and b.arm.name in skippers:
            done = json.loads(block_file(run_dir, b).read_text())
            record_outcomes(skippers[b.arm.name], b.repeat, done.get("greso_outcomes", []))
    # --audit: one auditor per gated arm, its ledger cut back to the arm's finished timed runs
    auditors = arm_auditors(config, arms, schedule, todo, run_dir)
    iterations = arm_iterations(schedule)

    # 3-5. policy, environments, warm-up, the timed runs
    distributed = dist.workers > 1 and bool(todo)
    # --- workers > 1: each Ray worker builds (and warms up) its own policy replica
    roller = (
        Roller(
            config,
            dist.workers if distributed else 1,
            policy,
            env_factory,
            warm_tasks(config, arms, specs, tasks),
            specs,
            plan,
            chunk_groups=dist.chunk_groups,
        )
        if todo
        else None
    )
    manifest.update(policy=roller.policy_name if roller is not None else None)
    with (
        ray_session(dist.workers) if distributed else contextlib.nullcontext() as where,
        RolloutBar(
            console,
            "ab-rollout",
            sum(len(b.specs) for b in schedule),
            enabled=progress,
            before=("run",),
        ) as show,
    ):
        if roller is not None:
            roller.show = show
        show.advance(sum(len(b.specs) for b in schedule if b not in todo))
        for block in todo:
            show.update(run=f"{block.arm.name} r{block.repeat} b{block.block}")
            auditor = auditors.get(block.arm.name)
            roll = roller.roll
            if auditor is not None:  # the gate the audit chose after the arm's last timed run
                block = audited_block(block, auditor)
                roll = functools.partial(roller.roll, audit=auditor)
            run = run_block(
                block, roll, config, tasks, skippers.get(block.arm.name), workers=roller.workers
            )
            show.advance(len(run.skipped))
            # written after the clock stopped: disk I/O is no part of any arm's time
            for record in run.records:
                write_part(
                    arm_dir(run_dir, block.arm.name, block.repeat),
                    record.group_id,
                    group_tables(record, audit=config.audit > 0),
                )
            data = block_data(block, run, roller.workers, roller.take_dist())
            if auditor is not None:  # audit.json first: on resume it is cut back to the blocks
                data["audit"] = audit_block(auditor, run.records, iterations[block.order])
            write_json(data, block_file(run_dir, block))
            if block.arm.name in skippers:
                record_outcomes(skippers[block.arm.name], block.repeat, data["greso_outcomes"])
    if distributed:
        manifest.update(dist={"ray": where, "workers": dist.workers})

    # 6. one collect-format buffer per (arm, repeat), groups in index order
    block_jsons = [json.loads(block_file(run_dir, b).read_text()) for b in schedule]
    rolled: dict[tuple[str, int], list[str]] = {}
    for b, data in zip(schedule, block_jsons, strict=True):
        rolled.setdefault((b.arm.name, b.repeat), []).extend(data["group_ids"])
    tables = {
        (a.name, r): merge_parts(arm_dir(run_dir, a.name, r), sorted(rolled.get((a.name, r), [])))
        for a in arms
        for r in range(config.repeats)
    }

    # 7. score, report
    from srollout.report.ab import write_ab_outputs

    blocks = blocks_table(schedule, block_jsons)
    table = ab_table(tables, blocks, schedule, block_jsons)
    comparisons = [
        compare_arms(
            table,
            blocks,
            arm.name,
            arm_seed_match(tables, arm, config),
            gate=describe_gate(arm.gate_rule, arm.gate_K)
            or (arm.traj_gate.to_dict() if arm.traj_gate is not None else None),
            T_max=config.T_max,
            repeats=config.repeats,
            n_boot=config.n_boot,
            seed=config.seed,
        )
        for arm in arms[1:]
        if not arm.dapo
    ]
    matches = [
        *comparisons,
        *(ArmMatch(arm.name, arm_seed_match(tables, arm, config)) for arm in arms[1:] if arm.dapo),
    ]
    table = with_seed_match(table, matches, config.G)
    # the arms' columns after the older ones, then --audit's
    audit_columns = [c for c in ("audited",) if c in table.columns]
    later = (*ARMS_AB_COLUMNS, *audit_columns)
    older_columns = [c for c in table.columns if c not in later]
    table = table.select([*older_columns, *later])
    stops = {a.name: arm_stops(tables, a, config) for a in arms[1:] if a.traj_gate is not None}
    summary = arms_table(table, blocks, arms, {m.arm: m.match for m in matches}, config, stops)
    paths = write_ab_outputs(
        run_dir, config, table, blocks, comparisons, tables, arms=summary, env=plan.env
    )
    manifest.data["timings_s"].update(
        warmup=round(roller.warm_s if roller else 0.0, 3),
        timed_runs=round(float(blocks["wall_s"].sum()), 3),
    )
    outputs = [*paths.values(), *(p for t in tables.values() for p in t.values())]
    outputs += [f for a in auditors.values() for f in a.files()]  # --audit: the ledgers
    manifest.complete(
        outputs,
        comparisons=[c.headline() for c in comparisons],
        arms_summary=summary.to_dicts(),
        wall_s_process=round(time.perf_counter() - t0, 3),
    )
    return AbResult(run_dir, paths, comparisons, summary)


def block_data(
    block: Block, run: BlockRun, workers: int, dist: dict[str, Any] | None
) -> dict[str, Any]:
    """What ``block-<b>.json`` keeps of a timed run: its place in the schedule, the groups rolled
    out (all rounds), the engine's totals, GRESO's skips and outcomes, DAPO's rounds."""
    data = {
        "order": block.order,
        "repeat": block.repeat,
        "block": block.block,
        "arm": block.arm.name,
        "group_ids": [r.group_id for r in run.records],
        "summary": run.summary._asdict(),
        "workers": workers,
        "skipped_ids": run.skipped,
        "hit_cap": run.hit_cap,
        "n_useful": sum(map(is_useful, run.records)),
        "rounds": [
            {**rd._asdict(), "group_ids": ids}
            for rd, ids in zip(run.rounds, run.round_ids, strict=True)
        ],
    }
    if block.arm.greso:
        data["greso_outcomes"] = [list(o) for o in greso_outcomes(run.records)]
    if dist is not None:
        data["dist"] = dist
    return data
