"""`srollout ab-rollout`: Matched-seed wall-clock A/B: the same tasks and seeds with and without the gate."""

from srollout.cli._unavailable import unavailable_command

register = unavailable_command(
    "ab-rollout",
    "Matched-seed wall-clock A/B: the same tasks and seeds with and without the gate.",
    "it needs the rollout engine.",
)
