"""`srollout train-offpolicy`: GRPO on a collected buffer, baseline vs gated arm (the paper's Tier 2)."""

from srollout.cli._unavailable import unavailable_command

register = unavailable_command(
    "train-offpolicy",
    "GRPO on a collected buffer, baseline vs gated arm (the paper's Tier 2).",
    "it needs the GRPO trainer.",
)
