"""`srollout analyze`: Measure how well mid-rollout divergence predicts zero-variance groups (Spearman, AUROC, figures)."""

from srollout.cli._unavailable import unavailable_command

register = unavailable_command(
    "analyze",
    "Measure how well mid-rollout divergence predicts zero-variance groups (Spearman, AUROC, figures).",
    "being built.",
)
