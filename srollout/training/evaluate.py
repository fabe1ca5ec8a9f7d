"""Greedy held-out evaluation (Tier 3): each task decoded once at temperature 0, no gate.

One trajectory per task, all tasks stepped together through one batched ``policy.act`` per
step (the rollout engine needs G >= 2, and a greedy group of identical members would waste the
other G-1). Environment seeds come from (eval seed, task position), so every evaluation of a run
plays the same games and outcomes are paired across arms, iterations and seeds.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

from srollout.envs.base import Task, TextEnv
from srollout.policy.base import ActRequest, TrajKey
from srollout.rollout.seeding import traj_seeds


class EvalOutcome(NamedTuple):
    """One held-out task: success (won within T_max), reward, steps taken."""

    task_id: str
    task_type: str
    success: bool
    reward: float
    n_steps: int


def greedy_eval(
    policy: Any,
    env_factory: Callable[[], TextEnv],
    prompter: Any,
    tasks: Sequence[Task],
    T_max: int,
    seed: int = 0,
) -> list[EvalOutcome]:
    """Play every task once with ``policy`` (which should be greedy); outcomes in task order."""
    envs: list[TextEnv] = []
    live: list[dict[str, Any]] = []
    out: list[EvalOutcome | None] = [None] * len(tasks)
    try:
        for i, task in enumerate(tasks):
            env = env_factory()
            envs.append(env)
            seeds = traj_seeds(seed, i, 0)
            observation, info = env.reset(task, seeds.env)
            live.append({"i": i, "key": TrajKey(f"eval{i:05d}", 0), "env": env, "obs": observation, "info": info,
                         "seed": seeds.sample, "reward": 0.0})
        step = 0
        while live:
            step += 1
            requests = [
                ActRequest(
                    key=t["key"], step=step, seed=t["seed"], system=prompter.system(tasks[t["i"]]),
                    user=prompter.user(t["obs"], step, tasks[t["i"]], tuple(t["info"].admissible)),
                    admissible=tuple(t["info"].admissible), expert_plan=tuple(t["info"].expert_plan),
                    observation=t["obs"],
                )
                for t in live
            ]
            responses = policy.act(requests)
            still = []
            for t, resp in zip(live, responses, strict=True):
                result = t["env"].step(prompter.parse(resp.text).action)
                t["reward"] += float(result.reward)
                t["obs"], t["info"] = result.observation, result
                if result.done or step >= T_max:
                    policy.finish(t["key"])
                    task = tasks[t["i"]]
                    out[t["i"]] = EvalOutcome(task.task_id, task.task_type, bool(result.done), t["reward"], step)
                else:
                    still.append(t)
            live = still
    finally:
        for t in live:
            policy.finish(t["key"])
        for env in envs:
            env.close()
    return [o for o in out if o is not None]
