"""Warm-up before a timed rollout: what a stage does so that no arm pays another arm's start-up.

Two costs fall on whoever rolls out first in a process: parsing each task's game (environments
cache parsed games per process; ALFWorld keeps an LRU of 128), and, for a language model, the
first forward passes at every context length (allocator and kernel warm-up). :func:`warm_up`
pays the first always and the second when it is given a policy.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

from srollout.rollout.engine import GroupSpec, RolloutSettings, run_groups

# Warm-up groups get indices far past any run's groups: their seeds and ids never meet a run's.
WARMUP_INDEX = 1_000_000


def warm_up(
    env_factory: Callable[[], Any],
    tasks: Sequence[Any],
    *,
    policy: Any = None,
    prompter: Any = None,
    settings: RolloutSettings | None = None,
) -> float:
    """Load every task's game once, untimed; with ``policy`` (and its ``prompter`` and engine
    ``settings``), then roll one throw-away batch to T_max: as many groups as fit in
    ``settings.concurrency``, group indices from :data:`WARMUP_INDEX` (so other seeds), no signals,
    arm ``warmup``, so every context length the timed runs reach is warmed (with a 2-step warm-up
    the first timed run of an A/B, always the baseline's, ran 8–20 % slower than the others in an
    A/A run). Nothing is recorded. Returns the seconds spent (logged, never counted)."""
    t0 = time.perf_counter()
    env = env_factory()
    try:
        # the engine caches parsed games per process: the first arm would pay it alone
        for task in tasks:
            env.reset(task, 0)
    finally:
        env.close()
    if policy is not None:
        if settings is None:
            raise ValueError("warm_up with a policy needs the engine settings of the timed runs")
        n = max(1, min(len(tasks), settings.concurrency // settings.G))
        specs = [GroupSpec(WARMUP_INDEX + i, tasks[i]) for i in range(n)]
        batch = RolloutSettings(
            G=settings.G,
            T_max=settings.T_max,
            seed=settings.seed,
            concurrency=settings.concurrency,
            signal_K=(),
            arm="warmup",
        )
        run_groups(specs, policy, env_factory, prompter, batch)
    return time.perf_counter() - t0
