"""The selective-rollout gate inside trainers people already run.

`srollout.integrations.trl`: a `rollout_func` for TRL's `GRPOTrainer` that plays multi-turn
episodes through srollout's engine and stops groups at step K. `srollout.integrations.verl`: a
verl agent loop whose n sessions of one prompt meet at a group barrier at step K. Neither module
imports its framework until it is used, so `import srollout` never needs TRL or verl.
"""
