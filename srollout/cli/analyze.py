"""`srollout analyze`: how well mid-rollout divergence predicts zero-variance groups
(parse options -> AnalyzeConfig -> run_analyze)."""

from __future__ import annotations

import dataclasses
from typing import Any

import typer

from srollout.cli.rollout_options import config_options, parse_lists
from srollout.config import AnalyzeConfig

HELP = (
    "Measure how well mid-rollout divergence predicts "
    "zero-variance groups (Spearman, AUROC, figures).\n\n"
    "INPUT is a run directory, a steps.parquet or a signals.parquet. Writes correlation.parquet, "
    "per_task_type.parquet, stratification.parquet, false_positives.parquet, signals.parquet (when "
    "computed from steps), PNG figures and report.md."
)


OPTIONS = tuple(f.name for f in dataclasses.fields(AnalyzeConfig) if f.name != "input")


def register(app: typer.Typer) -> None:
    @app.command("analyze", help=HELP, short_help=HELP.split("\n")[0])
    @config_options(AnalyzeConfig, OPTIONS, argument="input")
    def analyze(options: dict[str, Any]) -> None:
        from srollout.stages.analyze import run_analyze

        run_analyze(AnalyzeConfig(**parse_lists(AnalyzeConfig, options)))
