"""`srollout train-onpolicy`: on-policy GRPO per seed, baseline vs gated arm, held-out eval (Tier 3,
§5.3; docs/training.md).

The story (:func:`run_train_onpolicy`):

1. open the run directory (``--resume`` reopens it and checks the config matches);
2. load the training prompt pool and the disjoint held-out tasks, the gate and the environment;
3. for each seed, for each arm: the loop of :mod:`srollout.training.onpolicy` (GRESO skips -> gated
   rollouts -> DAPO refills -> GRPO update -> held-out eval every E iterations -> checkpoint); a
   finished (seed, arm) is taken from its checkpoint on resume, an unfinished one continues;
4. write metrics.parquet, eval.parquet, the per-seed and aggregated tables with the paired tests,
   the per-arm table, the figures, the final adapters, summary.json, report.md and the manifest.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, NamedTuple

import polars as pl

from srollout import schemas
from srollout.config import TRAIN_ARMS, TrainOnpolicyConfig
from srollout.errors import SrolloutError
from srollout.progress import StageBar
from srollout.rundir import Manifest, check_resumable, prepare_run_dir
from srollout.stages.rollout_setup import RolloutPlan


class OnpolicyResult(NamedTuple):
    """run_dir; metrics / evals: the two tables; per_seed / aggregate / tests: the summary
    tables; complete: every (seed, arm) ran all its iterations; arms: one row per arm
    (mean ± std over seeds of wall-clock, generated tokens, useful groups per second, ...)."""

    run_dir: Path
    metrics: pl.DataFrame
    evals: pl.DataFrame
    per_seed: pl.DataFrame
    aggregate: pl.DataFrame
    tests: pl.DataFrame
    complete: bool
    arms: pl.DataFrame | None = None


def run_train_onpolicy(
    config: TrainOnpolicyConfig,
    console: Any = None,
    progress: bool = True,
    *,
    env_factory: Any = None,
    prompter: Any = None,
    train_tasks: list | None = None,
    eval_tasks: list | None = None,
    stop_after: int | None = None,
    plan: RolloutPlan | None = None,
) -> OnpolicyResult:
    """Run every (seed, arm) of ``config``. ``env_factory``/``prompter``/``*_tasks`` default to
    the real ALFWorld engine, the ReAct protocol and the configured task sets (tests inject
    others). ``stop_after``: stop after that iteration of the first unfinished arm, leaving what
    a kill would leave (tests of --resume)."""
    from srollout.core.arms import parse_arm
    from srollout.training.model import gate_description
    from srollout.training.onpolicy import ArmContext

    # --env and its task sets, the model and the gates, resolved once: an unknown environment or
    # one off the TextEnv protocol, a damaged model or a bad gate.json fails here, before the
    # run directory exists
    if plan is None:
        plan = plan_training(
            config, train_tasks=train_tasks, eval_tasks=eval_tasks, check_env=env_factory is None
        )
    train_tasks, eval_tasks = list(plan.tasks), list(plan.eval_tasks)
    env_factory = env_factory if env_factory is not None else plan.env_factory()
    prompter = prompter if prompter is not None else plan.prompter()
    gate, K, traj_gate = plan.gate, plan.gate_K, plan.traj_gate
    run_dir = prepare_run_dir(
        config.out, "train-onpolicy", overwrite=config.overwrite, resume=config.resume
    )
    if config.resume:  # its checkpoints must match the settings
        check_resumable(run_dir, "train-onpolicy", config.resume_key(), "checkpoints")
    overlap = {t.task_id for t in train_tasks} & {t.task_id for t in eval_tasks}
    if overlap:
        raise SrolloutError(
            f"training and held-out tasks overlap ({sorted(overlap)[:2]}); choose disjoint sets"
        )
    manifest = Manifest(run_dir, "train-onpolicy", config)
    manifest.update(
        gate=gate_description(gate, K),
        traj_gate=traj_gate.to_dict() if traj_gate is not None else None,
        n_train_tasks=len(train_tasks),
        n_eval_tasks=len(eval_tasks),
    )

    metrics_rows: list[dict[str, Any]] = []
    eval_rows: list[dict[str, Any]] = []
    initial: list[dict[str, Any]] | None = None
    complete = True
    total = len(config.seeds) * len(config.arms) * config.iterations
    bar = StageBar(console, "train-onpolicy", total, enabled=progress)
    with bar:
        for seed in config.seeds:
            specs = {
                arm: ArmContext(
                    seed=seed,
                    arm=parse_arm(arm).with_gate(gate, K, traj_gate),
                    train_tasks=train_tasks,
                    eval_tasks=eval_tasks,
                    env_factory=env_factory,
                    prompter=prompter,
                    model_dir=plan.model_dir,
                    ckpt_dir=run_dir / "checkpoints" / f"seed{seed}-{arm}",
                )
                for arm in config.arms
            }
            results, initial = _run_seed(config, specs, initial, stop_after, bar)
            for arm, result in results.items():
                # a peft directory: `srollout collect --adapter` loads it
                result.model.save_pretrained(str(run_dir / "adapters" / f"seed{seed}-{arm}"))
                metrics_rows += result.metrics
                eval_rows += result.evals
            if any(r.stopped for r in results.values()):
                complete = False
                break

    from srollout.report.onpolicy import (
        aggregate_frame,
        arms_frame,
        audit_figure,
        audit_frame,
        mechanism_figure,
        onpolicy_figure,
        paired_test,
        per_seed,
        stops_frame,
        success_by_eval,
        tests_frame,
    )

    metrics = pl.DataFrame(metrics_rows, infer_schema_length=None)
    evals = pl.DataFrame(eval_rows, infer_schema_length=None)
    paths = [
        schemas.write(metrics, run_dir / "metrics.parquet", schemas.METRICS),
        schemas.write(evals, run_dir / "eval.parquet", schemas.EVAL),
    ]
    seeds_table = per_seed(metrics, evals)
    aggregate = aggregate_frame(seeds_table)
    last = int(evals["iteration"].max())
    others = [a for a in config.arms if a not in ("baseline", "gated")]
    held_out = f"held-out success at iteration {last}"
    pairs = [
        (("baseline", last), ("gated", last), f"{held_out}: gated - baseline"),
        *[
            ((a, 0), (a, last), f"learning: {a} at iteration {last} - iteration 0")
            for a in TRAIN_ARMS
        ],
        *[(("baseline", last), (a, last), f"{held_out}: {a} - baseline") for a in others],
        *[((a, 0), (a, last), f"learning: {a} at iteration {last} - iteration 0") for a in others],
    ]
    tests = tests_frame([paired_test(evals, *pair) for pair in pairs])
    arms_table = arms_frame(metrics, evals, order=config.arms)
    paths.append(schemas.write(seeds_table, run_dir / "summary_per_seed.parquet"))
    paths.append(schemas.write(tests, run_dir / "tests.parquet"))
    paths.append(schemas.write(arms_table, run_dir / "summary_arms.parquet"))
    figures = [
        onpolicy_figure(metrics, evals, run_dir / "onpolicy.png"),
        mechanism_figure(metrics, run_dir / "mechanism.png"),
    ]
    if config.audit > 0 and "gate/threshold" in metrics.columns:
        figures.append(audit_figure(metrics, config.audit_floor, run_dir / "audit.png"))
    summary = {
        "per_seed": seeds_table.to_dicts(),
        "aggregate": aggregate.to_dicts(),
        "tests": tests.to_dicts(),
        "arms": arms_table.to_dicts(),
        "complete": complete,
    }
    paths.append(schemas.write_json(summary, run_dir / "summary.json"))
    report = write_report(
        run_dir,
        config,
        gate_description(gate, K),
        aggregate,
        seeds_table,
        tests,
        figures,
        complete,
        arms=arms_table,
        success=success_by_eval(evals),
        audit=audit_frame(metrics) if "gate/threshold" in metrics.columns else None,
        stops=stops_frame(metrics),
    )
    if complete:
        manifest.complete([*paths, *figures, report], summary=summary)
    else:
        manifest.update(status="partial", summary=summary)
    return OnpolicyResult(
        run_dir, metrics, evals, seeds_table, aggregate, tests, complete, arms_table
    )


def _run_seed(
    config: TrainOnpolicyConfig,
    specs: dict[str, Any],
    initial: list | None,
    stop_after: int | None,
    bar: StageBar,
) -> tuple[dict[str, Any], list | None]:
    """The arms of one seed, each from its checkpoint on resume: interleaved (``--interleave``),
    iteration by iteration, odd iterations in the given order and even ones reversed, so neither
    arm is always first on a drifting machine; else one arm after another. ``stop_after``: stop
    after that iteration of the first unfinished arm (what a kill leaves on disk); an arm not
    started by then is not started."""
    from srollout.training.onpolicy import ArmRunner

    runners: dict[str, ArmRunner] = {}
    stopped = False
    for together in [list(specs)] if config.interleave else [[arm] for arm in specs]:
        for arm in together:
            runners[arm] = ArmRunner(
                config, specs[arm], resume=config.resume, initial_evals=initial
            )
            bar.resumed(runners[arm].iteration)
            initial = initial or runners[arm].evals
        live = [runners[arm] for arm in together]
        while not all(r.done for r in live):
            it = 1 + min(r.iteration for r in live if not r.done)
            for runner in live if it % 2 else live[::-1]:
                if not runner.done and runner.iteration < it:
                    m = runner.step()
                    info = (
                        f"seed {m.seed} {m.arm} it {m.iteration}: reward {m.train.reward:.2f}, "
                        f"cut {m.gate.cuts}, grad {m.train.grad_l2:.3g}"
                    )
                    bar.update(advance=1, info=info)
            if stop_after is not None and it >= stop_after and not all(r.done for r in live):
                stopped = True
                break
        if stopped:
            break
    return {arm: r.result(stopped) for arm, r in runners.items()}, initial


def write_report(
    run_dir: Path,
    config: TrainOnpolicyConfig,
    gate: str,
    aggregate: pl.DataFrame,
    seeds: pl.DataFrame,
    tests: pl.DataFrame,
    figures: list[Path],
    complete: bool,
    arms: pl.DataFrame | None = None,
    success: pl.DataFrame | None = None,
    audit: pl.DataFrame | None = None,
    stops: pl.DataFrame | None = None,
) -> Path:
    from srollout.report.markdown import Section, doc_link, figure
    from srollout.report.markdown import write_report as write
    from srollout.report.onpolicy import arms_markdown_view
    from srollout.report.tables import to_markdown

    settings = (
        f"preset `{config.preset}`; seeds {', '.join(map(str, config.seeds))}; {config.iterations} "
        f"iterations x {config.prompts_per_iter} prompts from {config.train_tasks} "
        f"`{config.train_set}` tasks, G={config.G}, T_max={config.T_max}, temperature "
        f"{config.temperature}; greedy held-out eval every {config.eval_every} iterations on "
        f"{config.n_eval} `{config.eval_set}` tasks (no gate); LoRA r={config.lora_r}, "
        f"alpha={config.lora_alpha} on {', '.join(config.lora_targets)}; AdamW lr {config.lr:g}; "
        f"loss denominator `{config.denominator}`; clip {config.clip_eps}; KL {config.kl_coef:g}; "
        f"gate {gate} in the arms with the gate; arms {', '.join(config.arms)}; DAPO: at most "
        f"{config.dapo_max_rounds} extra rounds; GRESO: exploration p = "
        f"{config.greso_p_explore:g}.\n\nWhat each arm does and how the report counts: "
        + doc_link("training.md", "`srollout train-onpolicy --seeds 7,13,23,42` (Tier 3)")
        + "."
    )
    # the per-seed columns the report shows, of summary_per_seed.parquet's
    cols = (
        "seed wall_saving token_saving cuts_gated cut_tp_gated cut_fp_gated grad_l2_ratio "
        "dilution_prediction zero_adv_baseline zero_adv_gated eval0_baseline eval_last_baseline "
        "eval_last_gated eval_last_delta"
    ).split()
    sections = []
    # the baseline-against-gated tables; a run without that pair compares its arms below only
    if "baseline" in config.arms and "gated" in config.arms:
        columns = [c for c in cols if c in seeds.columns]
        sections += [
            Section("Summary (mean ± std over seeds)", to_markdown(aggregate)),
            Section("Per seed", to_markdown(seeds, columns=columns)),
        ]
    sections += [
        Section(
            "Arms (mean ± std over seeds; per-seed totals over all iterations)",
            to_markdown(arms_markdown_view(arms))
            if arms is not None and arms.height
            else "No arms.",
        ),
        Section(
            f"Held-out success at each evaluation (%, greedy, {config.n_eval} "
            f"`{config.eval_set}` tasks)",
            to_markdown(success) if success is not None and success.height else "No evaluation.",
        ),
        Section(
            "Paired tests over (seed, task) held-out outcomes",
            to_markdown(tests)
            if tests.height
            else "No paired outcomes (a single arm or no evaluation).",
        ),
    ]
    audited = f"--audit {config.audit}, floor {config.audit_floor}"
    if audit is not None and audit.height:
        sections.append(Section(f"Audited gate ({audited}; docs/gates.md)", to_markdown(audit)))
    if stops is not None and stops.height:
        title = (
            "Trajectory gate: stops (judged by each stopped trajectory's twin rolled on with the "
            "same seeds: right iff it failed"
            + (f"; audited, {audited}" if config.audit > 0 else "")
        )
        sections.append(Section(title + ")", to_markdown(stops)))
    sections += [
        Section("Settings", settings),
        Section("Figures", "\n".join(figure(f, run_dir, f.stem) for f in figures)),
        Section(
            "Files",
            "- `metrics.parquet`: one row per (arm, seed, iteration)\n- "
            "`eval.parquet`: one row per (arm, seed, iteration, task)\n- "
            "`summary_per_seed.parquet`, `summary_arms.parquet`, `tests.parquet`, "
            "`summary.json`\n- `adapters/seed<S>-<arm>/` (peft; `srollout collect "
            "--adapter`)\n- `checkpoints/` (per-iteration state for `--resume`)",
        ),
    ]
    pre = (
        ""
        if complete
        else "**Partial run** — continue it with `--resume --out " + str(run_dir) + "`."
    )
    return write(run_dir, "srollout train-onpolicy", sections, preamble=pre)


def plan_training(
    config: TrainOnpolicyConfig,
    *,
    train_tasks: list | None = None,
    eval_tasks: list | None = None,
    check_env: bool = True,
) -> RolloutPlan:
    """train-onpolicy's inputs, resolved once: ``--env`` with its training pool (``tasks``) and
    held-out tasks (``eval_tasks``; the given ones kept), its protocol played once
    (``check_env``), the base model (``model_dir``) and the gates (the group gate always, for
    the gated arms and the report; the trajectory gate when an arm applies it:
    :func:`srollout.stages.rollout_setup.plan_gates`)."""
    from srollout.core.arms import parse_arms
    from srollout.envs.registry import check_env as play_once
    from srollout.envs.registry import resolve_env
    from srollout.stages.rollout_setup import plan_gates, plan_model

    env = resolve_env(config.env)
    if train_tasks is None or eval_tasks is None:
        train_tasks = env.task_set(config.train_set, n=config.train_tasks)
        eval_tasks = env.task_set(config.eval_set, n=config.n_eval)
    if check_env:
        play_once(env, train_tasks)
    stall_arms = any(a.stall for a in parse_arms(config.arms))
    gates = plan_gates(config, group=True, stall_arms=stall_arms)
    model_dir = plan_model(config, check_policy=False)
    return RolloutPlan(env, tuple(train_tasks), model_dir, *gates, eval_tasks=tuple(eval_tasks))
