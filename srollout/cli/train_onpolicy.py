"""`srollout train-onpolicy`: on-policy GRPO per seed, baseline vs gated (the paper's Tier 3);
the options not given take the value of ``--preset`` (parse options -> TrainOnpolicyConfig)."""

from __future__ import annotations

import dataclasses
from typing import Annotated, Any

import typer

from srollout.cli.rollout_options import config_options, parse_lists
from srollout.config import ONPOLICY_PRESETS, DistConfig, TrainOnpolicyConfig, help_for


def _h(name: str) -> str:
    presets = ", ".join(f"{p} {v[name]}" for p, v in ONPOLICY_PRESETS.items() if name in v)
    return help_for(TrainOnpolicyConfig, name) + (f"  \\[presets: {presets}]" if presets else "")


# `train-onpolicy --help` lists them in field order, then --workers
OPTIONS = tuple(f.name for f in dataclasses.fields(TrainOnpolicyConfig))
# the options that take their value from --preset when not given (default None, none shown)
OWN_DEFAULT = (
    "seeds preset env backend arms interleave judge_cuts audit audit_floor out overwrite resume"
)
FROM_PRESET = tuple(n for n in OPTIONS if n not in OWN_DEFAULT.split())


def register(app: typer.Typer) -> None:
    @app.command(
        "train-onpolicy",
        help="On-policy GRPO, baseline vs gated arm per seed (Tier 3): rollouts through the engine "
        "(gate on in the gated arm; also --arms dapo, greso, gated+dapo, gated+greso), LoRA "
        "r16/alpha32 on q,k,v,o + MLP, AdamW; greedy held-out eval every E iterations; checkpoints "
        "every iteration (--resume). Writes metrics.parquet, eval.parquet, the 4-panel and "
        "mechanism figures, report.md.",
    )
    @config_options(TrainOnpolicyConfig, OPTIONS, help=_h, from_preset=FROM_PRESET)
    def train_onpolicy(
        options: dict[str, Any],
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

        config = TrainOnpolicyConfig.from_preset(**parse_lists(TrainOnpolicyConfig, options))
        console = make_console()
        _threads()
        if DistConfig(workers=workers).workers > 1:
            from srollout.stages.train_onpolicy_seeds import run_seeds_parallel

            result = run_seeds_parallel(config, workers, console=console)
        else:
            result = run_train_onpolicy(config, console=console)
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
