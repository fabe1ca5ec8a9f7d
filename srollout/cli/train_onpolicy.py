"""`srollout train-onpolicy`: On-policy GRPO with the gate, per seed, with held-out evaluation (Tier 3)."""

from srollout.cli._unavailable import unavailable_command

register = unavailable_command(
    "train-onpolicy",
    "On-policy GRPO with the gate, per seed, with held-out evaluation (Tier 3).",
    "it needs the GRPO trainer and the rollout engine.",
)
