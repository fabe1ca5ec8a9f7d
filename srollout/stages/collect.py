"""`srollout collect`: roll out G trajectories per task, record steps, outcomes and signals.

The story, top to bottom (:func:`run_collect`):

1. open the run directory (``--resume`` reopens it and checks the config matches);
2. load the task set and build the groups (group i plays task i; seeds derive from i);
3. build the policy (the LM, the planner, or the noisy planner) and the environment factory;
4. roll out the groups that are not finished yet through the batched engine, with the gate at
   step K when one is asked for (off by default, so outcomes are complete); with ``--workers N``
   (N > 1) the same engine runs on N Ray workers (:mod:`srollout.rollout.ray_pool`) and the groups
   stream back here, so steps 5-6 and ``--resume`` are the same whatever N; with ``--audit F``
   the groups go chunk by chunk in this process, the gate's threshold moving between chunks
   (:mod:`srollout.stages.collect_audit`);
5. write each finished group atomically as a part (that is what makes ``--resume`` exact);
6. merge the parts in group order into steps / trajectories / groups / signals.parquet, and
   write the summary table, ``report.md`` and the manifest (with ``--audit``: ``audit.parquet``).
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import polars as pl

from srollout.config import CollectConfig, DistConfig
from srollout.core.gate import describe_gate
from srollout.errors import SrolloutError
from srollout.progress import RolloutBar
from srollout.rollout.audits import Audit
from srollout.rollout.engine import (
    GroupRecord,
    GroupSpec,
    RolloutSettings,
    RolloutSummary,
    TickStats,
    make_specs,
    run_groups,
    select,
)
from srollout.rollout.parts import finished_groups, merge_parts, write_part
from srollout.rollout.records import group_tables
from srollout.rundir import Manifest, check_resumable, prepare_run_dir
from srollout.schemas import LABELS
from srollout.stages.collect_audit import ONE_PROCESS, AuditSummary, CollectAudit
from srollout.stages.rollout_setup import RolloutPlan, build_policy, plan_rollout, resume_hint


class CollectStats(NamedTuple):
    """Headline numbers of a collect run (over all its groups, resumed ones included).

    rates are fractions in [0, 1]; valid_rate is over steps; wall_s, tok_per_s and
    gen_tok_per_s are of this process only (a resumed run measures its own part). Two
    throughputs, both of generated tokens: ``tok_per_s`` over the rollout's wall-clock (what the
    progress bar shows), ``gen_tok_per_s`` over the time spent inside the policy's generate
    calls only (the backend's own speed; environment steps and bookkeeping excluded). With
    ``workers`` > 1 that time is summed over the workers, so the second is one worker's speed
    and the first can be the larger.
    """

    n_groups: int
    label_counts: dict[str, int]
    zero_var_rate: float
    success_rate: float
    valid_rate: float
    n_cut: int
    n_stalled: int
    n_steps: int
    n_gen_tokens: int
    wall_s: float
    tok_per_s: float
    gen_tok_per_s: float
    resumed_groups: int
    workers: int = 1


class CollectResult(NamedTuple):
    """run_dir: the run directory; paths: table name -> Parquet path; stats; summary: the
    engine's totals for the groups this process rolled out; audit: with ``--audit``, the audit's
    totals (all chunks, resumed ones included)."""

    run_dir: Path
    paths: dict[str, Path]
    stats: CollectStats
    summary: RolloutSummary
    audit: AuditSummary | None = None


def run_collect(
    config: CollectConfig,
    console: Any = None,
    progress: bool = True,
    dist: DistConfig | None = None,
    plan: RolloutPlan | None = None,
) -> CollectResult:
    """Run ``collect`` as configured; return where the files are and the headline numbers.

    dist: ``--workers`` (None or 1 worker: in this process, Ray never imported). The number of
    workers is not part of the resume key: a run may be resumed with another N. With ``--audit``
    the run is in this process whatever N (:data:`srollout.stages.collect_audit.ONE_PROCESS`).
    plan: the environment, task set, model and gates, resolved once
    (:func:`srollout.stages.rollout_setup.plan_rollout`; resolved here when None).
    """
    t0 = time.perf_counter()
    if dist is not None and dist.workers > 1 and config.audit > 0:
        if console is not None:
            console.print(f"--workers {dist.workers}: {ONE_PROCESS}", style="dim", highlight=False)
        dist = None
    dist = dist if dist is not None else DistConfig()
    if dist.workers > 1:  # before the run directory exists: a missing extra leaves nothing behind
        from srollout.rollout.ray_pool import require_ray

        require_ray(dist.workers)
    # an unknown --env or one off the TextEnv protocol, a bad gate.json, a missing backend, a
    # damaged model or a silent server: each one line, and nothing written
    plan = plan if plan is not None else plan_rollout(config)
    gate, gate_K, traj_gate = plan.gate, plan.gate_K, plan.traj_gate
    if config.audit > 0:  # a gate --audit cannot move leaves nothing behind
        Audit.of(config, gate, traj_gate)
    run_dir = prepare_run_dir(
        config.out, "collect", overwrite=config.overwrite, resume=config.resume
    )
    if config.resume:  # a run made with other settings: its groups would not match
        check_resumable(run_dir, "collect", config.resume_key(), "groups")

    # 2. tasks and groups
    tasks = plan.tasks
    specs = make_specs(tasks, config.groups)
    done_ids = finished_groups(run_dir) if config.resume else []
    # --audit: the finished chunks are kept, every later one is rolled out again whole
    audit = CollectAudit.start(config, gate, traj_gate, run_dir) if config.audit > 0 else None
    if audit is not None:
        done_ids = audit.done_ids(specs)
    todo = select(specs, done_ids)
    manifest = Manifest(run_dir, "collect", config)
    manifest.update(resumed_groups=len(done_ids), n_tasks_in_set=len(tasks), env=config.env)

    # 3. policy, environments, the ReAct protocol, the gate
    settings = RolloutSettings(
        G=config.G,
        T_max=config.T_max,
        seed=config.seed,
        concurrency=config.concurrency,
        signal_K=tuple(config.signal_K),
        gate=gate,
        gate_K=gate_K,
        # a shadow run cuts nothing: its outcomes are an ungated collect's
        arm="gated"
        if (gate is not None or traj_gate is not None) and not config.shadow
        else "collect",
        traj_gate=traj_gate,
        shadow=config.shadow,
    )
    distributed = dist.workers > 1 and bool(todo)
    # --- workers > 1: each Ray worker builds its own policy replica from the recipe
    try:
        policy = build_policy(config, plan.model_dir) if todo and not distributed else None
    except SrolloutError:
        if not config.resume:  # the directory this call made holds nothing yet: leave none behind
            shutil.rmtree(run_dir, ignore_errors=True)
        raise
    env_factory = plan.env_factory(expert=config.policy != "lm")
    manifest.update(
        policy=getattr(policy, "name", None),
        gate=describe_gate(gate, gate_K),
        traj_gate=traj_gate.to_dict() if traj_gate is not None else None,
        workers=dist.workers,
    )
    if plan.model_dir is not None:
        from srollout.policy.model_files import model_provenance
        from srollout.policy.shipped import SHIPPED_DIR

        manifest.update(model=model_provenance(plan.model_dir, SHIPPED_DIR))

    # 4-5. roll out; each finished group becomes a part file at once
    def on_group(record: GroupRecord) -> None:
        tables = group_tables(record, audit=audit is not None, shadow=config.shadow)
        write_part(run_dir, record.group_id, tables)
        show.advance(1)

    prompter = plan.prompter() if todo else None
    bar = RolloutBar(console, "collect", len(specs), enabled=progress, completed=len(done_ids))
    with resume_hint(run_dir, "collect"), bar as show:

        def roll(
            batch: Sequence[GroupSpec], chunk_settings: RolloutSettings, keep: list | None = None
        ) -> RolloutSummary:
            """One engine call in this process (the groups also kept in ``keep`` when given)."""
            done = on_group if keep is None else (lambda r: (keep.append(r), on_group(r)))
            return run_groups(
                batch, policy, env_factory, prompter, chunk_settings, done, on_tick=show.tick
            )

        if audit is not None:
            # each chunk's (records, summary): the audit labels the records
            chunks = audit.run(todo, settings, lambda b, s: ((k := []), roll(b, s, k)))
            wall = sum(c.wall_s for c in chunks)
            summary = RolloutSummary.total(chunks, wall) if chunks else _empty_summary()
        elif distributed:
            summary = _run_distributed(
                todo, config, settings, dist, manifest, plan, on_group, show.tick
            )
        else:
            summary = roll(todo, settings) if todo else _empty_summary()

    # 6. merge, summarise, report
    missing = sorted(set(s.group_id for s in specs) - set(finished_groups(run_dir)))
    if missing:
        raise SrolloutError(f"{run_dir}: groups {missing[:3]} have no part after the rollout")
    paths = merge_parts(run_dir, [s.group_id for s in specs])
    stats = summarise(paths, summary, len(done_ids), dist.workers if distributed else 1)
    audited = None
    if audit is not None:
        from srollout.schemas import AUDIT
        from srollout.schemas import write as write_parquet

        paths["audit"] = write_parquet(audit.table(), run_dir / AUDIT.filename, AUDIT)
        audited = audit.summary()
        manifest.update(audit={"chunk_groups": audit.chunk_groups, **audited._asdict()})
    report = write_collect_report(
        run_dir,
        config,
        stats,
        summary,
        paths,
        workers=dist.workers if distributed else 1,
        audit=audited,
        gate=describe_gate(gate, gate_K),
    )
    manifest.data["timings_s"].update(
        rollout=round(summary.wall_s, 3),
        generation=round(summary.gen_s, 3),
        env_step=round(summary.env_s, 3),
        env_reset=round(summary.reset_s, 3),
        overhead=round(summary.overhead_s, 3),
    )
    manifest.complete(
        [*paths.values(), report, *(audit.files() if audit is not None else [])],
        stats=stats._asdict(),
        rollout=summary._asdict(),
        wall_s_process=round(time.perf_counter() - t0, 3),
    )
    return CollectResult(run_dir, paths, stats, summary, audited)


# --- building blocks the story uses ------------------------------------------------------------


# `--workers auto`: Ray workers only when each gets this many groups or more, which pay for a
# worker's ~9 s start-up (2-3 groups' work; measured: docs/scaling.md).
AUTO_GROUPS_PER_WORKER = 16


def auto_workers(config: CollectConfig, env: Any = None) -> tuple[int, str]:
    """What ``--workers auto`` (collect's default) runs on, and why (the rule: docs/scaling.md;
    usable cores capped by ``$OMP_NUM_THREADS`` when set; with ``--audit``: 1,
    :data:`srollout.stages.collect_audit.ONE_PROCESS`). env: ``--env``'s EnvSpec as the plan
    resolved it (resolved here when None)."""
    import importlib.util

    if config.audit > 0:
        return 1, ONE_PROCESS

    from srollout.stages.buffer import usable_cores

    cores = usable_cores()
    omp = os.environ.get("OMP_NUM_THREADS", "")
    if omp.isdigit() and int(omp) > 0:
        cores = min(cores, int(omp))
    if config.policy != "lm" or config.backend != "transformers":
        return 1, "one process: only the transformers LM is spread over workers by default"
    if env is None:
        from srollout.envs.registry import resolve_env

        env = resolve_env(config.env)
    if not env.auto_workers:  # its module must import on every worker
        return 1, f"one process: --env {config.env}; ask for --workers N to spread it"
    if os.environ.get("RAY_ADDRESS"):
        return 1, "one process: $RAY_ADDRESS is set; ask for --workers N to use that cluster"
    if cores < 2:
        return 1, "one process: one usable core"
    n = min(cores, config.groups // AUTO_GROUPS_PER_WORKER)
    if n < 2:
        return 1, f"one process: {config.groups} groups do not pay for workers' start-up"
    if importlib.util.find_spec("ray") is None:
        return 1, "one process: Ray is not installed (pip install 'srollout[dist]')"
    per = "one per core" if n == cores else f"{AUTO_GROUPS_PER_WORKER}+ groups each, {cores} cores"
    return n, f"{n} Ray workers of 1 torch thread, {per} ({config.groups} groups)"


def summarise(
    paths: dict[str, Path], summary: RolloutSummary, resumed: int, workers: int = 1
) -> CollectStats:
    """Headline numbers from the merged tables (all groups) and this process's engine totals."""
    groups = pl.read_parquet(paths["groups"])
    trajs = pl.read_parquet(
        paths["trajectories"], columns=["success", "n_gen_tokens", "n_steps", "ended_by"]
    )
    steps = pl.read_parquet(paths["steps"], columns=["valid"])
    counts = {label: int((groups["label"] == label).sum()) for label in LABELS}
    return CollectStats(
        n_groups=groups.height,
        label_counts=counts,
        zero_var_rate=float(groups["zero_var"].mean()),
        success_rate=float(trajs["success"].mean()),
        valid_rate=float(steps["valid"].mean()) if steps.height else float("nan"),
        n_cut=int(groups["cut"].sum()),
        n_stalled=int((trajs["ended_by"] == "stalled").sum()),
        n_steps=int(trajs["n_steps"].sum()),
        n_gen_tokens=int(trajs["n_gen_tokens"].sum()),
        wall_s=summary.wall_s,
        # a non-LLM policy generates no tokens: its throughput is undefined, not zero
        tok_per_s=summary.n_gen_tokens / summary.wall_s
        if summary.n_gen_tokens > 0 and summary.wall_s > 0
        else float("nan"),
        gen_tok_per_s=summary.n_gen_tokens / summary.gen_s
        if summary.n_gen_tokens > 0 and summary.gen_s > 0
        else float("nan"),
        resumed_groups=resumed,
        workers=workers,
    )


def stats_frame(stats: CollectStats) -> pl.DataFrame:
    """The summary table (metric, value) shown on the console and in report.md."""
    rows = [
        ("groups", str(stats.n_groups)),
        *(
            (f"label {label}", f"{n} ({n / max(stats.n_groups, 1):.0%})")
            for label, n in stats.label_counts.items()
        ),
        ("zero-variance rate", f"{stats.zero_var_rate:.1%}"),
        ("success rate (trajectories)", f"{stats.success_rate:.1%}"),
        ("valid-action rate (steps)", f"{stats.valid_rate:.1%}"),
        ("groups cut by the gate", str(stats.n_cut)),
        *(
            [("trajectories stopped by the trajectory gate", str(stats.n_stalled))]
            if stats.n_stalled
            else []
        ),
        ("environment steps", str(stats.n_steps)),
        ("generated tokens", str(stats.n_gen_tokens)),
        ("rollout wall-clock (this process)", f"{stats.wall_s:.1f} s"),
        ("throughput (generated tokens ÷ rollout wall-clock)", _tok_s(stats.tok_per_s)),
        (
            "generation speed (tokens ÷ time inside generate)"
            if stats.workers <= 1
            else f"generation speed of one worker (tokens ÷ time inside generate, summed over "
            f"the {stats.workers} workers)",
            _tok_s(stats.gen_tok_per_s),
        ),
    ]
    if stats.resumed_groups:
        rows.append(("groups kept from the interrupted run", str(stats.resumed_groups)))
    return pl.DataFrame(rows, schema={"metric": pl.Utf8, "value": pl.Utf8}, orient="row")


def _tok_s(rate: float) -> str:
    return "—" if rate != rate else f"{rate:,.0f} tok/s"


def write_collect_report(
    run_dir: Path,
    config: CollectConfig,
    stats: CollectStats,
    summary: RolloutSummary,
    paths: dict[str, Path],
    workers: int = 1,
    audit: AuditSummary | None = None,
    gate: dict[str, Any] | None = None,
) -> Path:
    """``report.md``: the summary, a per-task-type breakdown, the signal means by label, the files
    (with ``--audit``, the audit per chunk).

    workers: Ray rollout workers of this process's rollout (1: in process); with several, the
    engine's times are summed over workers and "other" is worker-seconds spent on neither.
    gate: the group gate as the manifest records it (None: off)."""
    from srollout.envs.tasks import rooms_note
    from srollout.report.markdown import Section, doc_link, write_report
    from srollout.report.tables import to_markdown

    groups = pl.read_parquet(paths["groups"])
    by_type = (
        groups.group_by("task_type")
        .agg(
            pl.len().alias("groups"),
            pl.col("success_rate").mean().alias("success_rate"),
            *((pl.col("label") == label).sum().alias(label) for label in LABELS),
            pl.col("zero_var").mean().alias("zero_var_rate"),
        )
        .sort("task_type")
    )
    signals = pl.read_parquet(paths["signals"])
    d_by_label = (
        signals.group_by("K", "label")
        .agg(pl.col("prefix_edit_distance_mean").mean().alias("mean d_K"), pl.len().alias("groups"))
        .sort("K", "label")
        if signals.height
        else None
    )
    gate_line = (
        "off (outcomes are complete)"
        if gate is None
        else (
            f"on: {json.dumps(gate)}. Labels of cut groups come "
            "from their truncated rewards (logging only); an A/B (`srollout ab-rollout`) judges "
            "them by the baseline arm."
        )
    )
    engine = (
        f"{summary.ticks} batched policy calls, mean batch {summary.mean_batch:.1f} rows "
        f"(concurrency {config.concurrency}); generation {summary.gen_s:.1f} s, env steps "
        f"{summary.env_s:.1f} s, env resets {summary.reset_s:.1f} s, other "
        f"{summary.overhead_s:.1f} s."
    )
    if workers > 1:
        engine += (
            f" Rolled out on {workers} Ray workers (concurrency "
            "per worker); these times are worker-seconds "
            'summed over workers, "other" includes worker start-up and idle time; wall-clock '
            f"{summary.wall_s:.1f} s."
        )
    sections = [
        Section("Summary", to_markdown(stats_frame(stats))),
        Section(
            "Settings",
            f"environment `{config.env}`, task set `{config.tasks}`"
            f"{rooms_note(config.tasks, config.difficulty) if config.env == 'alfworld' else ''}, "
            f"policy "
            f"`{config.policy}`, G={config.G}, T_max={config.T_max}, temperature "
            f"{config.temperature}, top-p {config.top_p}, seed {config.seed}; gate "
            f"{gate_line}\n\n{engine}",
        ),
        Section("By task type", to_markdown(by_type)),
    ]
    if config.shadow:
        from srollout.stages.collect_shadow import SHADOW_NOTE, shadow_frame, shadow_scores

        table = to_markdown(shadow_frame(shadow_scores(paths)))
        sections.insert(
            1, Section("What the gates would have done (shadow)", f"{table}\n\n{SHADOW_NOTE}")
        )
    if d_by_label is not None:
        sections.append(Section("Prefix edit distance d_K by label", to_markdown(d_by_label)))
    if audit is not None and "audit" in paths:
        sections.append(
            Section(
                f"Audited gate (--audit {config.audit:g}, floor {config.audit_floor:g})",
                audit.line().replace("\n", ".\n\n")
                + f".\n\nThe threshold (and the trajectory gate's W) moves between chunks of "
                f"{audit.chunk_groups} groups (by group index); audited cuts and stops ran on "
                "(`audited`, `audited_stop`; "
                + doc_link(
                    "gates.md",
                    "The audited gate (`--audit F --audit-floor P`: train-onpolicy, collect, "
                    "ab-rollout)",
                )
                + "). Per chunk (`audit.parquet`):\n\n"
                + to_markdown(pl.read_parquet(paths["audit"])),
            )
        )
    sections.append(Section("Files", "\n".join(f"- `{p.name}`" for p in paths.values())))
    return write_report(run_dir, "srollout collect", sections)


def _run_distributed(
    todo: Sequence[Any],
    config: CollectConfig,
    settings: RolloutSettings,
    dist: DistConfig,
    manifest: Manifest,
    plan: RolloutPlan,
    on_group: Callable[[GroupRecord], None],
    on_tick: Callable[[TickStats], None],
) -> RolloutSummary:
    """Step 4 on ``dist.workers`` Ray workers, each as this process would roll out (the plan's
    model directory, not resolved again by every worker; ``--concurrency`` is per worker); the
    manifest records where it ran and the restarts."""
    from functools import partial

    from srollout.rollout.ray_pool import WorkerRecipe, ray_session, run_groups_distributed

    recipe = WorkerRecipe(
        make_policy=partial(build_policy, config, plan.model_dir),
        env_factory=plan.env_factory(expert=config.policy != "lm"),
        prompter=plan.prompter(),
        settings=settings,
        threads=1 if config.policy == "lm" else None,
    )
    started: list[Any] = []
    with ray_session(dist.workers) as where:
        result = run_groups_distributed(
            todo,
            recipe,
            dist.workers,
            on_group=on_group,
            on_tick=on_tick,
            chunk_groups=dist.chunk_groups,
            on_worker=lambda slot, info, actor: started.append(info),
        )
    names = [f"{info.host}:{info.pid}" for info in started]
    manifest.update(
        policy=started[0].policy if started else None,
        dist={
            "ray": where,
            "workers": result.workers,
            "replaced": result.replaced,
            "chunks": result.chunks,
            "worker_processes": names,
            "worker_nodes": [info.node for info in started],
            "nodes": len({info.node for info in started}),
            "policy_build_s": [round(b, 3) for b in result.build_s],
            "worker_start_s": round(result.start_s, 3),
        },
    )
    return result.summary


def _empty_summary() -> RolloutSummary:
    return RolloutSummary(0, 0.0, 0.0, 0.0, 0.0, 0.0, 0, 0, 0.0, 0, 0, 0)
