"""`srollout train-onpolicy --seeds 7,13,23,42`: on-policy GRPO with the gate, per seed, with
held-out evaluation (the paper's Tier 3). Options left out take the value of ``--preset``."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from srollout.cli.rollout_options import TRAIN_ROLLOUT_OPTIONS, rollout_options
from srollout.config import (
    ONPOLICY_PRESETS,
    DistConfig,
    TrainOnpolicyConfig,
    help_for,
    parse_names,
    parse_seeds,
)

_D = TrainOnpolicyConfig.__dataclass_fields__


def _h(name: str) -> str:
    preset = {p: v[name] for p, v in ONPOLICY_PRESETS.items() if name in v}
    suffix = (
        ("  \\[presets: " + ", ".join(f"{p} {v}" for p, v in preset.items()) + "]")
        if preset
        else ""
    )
    return help_for(TrainOnpolicyConfig, name) + suffix


def _default(name: str):
    return _D[name].default


# the order `train-onpolicy --help` lists its options in
ORDER = (
    "seeds",
    "preset",
    "iterations",
    "prompts_per_iter",
    "G",
    "T_max",
    "temperature",
    "eval_every",
    "n_eval",
    "train_tasks",
    "train_set",
    "eval_set",
    "env",
    "lr",
    "lora_r",
    "lora_alpha",
    "lora_targets",
    "denominator",
    "denominator_constant",
    "clip_eps",
    "kl_coef",
    "gate",
    "K",
    "d_L",
    "rule",
    "t_high",
    "model",
    "backend",
    "base_url",
    "max_new_tokens",
    "concurrency",
    "micro_batch",
    "arms",
    "dapo_max_rounds",
    "greso_p_explore",
    "interleave",
    "judge_cuts",
    "audit",
    "precision_floor",
    "stall",
    "stall_from",
    "out",
    "overwrite",
    "resume",
    "workers",
)
# every rollout option but --backend takes its value from --preset when not given
FROM_PRESET = tuple(n for n in TRAIN_ROLLOUT_OPTIONS if n != "backend")


def register(app: typer.Typer) -> None:
    @app.command(
        "train-onpolicy",
        help="On-policy GRPO, baseline vs gated arm per seed (Tier 3): rollouts through the engine "
        "(gate on in the gated arm; also --arms dapo, greso, gated+dapo, gated+greso), LoRA "
        "r16/alpha32 on q,k,v,o + MLP, AdamW; greedy held-out eval every E iterations; checkpoints "
        "every iteration (--resume). Writes metrics.parquet, eval.parquet, the 4-panel and "
        "mechanism figures, report.md.",
    )
    @rollout_options(
        TrainOnpolicyConfig, TRAIN_ROLLOUT_OPTIONS, order=ORDER, help=_h, from_preset=FROM_PRESET
    )
    def train_onpolicy(
        options: dict[str, Any],
        seeds: Annotated[str, typer.Option("--seeds", help=_h("seeds"))] = "7,13,23,42",
        preset: Annotated[str, typer.Option("--preset", help=_h("preset"))] = "default",
        iterations: Annotated[
            int | None, typer.Option("--iterations", help=_h("iterations"), show_default=False)
        ] = None,
        prompts_per_iter: Annotated[
            int | None,
            typer.Option("--prompts-per-iter", help=_h("prompts_per_iter"), show_default=False),
        ] = None,
        eval_every: Annotated[
            int | None, typer.Option("--eval-every", help=_h("eval_every"), show_default=False)
        ] = None,
        n_eval: Annotated[
            int | None, typer.Option("--n-eval", help=_h("n_eval"), show_default=False)
        ] = None,
        train_tasks: Annotated[
            int | None, typer.Option("--train-tasks", help=_h("train_tasks"), show_default=False)
        ] = None,
        train_set: Annotated[
            str | None, typer.Option("--train-set", help=_h("train_set"), show_default=False)
        ] = None,
        eval_set: Annotated[
            str | None, typer.Option("--eval-set", help=_h("eval_set"), show_default=False)
        ] = None,
        env: Annotated[str, typer.Option("--env", help=_h("env"))] = "alfworld",
        lr: Annotated[float | None, typer.Option("--lr", help=_h("lr"), show_default=False)] = None,
        lora_r: Annotated[
            int | None, typer.Option("--lora-r", help=_h("lora_r"), show_default=False)
        ] = None,
        lora_alpha: Annotated[
            int | None, typer.Option("--lora-alpha", help=_h("lora_alpha"), show_default=False)
        ] = None,
        lora_targets: Annotated[
            str | None, typer.Option("--lora-targets", help=_h("lora_targets"), show_default=False)
        ] = None,
        denominator: Annotated[
            str | None, typer.Option("--denominator", help=_h("denominator"), show_default=False)
        ] = None,
        denominator_constant: Annotated[
            float | None,
            typer.Option(
                "--denominator-constant", help=_h("denominator_constant"), show_default=False
            ),
        ] = None,
        clip_eps: Annotated[
            float | None, typer.Option("--clip-eps", help=_h("clip_eps"), show_default=False)
        ] = None,
        kl_coef: Annotated[
            float | None, typer.Option("--kl-coef", help=_h("kl_coef"), show_default=False)
        ] = None,
        max_new_tokens: Annotated[
            int | None,
            typer.Option("--max-new-tokens", help=_h("max_new_tokens"), show_default=False),
        ] = None,
        micro_batch: Annotated[
            int | None, typer.Option("--micro-batch", help=_h("micro_batch"), show_default=False)
        ] = None,
        arms: Annotated[str, typer.Option("--arms", "--arm", help=_h("arms"))] = "baseline,gated",
        dapo_max_rounds: Annotated[
            int | None,
            typer.Option("--dapo-max-rounds", help=_h("dapo_max_rounds"), show_default=False),
        ] = None,
        greso_p_explore: Annotated[
            float | None,
            typer.Option("--greso-p-explore", help=_h("greso_p_explore"), show_default=False),
        ] = None,
        interleave: Annotated[
            bool, typer.Option("--interleave/--no-interleave", help=_h("interleave"))
        ] = True,
        judge_cuts: Annotated[bool, typer.Option("--judge-cuts", help=_h("judge_cuts"))] = False,
        audit: Annotated[float, typer.Option("--audit", help=_h("audit"))] = 0.0,
        precision_floor: Annotated[
            float, typer.Option("--precision-floor", help=_h("precision_floor"))
        ] = 0.85,
        out: Annotated[
            Path | None, typer.Option("--out", help=_h("out"), show_default=False)
        ] = None,
        overwrite: Annotated[bool, typer.Option("--overwrite", help=_h("overwrite"))] = False,
        resume: Annotated[bool, typer.Option("--resume", help=_h("resume"))] = False,
        # --workers (srollout.stages.train_onpolicy_seeds): seeds in parallel on Ray
        workers: Annotated[
            int,
            typer.Option(
                "--workers",
                help="Seeds trained in parallel, one per Ray worker (extra 'dist'), each in "
                "RUN/seeds/seed<S>/ with its own checkpoints; 1 = one after another in this "
                "process. Joins $RAY_ADDRESS, else starts a local cluster.",
            ),
        ] = 1,
    ) -> None:
        from srollout.cli.train_offpolicy import _threads
        from srollout.console import make_console
        from srollout.report.tables import to_rich
        from srollout.stages.train_onpolicy import run_train_onpolicy

        config = TrainOnpolicyConfig.from_preset(
            preset,
            **options,
            seeds=parse_seeds(seeds),
            iterations=iterations,
            prompts_per_iter=prompts_per_iter,
            eval_every=eval_every,
            n_eval=n_eval,
            train_tasks=train_tasks,
            train_set=train_set,
            eval_set=eval_set,
            env=env,
            lr=lr,
            lora_r=lora_r,
            lora_alpha=lora_alpha,
            lora_targets=parse_names(lora_targets, "--lora-targets")
            if lora_targets is not None
            else None,
            denominator=denominator,
            denominator_constant=denominator_constant,
            clip_eps=clip_eps,
            kl_coef=kl_coef,
            max_new_tokens=max_new_tokens,
            micro_batch=micro_batch,
            arms=parse_names(arms, "--arms"),
            dapo_max_rounds=dapo_max_rounds,
            greso_p_explore=greso_p_explore,
            interleave=interleave,
            judge_cuts=judge_cuts,
            audit=audit,
            precision_floor=precision_floor,
            out=out,
            overwrite=overwrite,
            resume=resume,
        )
        console = make_console()
        _threads()
        # --- --workers (srollout.stages.train_onpolicy_seeds) ---
        if DistConfig(workers=workers).workers > 1:
            from srollout.stages.train_onpolicy_seeds import run_seeds_parallel

            result = run_seeds_parallel(config, workers, console=console)
        else:
            result = run_train_onpolicy(config, console=console)
        # --- end --workers ---
        console.print(
            to_rich(
                result.aggregate,
                title=f"train-onpolicy ({len(config.seeds)} seed(s)): baseline vs gated",
            )
        )
        if result.arms is not None and result.arms.height:
            from srollout.report.onpolicy import arms_markdown_view

            console.print(
                to_rich(arms_markdown_view(result.arms), title="arms (mean ± std over seeds)")
            )
        if result.tests.height:
            console.print(
                to_rich(result.tests, title="paired tests over (seed, task) held-out outcomes")
            )
        console.print(
            f"wrote {result.run_dir}/ (metrics.parquet, "
            "eval.parquet, onpolicy.png, mechanism.png, report.md)"
        )
