"""`srollout analyze`: how well mid-rollout divergence predicts zero-variance groups
(parse options -> AnalyzeConfig -> run_analyze)."""

import typer

from srollout.cli.rollout_options import input_command
from srollout.config import AnalyzeConfig

HELP = (
    "Measure how well mid-rollout divergence predicts "
    "zero-variance groups (Spearman, AUROC, figures).\n\n"
    "INPUT is a run directory, a steps.parquet or a signals.parquet. Writes correlation.parquet, "
    "per_task_type.parquet, stratification.parquet, false_positives.parquet, signals.parquet (when "
    "computed from steps), PNG figures and report.md."
)


def register(app: typer.Typer) -> None:
    input_command(app, "analyze", AnalyzeConfig, HELP, "srollout.stages.analyze:run_analyze")
