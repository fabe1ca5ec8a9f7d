"""The selective-rollout gate inside your own GRPO loop, with nothing from srollout but `core`.

Your trainer owns the environment, the policy and the update; srollout.core gives you the
decision at step K and the GRPO bookkeeping. Here "your" environment is a small lock-and-key text
game and "your" policy a noisy scripted agent, so the script runs anywhere in a second:

    python examples/gate_in_your_trainer.py [--groups 40] [--K 4] [--d-L 0.12]

It rolls out G trajectories per task step by step, asks the gate at step K, stops cut groups
at once (their post-K steps are never generated), computes advantages on the kept groups only,
and prints how many steps the gate saved and whether it cut any group that would have had signal.
"""

from __future__ import annotations

import argparse
import random

import numpy as np

from srollout.core.gate import GateRule
from srollout.core.grpo import group_advantages, is_zero_variance
from srollout.core.signals import compute_signals


class LockAndKey:
    """A task: find the key in one of `n_rooms` rooms, then open the door. Reward 1 on success."""

    def __init__(self, n_rooms: int, key_room: int):
        self.n_rooms, self.key_room = n_rooms, key_room
        self.has_key, self.done = False, False

    def step(self, action: str) -> tuple[str, float, bool]:
        if action == "open door" and self.has_key:
            self.done = True
            return "The door opens.", 1.0, True
        if action == f"search room {self.key_room}":
            self.has_key = True
            return "You find a key.", 0.0, False
        return "Nothing here.", 0.0, False


def scripted_policy(env: LockAndKey, style: str, t: int, rng: random.Random) -> str:
    """A task-dependent agent: stuck in a loop on some tasks, exploring on some, solved on
    others."""
    if style == "stuck":  # lock-step failure: every trajectory repeats the same useless action
        return "look around" if rng.random() < 0.97 else f"search room {rng.randrange(env.n_rooms)}"
    if style == "solver":  # sweeps the rooms in order, then opens the door
        return "open door" if env.has_key else f"search room {(t - 1) % env.n_rooms}"
    if env.has_key:  # "learner": random search, sometimes forgets to open the door
        return "open door" if rng.random() < 0.5 else "look around"
    return f"search room {rng.randrange(env.n_rooms)}"


def rollout_group(task_seed: int, G: int, T_max: int, gate: GateRule | None):
    """Roll out G trajectories in lock-step; returns rewards, steps taken, and whether it was
    cut."""
    task_rng = random.Random(task_seed)
    n_rooms, key_room = 8, task_rng.randrange(3, 8)
    style = task_rng.choice(["stuck", "learner", "solver"])
    envs = [LockAndKey(n_rooms, key_room) for _ in range(G)]
    rngs = [random.Random(task_seed * 1000 + i) for i in range(G)]
    actions: list[list[str]] = [[] for _ in range(G)]
    rewards = [0.0] * G
    steps = 0
    for t in range(1, T_max + 1):
        for i, env in enumerate(envs):
            if env.done:
                continue
            a = scripted_policy(env, style, t, rngs[i])
            _, r, _ = env.step(a)
            actions[i].append(a)
            rewards[i] += r
            steps += 1
        if gate is not None and t == gate.K and gate.decide(compute_signals(actions, gate.K)):
            return rewards, steps, True  # cut: stop now, never generate steps K+1..T_max
        if all(env.done for env in envs):
            break
    return rewards, steps, False


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--groups", type=int, default=40)
    parser.add_argument("--G", type=int, default=8)
    parser.add_argument("--T-max", type=int, default=20)
    parser.add_argument("--K", type=int, default=4)
    parser.add_argument("--d-L", type=float, default=0.12)
    args = parser.parse_args()
    gate = GateRule(rule="r1", K=args.K, d_L=args.d_L)

    steps_full = steps_gated = cuts = wrong_cuts = 0
    kept_advantages = []
    for task in range(args.groups):
        full_rewards, full_steps, _ = rollout_group(task, args.G, args.T_max, gate=None)
        rewards, steps, cut = rollout_group(task, args.G, args.T_max, gate=gate)
        steps_full += full_steps
        steps_gated += steps
        if cut:  # dropped from the GRPO batch entirely; judged by the un-gated outcome
            cuts += 1
            wrong_cuts += not is_zero_variance(full_rewards)
            continue
        kept_advantages.append(group_advantages(rewards))  # -> your loss: -A_i * log p(tau_i)

    nonzero = sum(int(np.any(a != 0)) for a in kept_advantages)
    print(f"groups {args.groups}, cut {cuts} (of which {wrong_cuts} had reward variance)")
    print(
        f"environment steps: {steps_full} without the gate, {steps_gated} with it "
        f"({1 - steps_gated / steps_full:.1%} saved)"
    )
    print(f"kept groups with signal: {nonzero} of {len(kept_advantages)}")


if __name__ == "__main__":
    main()
