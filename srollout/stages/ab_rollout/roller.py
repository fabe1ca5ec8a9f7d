"""The timed engine call of every A/B block, in this process or on Ray workers.

:class:`Roller` is what :func:`srollout.stages.ab_rollout.run_block` calls: ``roll(specs, arm)
-> (records, summary)``, one timed engine call with the arm's settings. Every use of the Ray
backend (``srollout.rollout.ray_pool``) by the A/B is in this module.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from srollout.config import AbRolloutConfig
from srollout.core.arms import ArmSpec
from srollout.progress import RolloutBar
from srollout.rollout.engine import (
    GroupRecord,
    GroupSpec,
    RolloutSettings,
    RolloutSummary,
    run_groups,
)
from srollout.rollout.warmup import warm_up
from srollout.stages.rollout_setup import RolloutPlan, build_policy

if TYPE_CHECKING:
    from srollout.rollout.audits import Audit


def arm_settings(arm: ArmSpec, config: AbRolloutConfig) -> RolloutSettings:
    """The engine settings of ``arm``: everything but the gates is the same in every arm."""
    return RolloutSettings(
        G=config.G,
        T_max=config.T_max,
        seed=config.seed,
        concurrency=config.concurrency,
        signal_K=tuple(config.signal_K),
        gate=arm.gate_rule,
        gate_K=arm.gate_K,
        arm=arm.name,
        traj_gate=arm.traj_gate,
    )


class Roller:
    """The timed engine call of every block: ``roll(specs, arm) -> (records, summary)``.

    In this process (workers == 1): the policy is built here (unless given) and warmed up once
    before any clock (:func:`srollout.rollout.warmup.warm_up`); each call is
    :func:`srollout.rollout.engine.run_groups`. On Ray (workers > 1): each call is
    ``srollout.rollout.ray_pool.run_groups_distributed`` with the arm's settings; every worker
    builds its policy replica and warms up *before* the clock (:func:`worker_policy`), and the
    call's time is counted from the moment all workers are up (wall − start_s); ``overhead_s`` then
    counts worker-seconds (workers × wall − measured).
    """

    def __init__(
        self,
        config: AbRolloutConfig,
        workers: int,
        policy: Any,
        env_factory: Callable[[], Any] | None,
        warm_tasks: Sequence[Any],
        planned: Sequence[GroupSpec],
        plan: RolloutPlan,
        chunk_groups: int | None = None,
    ) -> None:
        self.config, self.workers, self.chunk_groups = config, workers, chunk_groups
        self.show = RolloutBar(None, "ab-rollout", 0, enabled=False)  # the stage hands over its bar
        # in the bar's total; DAPO's extra groups are not
        self.planned = {s.group_id for s in planned}
        self.model_dir = plan.model_dir  # resolved once by the plan, here and on every worker
        self.prompter = plan.prompter()
        self.env_factory = env_factory or plan.env_factory(expert=config.policy != "lm")
        self.warm_tasks = list(warm_tasks)
        self.warm_s = 0.0
        self._dist: list[dict[str, Any]] = []
        if workers == 1:
            self.policy = policy if policy is not None else build_policy(config, self.model_dir)
            self.policy_name = getattr(self.policy, "name", None)
            if config.warmup:
                self.warm_s = _warm_up(
                    self.warm_tasks, self.policy, self.env_factory, self.prompter, config
                )
        else:
            self.policy = policy  # shipped to the workers when given
            self.policy_name = (
                getattr(policy, "name", None) or f"{config.policy} (built by each Ray worker)"
            )

    def roll(
        self, specs: Sequence[GroupSpec], arm: ArmSpec, audit: Audit | None = None
    ) -> tuple[list[GroupRecord], RolloutSummary]:
        """One timed engine call of ``arm`` (its gates as the arm carries them) over ``specs``;
        ``audit``: the arm's audit, whose gates and draws the call runs with
        (:meth:`srollout.rollout.audits.Audit.settings`)."""
        records: list[GroupRecord] = []

        def keep(record: GroupRecord) -> None:
            records.append(record)
            self.show.advance(1)

        self.show.extend(sum(s.group_id not in self.planned for s in specs))
        settings = arm_settings(arm, self.config)
        if audit is not None:
            settings = audit.settings(settings)
        if self.workers == 1:
            summary = run_groups(
                list(specs),
                self.policy,
                self.env_factory,
                self.prompter,
                settings,
                on_group=keep,
                on_tick=self.show.tick,
            )
            return records, summary
        from functools import partial

        from srollout.rollout.ray_pool import WorkerRecipe, run_groups_distributed

        recipe = WorkerRecipe(
            make_policy=partial(
                worker_policy,
                self.config,
                self.policy,
                self.env_factory,
                self.warm_tasks,
                self.model_dir,
                self.prompter,
            ),
            env_factory=self.env_factory,
            prompter=self.prompter,
            settings=settings,
            threads=1 if self.config.policy == "lm" else None,
        )
        result = run_groups_distributed(
            list(specs),
            recipe,
            self.workers,
            on_group=keep,
            on_tick=self.show.tick,
            chunk_groups=self.chunk_groups,
        )
        s = result.summary
        timed = max(s.wall_s - result.start_s, 0.0)
        self._dist.append(
            {
                "start_s": round(result.start_s, 3),
                "replaced": result.replaced,
                "chunks": result.chunks,
                "worker_slots": result.workers,
                "policy_build_s": [round(x, 3) for x in result.build_s],
            }
        )
        return records, s._replace(
            wall_s=timed, overhead_s=self.workers * timed - s.gen_s - s.env_s - s.reset_s
        )

    def take_dist(self) -> dict[str, Any] | None:
        """The Ray calls of the block just run (start-up seconds, restarts, chunks); then
        forget them."""
        if self.workers == 1:
            return None
        calls, self._dist = self._dist, []
        return {"calls": calls}


def worker_policy(
    config: AbRolloutConfig,
    policy: Any,
    env_factory: Callable[[], Any],
    warm_tasks: Sequence[Any],
    model_dir: Any,
    prompter: Any,
) -> Any:
    """A Ray worker's ``make_policy`` (runs in the worker, before the clock): the policy (``policy``
    when given, else built from the config and the plan's ``model_dir``), warmed up in the
    worker's own process when ``--warmup`` is on (its games loaded, a throw-away batch)."""
    built = policy if policy is not None else build_policy(config, model_dir)
    if config.warmup:
        _warm_up(warm_tasks, built, env_factory, prompter, config)
    return built


def _warm_up(
    tasks: Sequence[Any],
    policy: Any,
    env_factory: Callable[[], Any],
    prompter: Any,
    config: AbRolloutConfig,
) -> float:
    """The A/B's warm-up: every task's game loaded, then a throw-away batch at the timed runs'
    G, T_max, seed and concurrency (:func:`srollout.rollout.warmup.warm_up`)."""
    settings = RolloutSettings(
        G=config.G, T_max=config.T_max, seed=config.seed, concurrency=config.concurrency
    )
    return warm_up(env_factory, tasks, policy=policy, prompter=prompter, settings=settings)
