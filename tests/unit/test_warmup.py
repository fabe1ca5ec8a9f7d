"""srollout.rollout.warmup.warm_up: the one warm-up of the A/B and the training loops."""

from __future__ import annotations

from corridor_env import Corridor, SeededWalker

from srollout.envs.base import Task
from srollout.rollout.engine import RolloutSettings, group_id_of
from srollout.rollout.react import ReactPrompter
from srollout.rollout.warmup import WARMUP_INDEX, warm_up


class CountingCorridor(Corridor):
    resets: list[str] = []

    def reset(self, task, seed):
        CountingCorridor.resets.append(task.task_id)
        return super().reset(task, seed)


def _tasks(n):
    return [
        Task(f"c/{i}", "pick_and_place_simple", "reach the end", "", meta={"length": 2})
        for i in range(n)
    ]


def test_games_only_without_a_policy():
    CountingCorridor.resets = []
    assert warm_up(CountingCorridor, _tasks(3)) >= 0.0
    assert CountingCorridor.resets == ["c/0", "c/1", "c/2"]


def test_with_a_policy_one_throwaway_batch_of_as_many_groups_as_fit():
    CountingCorridor.resets = []
    walker = SeededWalker(p_fwd=1.0)
    # concurrency 4 at G=2: 2 groups fit; 3 tasks loaded first
    warm_up(
        CountingCorridor,
        _tasks(3),
        policy=walker,
        prompter=ReactPrompter(),
        settings=RolloutSettings(G=2, T_max=3, seed=0, concurrency=4),
    )
    assert CountingCorridor.resets[:3] == ["c/0", "c/1", "c/2"]
    assert sorted(CountingCorridor.resets[3:]) == ["c/0", "c/0", "c/1", "c/1"]  # 2 groups x G=2
    # group ids from WARMUP_INDEX on: never one of a run's
    assert sorted({k.group_id for k in walker.finished}) == [
        group_id_of(WARMUP_INDEX),
        group_id_of(WARMUP_INDEX + 1),
    ]
    assert len(walker.finished) == 4 and not walker.rngs  # every trajectory ran to its end
