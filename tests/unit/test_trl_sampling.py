"""DAPO's refill and GRESO's skip inside one TRL rollout_func call
(:func:`srollout.integrations.trl_sampling.sample_batch`), worked by hand on scripted groups: the
driver decides which tasks are rolled out, in which slots the groups land and what is counted."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from srollout.core.arms import GresoSkipper, extra_round_tasks
from srollout.envs.base import Task
from srollout.errors import SrolloutError
from srollout.integrations.trl_sampling import check_pool, check_sampling, sample_batch

TASKS = [Task(f"t{i}", "game", f"goal {i}", "") for i in range(8)]
# the rewards each task's group earns: t0, t2 and t5 have variance, the others none
REWARDS = {f"t{i}": [0.0, 0.0] for i in range(8)} | {
    "t0": [1.0, 0.0], "t2": [0.0, 1.0], "t5": [1.0, 0.0]
}  # fmt: skip


def _rollout(**kw):
    base = dict(tasks=TASKS, G=2, seed=3, dynamic_sampling=True, max_refill_rounds=3, greso_p=None)
    return SimpleNamespace(_next_group=0, **(base | kw))


def _roller(rolled: list):
    def roll(specs):
        rolled.append([(s.index, s.task.task_id) for s in specs])
        return [SimpleNamespace(spec=s, cut=False, rewards=REWARDS[s.task.task_id]) for s in specs]

    return roll


def test_dapo_refills_zero_variance_slots_from_tasks_outside_the_batch():
    rollout, rolled = _rollout(), []
    batch = sample_batch(rollout, [TASKS[1], TASKS[0], TASKS[3]], _roller(rolled), 1, None)
    # round 0 rolls the batch (indices 0..2); t1 and t3 are zero-variance, so round 1 asks for 2
    # tasks outside {t0, t1, t3}, drawn by (seed 3, call 1, round 1), at indices 3 and 4
    want = [TASKS[i].task_id for i in extra_round_tasks(8, {0, 1, 3}, 1, 1, 2, 3)]
    assert rolled[0] == [(0, "t1"), (1, "t0"), (2, "t3")]
    assert [t for _, t in rolled[1]] == want and [i for i, _ in rolled[1]] == [3, 4]
    useful = ["t0"] + [t for t in want if REWARDS[t][0] != REWARDS[t][1]]
    filled = [s.spec.task.task_id for s in batch.slots if s is not None]
    assert filled[: len(useful)] == useful[:3]
    assert len(batch.slots) == 3  # the batch size holds
    assert batch.extra_groups == len(batch.generated) - 3
    assert batch.rounds == len(rolled) and rollout._next_group == 3 + batch.extra_groups
    assert batch.unfilled == sum(s is None for s in batch.slots)


def test_the_cap_leaves_slots_empty_and_counts_them():
    # only t0 has variance among tasks the refill can reach when the pool is t0, t1, t3, t4
    rollout, rolled = _rollout(tasks=[TASKS[i] for i in (0, 1, 3, 4)], max_refill_rounds=1), []
    batch = sample_batch(rollout, [TASKS[1], TASKS[3]], _roller(rolled), 1, None)
    # round 0: t1, t3 (both zero-variance); round 1 (the cap): the 2 others, t0 and t4
    assert sorted(t for _, t in rolled[1]) == ["t0", "t4"]
    assert [s.spec.task.task_id if s else None for s in batch.slots] == ["t0", None]
    assert (batch.extra_groups, batch.rounds, batch.unfilled, batch.skipped) == (2, 2, 1, 0)


def test_greso_skips_a_streak_and_dapo_fills_its_slot():
    # t1 was zero-variance at calls 1 and 2: at call 3 it is rolled out with probability
    # p^2 = 0.0 when p = 0, so skipped for sure; t0 has no streak
    skipper = GresoSkipper(0.0, 3, [("t1", 1, True), ("t1", 2, True), ("t0", 2, False)])
    rollout, rolled = _rollout(), []
    batch = sample_batch(rollout, [TASKS[0], TASKS[1]], _roller(rolled), 3, skipper)
    assert rolled[0] == [(0, "t0")]  # t1 never rolled; its slot's index 1 stays unused
    assert batch.skipped == 1 and rolled[1][0][0] == 2
    assert len(batch.slots) == 2 and batch.slots[0].spec.task.task_id == "t0"
    # every group rolled out is recorded for GRESO at call 3, zero-variance or not
    for r in batch.generated:
        zero = REWARDS[r.spec.task.task_id][0] == REWARDS[r.spec.task.task_id][1]
        assert skipper.streak(r.spec.task.task_id) == (1 if zero else 0) + (
            2 if r.spec.task.task_id == "t1" else 0
        )


def test_greso_alone_drops_the_skipped_slot():
    skipper = GresoSkipper(0.0, 3, [("t1", 1, True)])
    rollout, rolled = _rollout(dynamic_sampling=False, greso_p=0.0), []
    batch = sample_batch(rollout, [TASKS[1], TASKS[2]], _roller(rolled), 2, skipper)
    assert rolled == [[(1, "t2")]]  # slot 0 (t1) skipped: nothing rolled, G masked rows
    assert batch.slots[0] is None and batch.slots[1].spec.task.task_id == "t2"
    assert (batch.skipped, batch.unfilled, batch.extra_groups, batch.rounds) == (1, 0, 0, 1)


def test_settings_dynamic_sampling_cannot_work_with_are_one_line():
    with pytest.raises(SrolloutError, match="G=1 a group never has reward variance"):
        check_sampling(_rollout(G=1))
    with pytest.raises(SrolloutError, match="max_refill_rounds >= 1"):
        check_sampling(_rollout(max_refill_rounds=0))
    with pytest.raises(SrolloutError, match=r"greso_p must lie in \[0, 1\]"):
        check_sampling(_rollout(greso_p=1.5))
    with pytest.raises(SrolloutError, match="already uses all 2 tasks"):
        check_pool(_rollout(tasks=TASKS[:2]), TASKS[:2])
    check_pool(_rollout(dynamic_sampling=False, tasks=TASKS[:2]), TASKS[:2])


def test_a_skip_part_of_another_package_runs_inside_trl_where_greso_does(cooldown_arm):
    from srollout.core.arms import skipper_for
    from srollout.integrations.trl import GatedRollout

    # cooldown (examples/custom_arm): t1 gave no gradient at call 1, so call 2 rests it; it
    # records nothing then, so call 3 rolls it again (GRESO at p = 0 would skip it for good)
    skipper = skipper_for(cooldown_arm, seed=3, p_explore=0.0, history=[("t1", 1, True)])
    rollout, rolled = _rollout(dynamic_sampling=False, greso_p=0.0), []
    batch = sample_batch(rollout, [TASKS[1], TASKS[2]], _roller(rolled), 2, skipper)
    assert [t for _, t in rolled[0]] == ["t2"] and batch.skipped == 1
    batch = sample_batch(rollout, [TASKS[1], TASKS[2]], _roller(rolled), 3, skipper)
    assert [t for _, t in rolled[1]] == ["t1", "t2"] and batch.skipped == 0
    # GatedRollout builds it by name; an unknown name is one line naming the entry point group
    gated = GatedRollout(tasks=TASKS, G=2, env_factory=object, greso_p=0.0, skip=cooldown_arm)
    assert type(gated._greso).__name__ == "CooldownSkipper"
    assert gated.log_config()["skip"] == "cooldown"
    assert "skip" not in GatedRollout(tasks=TASKS, G=2, env_factory=object).log_config()
    with pytest.raises(SrolloutError, match="no skip part 'nap'.*'srollout.arms'"):
        GatedRollout(tasks=TASKS, G=2, env_factory=object, greso_p=0.0, skip="nap")
