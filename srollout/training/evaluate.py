"""Greedy held-out evaluation (Tier 3): each task decoded once at temperature 0, no gate.

One trajectory per task (a greedy group would repeat it G times), all tasks in flight at once on
the rollout engine; task i plays as group i of run seed ``seed``, so every evaluation of a run
plays the same games and outcomes are paired across arms, iterations and seeds."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

from srollout.envs.base import Task, TextEnv


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
    from srollout.rollout.engine import RolloutSettings, make_specs, run_groups

    if not tasks:
        return []
    records: list[Any] = []
    settings = RolloutSettings(
        G=1, T_max=T_max, seed=seed, concurrency=len(tasks), signal_K=(), arm="eval"
    )
    run_groups(
        make_specs(tasks, len(tasks)),
        policy,
        env_factory,
        prompter,
        settings,
        on_group=records.append,
    )
    records.sort(key=lambda r: r.spec.index)
    return [
        EvalOutcome(
            r.spec.task.task_id,
            r.spec.task.task_type,
            r.trajs[0].success,
            r.trajs[0].reward,
            len(r.trajs[0].steps),
        )
        for r in records
    ]
