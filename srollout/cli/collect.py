"""`srollout collect`: Roll out G trajectories per task with the policy and write steps/trajectories/groups/signals Parquet."""

from srollout.cli._unavailable import unavailable_command

register = unavailable_command(
    "collect",
    "Roll out G trajectories per task with the policy and write steps/trajectories/groups/signals Parquet.",
    "it needs the batched rollout engine and the default policy.",
)
