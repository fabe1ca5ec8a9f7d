"""The selective-rollout gate inside trainers people already run (TRL's ``GRPOTrainer``, verl's
agent loop, any asyncio loop): docs/integrations.md. Neither module imports its framework until it
is used, so ``import srollout`` never needs TRL or verl."""
