"""`srollout analyze`: how well mid-rollout divergence predicts zero-variance groups
(parse options -> AnalyzeConfig -> run_analyze)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from srollout.config import AnalyzeConfig, help_for

_DEFAULT = AnalyzeConfig()

HELP = (
    "Measure how well mid-rollout divergence predicts "
    "zero-variance groups (Spearman, AUROC, figures).\n\n"
    "INPUT is a run directory, a steps.parquet or a signals.parquet. Writes correlation.parquet, "
    "per_task_type.parquet, stratification.parquet, false_positives.parquet, signals.parquet (when "
    "computed from steps), PNG figures and report.md."
)


def _h(name: str) -> str:
    return help_for(AnalyzeConfig, name)


def register(app: typer.Typer) -> None:
    @app.command("analyze", help=HELP, short_help=HELP.split("\n")[0])
    def analyze(
        input: Annotated[Path, typer.Argument(help=_h("input"), show_default=False)],
        K: Annotated[str | None, typer.Option("--K", help=_h("K"), show_default=False)] = None,
        gate_K: Annotated[int, typer.Option("--gate-K", help=_h("gate_K"))] = _DEFAULT.gate_K,
        d_L: Annotated[float, typer.Option("--d-L", help=_h("d_L"))] = _DEFAULT.d_L,
        seed: Annotated[int, typer.Option("--seed", help=_h("seed"))] = _DEFAULT.seed,
        figures: Annotated[
            bool, typer.Option("--figures/--no-figures", help=_h("figures"))
        ] = _DEFAULT.figures,
        out: Annotated[
            Path | None, typer.Option("--out", help=_h("out"), show_default=False)
        ] = None,
        overwrite: Annotated[bool, typer.Option("--overwrite", help=_h("overwrite"))] = False,
    ) -> None:
        from srollout.config import parse_int_list
        from srollout.stages.analyze import run_analyze

        config = AnalyzeConfig(
            input=input,
            K=parse_int_list(K, "--K") if K is not None else None,
            gate_K=gate_K,
            d_L=d_L,
            seed=seed,
            figures=figures,
            out=out,
            overwrite=overwrite,
        )
        run_analyze(config)
