"""The rollout engine's slot accounting, gating and seeding, on a tiny scripted environment
(tests/unit/corridor_env.py: a corridor where "forward" advances and reaching the end wins)."""

from __future__ import annotations

import random

import polars as pl
import pytest
from corridor_env import Corridor, Counting, SeededWalker, roll, steps_of, tasks

from srollout.core.gate import FixedGate, Gate, GateRule
from srollout.errors import SrolloutError
from srollout.rollout.engine import GroupSpec, RolloutSettings, make_specs
from srollout.rollout.records import group_tables
from srollout.rollout.seeding import traj_seeds


def test_group_of_three_by_hand():
    # One group, G=3, corridor of 2 cells, T_max=4. Every action follows from the seeds.
    settings = RolloutSettings(G=3, T_max=4, seed=11, concurrency=3, signal_K=(2, 4))
    (rec,), summary = roll(make_specs(tasks([2]), 1), settings)
    expected_actions = []
    for i in range(3):
        rng = random.Random(traj_seeds(11, 0, i).sample)
        acts, pos = [], 0
        for _ in range(4):
            a = "forward" if rng.random() < 0.5 else "wait"
            acts.append(a)
            pos += a == "forward"
            if pos == 2:
                break
        expected_actions.append(acts)
    assert [t.actions for t in rec.trajs] == expected_actions
    for t, acts in zip(rec.trajs, expected_actions, strict=True):
        assert t.success == (acts.count("forward") == 2)
        assert t.ended_by == ("done" if t.success else "max_steps")
        assert t.observations[0] == "cell 0 of 2"
    assert summary.rows == sum(len(a) for a in expected_actions)
    assert sorted(rec.signals) == [2, 4]


def test_slots_refill_and_concurrency_cap():
    # 5 groups of G=4 with room for 2 groups: never more than 8 rows in a tick.
    settings = RolloutSettings(G=4, T_max=6, seed=0, concurrency=8, signal_K=(3,))
    policy = Counting(SeededWalker())
    envs: list[Corridor] = []
    records, summary = roll(make_specs(tasks([3, 5, 2, 4, 3]), 5), settings, policy, envs)
    assert sorted(r.group_id for r in records) == [f"g{i:05d}" for i in range(5)]
    assert max(policy.batch_sizes) <= 8
    assert summary.ticks == policy.calls
    assert summary.rows == len(policy.rows) == sum(len(t.steps) for r in records for t in r.trajs)
    # envs are reused from a free list: never more than concurrency of them, all closed
    assert len(envs) <= 8 and all(e.closed for e in envs)
    # every trajectory finished exactly once
    assert len(policy.inner.finished) == len(set(policy.inner.finished)) == 20


def test_always_cut_stops_every_group_at_K_and_never_generates_after():
    K = 3
    settings = RolloutSettings(
        G=4,
        T_max=10,
        seed=5,
        concurrency=8,
        gate=FixedGate(True, K=K),
        gate_K=K,
        signal_K=(2, 3, 5),
    )
    policy = Counting(SeededWalker(p_fwd=0.3))
    records, summary = roll(make_specs(tasks([9] * 6), 6), settings, policy)
    assert summary.n_cut == 6
    assert max(step for _, _, step in policy.rows) == K  # no step after K was ever generated
    for r in records:
        assert r.cut and r.cut_step == K
        assert sorted(r.signals) == [2, 3]  # K=5 > cut step: not recorded
        assert all(t.ended_by == "gate" and len(t.steps) == K for t in r.trajs)
        g = group_tables(r).groups.row(0, named=True)
        assert g["cut"] and g["cut_step"] == K and g["n_stopped"] == 4 and g["gate_K"] == K


def test_cut_group_frees_slots_at_once():
    # Room for exactly one group: with an always-cut gate at K=2 each group takes 2 ticks,
    # so 3 groups take 6 ticks; without the gate the same groups take T_max=8 ticks each.
    cut = RolloutSettings(
        G=2, T_max=8, seed=1, concurrency=2, gate=FixedGate(True, K=2), gate_K=2, signal_K=(2,)
    )
    records, summary = roll(make_specs(tasks([50] * 3), 3), cut, Counting(SeededWalker()))
    assert summary.ticks == 6 and summary.rows == 12
    full = RolloutSettings(G=2, T_max=8, seed=1, concurrency=2, signal_K=(2,))
    _, summary = roll(make_specs(tasks([50] * 3), 3), full)
    assert summary.ticks == 24


def test_never_cut_gate_equals_no_gate_and_gated_prefix_matches():
    specs = make_specs(tasks([3, 6, 4, 2, 5, 7]), 6)
    base = RolloutSettings(G=4, T_max=8, seed=3, concurrency=12, signal_K=(2, 4))
    never = RolloutSettings(
        G=4,
        T_max=8,
        seed=3,
        concurrency=12,
        signal_K=(2, 4),
        gate=GateRule(rule="r1", K=4, d_L=0.0),
        gate_K=4,
    )
    ref, _ = roll(specs, base)
    rec_never, _ = roll(specs, never)
    assert all(not r.cut for r in rec_never)
    assert steps_of(ref).equals(steps_of(rec_never))
    # an always-cut gate with a different concurrency gives the same first K steps
    always = RolloutSettings(
        G=4, T_max=8, seed=3, concurrency=4, signal_K=(2, 4), gate=FixedGate(True, K=4), gate_K=4
    )
    rec_cut, _ = roll(specs, always)
    assert steps_of(ref).filter(pl.col("step") <= 4).equals(steps_of(rec_cut))


def test_scheduling_does_not_change_trajectories():
    specs = make_specs(tasks([3, 6, 4, 2, 5]), 5)
    a, _ = roll(specs, RolloutSettings(G=3, T_max=7, seed=9, concurrency=3, signal_K=(3,)))
    b, _ = roll(
        list(reversed(specs)), RolloutSettings(G=3, T_max=7, seed=9, concurrency=15, signal_K=(3,))
    )
    assert steps_of(a).equals(steps_of(b))
    c, _ = roll(specs, RolloutSettings(G=3, T_max=7, seed=10, concurrency=3, signal_K=(3,)))
    assert not steps_of(a).equals(steps_of(c))


def test_gate_at_K_uses_the_rule_on_d_K():
    # p_fwd=1: every trajectory walks forward in lock-step, identical prefixes, d_K = 0 < d_L.
    settings = RolloutSettings(
        G=4,
        T_max=10,
        seed=0,
        concurrency=4,
        gate=GateRule(rule="r1", K=3, d_L=0.12),
        gate_K=3,
        signal_K=(3,),
    )
    (rec,), _ = roll(make_specs(tasks([8]), 1), settings, SeededWalker(p_fwd=1.0))
    assert rec.cut and rec.cut_step == 3 and rec.gate_signals.prefix_edit_distance_mean == 0.0
    # a corridor of 2: every trajectory is done at step 2 < K, the gate never sees the group
    (rec,), _ = roll(make_specs(tasks([2]), 1), settings, SeededWalker(p_fwd=1.0))
    assert not rec.cut and rec.gate_K is None and all(t.ended_by == "done" for t in rec.trajs)
    assert rec.signals[3].termination_fraction == 1.0


def test_gen_time_split_by_tokens_sums_to_measured():
    settings = RolloutSettings(G=4, T_max=5, seed=2, concurrency=8, signal_K=(2,))
    records, summary = roll(make_specs(tasks([4, 4]), 2), settings)
    steps = pl.concat([group_tables(r).steps for r in records])
    assert steps["gen_s"].sum() == pytest.approx(summary.gen_s, rel=1e-9)
    assert steps["n_gen_tokens"].sum() == summary.n_gen_tokens


def test_tables_follow_the_schemas():
    from srollout.schemas import GROUPS, SIGNALS, STEPS, TRAJECTORIES, validate

    settings = RolloutSettings(G=4, T_max=6, seed=2, concurrency=8, signal_K=(2, 4, 9))
    records, _ = roll(make_specs(tasks([3, 9]), 2), settings)
    t = group_tables(records[0])
    for df, art in (
        (t.steps, STEPS),
        (t.trajectories, TRAJECTORIES),
        (t.groups, GROUPS),
        (t.signals, SIGNALS),
    ):
        validate(df, art, art.name)
    assert t.signals["K"].to_list() == [2, 4]  # 9 > T_max is dropped
    rewards = t.trajectories["reward"].to_list()
    mean = sum(rewards) / 4
    assert t.groups["reward_var"][0] == pytest.approx(sum((r - mean) ** 2 for r in rewards) / 4)


def test_bad_settings_raise_one_line_errors():
    with pytest.raises(SrolloutError, match="G must be >= 2 for signals or a gate"):
        RolloutSettings(G=1)  # collect's signals need two trajectories to compare
    with pytest.raises(SrolloutError, match="G must be >= 2 for signals or a gate"):
        RolloutSettings(G=1, signal_K=(), gate=FixedGate(True, K=2), gate_K=2)
    with pytest.raises(SrolloutError, match="G must be >= 1"):
        RolloutSettings(G=0, signal_K=())
    assert RolloutSettings(G=1, signal_K=(), concurrency=1).G == 1
    with pytest.raises(SrolloutError, match="concurrency"):
        RolloutSettings(G=8, concurrency=4)
    with pytest.raises(SrolloutError, match="gate K"):
        RolloutSettings(T_max=5, gate=FixedGate(True, K=6))
    assert GroupSpec(3, tasks([1])[0]).group_id == "g00003"


class TwoStepGate(Gate):
    """A gate that checks at K=2 and K=4 and cuts only at its second check step."""

    K = 2

    def check_steps(self, T_max=None):
        return tuple(k for k in (2, 4) if T_max is None or k <= T_max)

    def __init__(self) -> None:
        self.calls: list[int] = []

    def decide_at(self, K, signals):
        self.calls.append(K)
        return K == 4

    def decide(self, signals):
        return self.decide_at(2, signals)


def test_multi_step_gate_is_evaluated_at_each_check_step_and_cuts_at_the_second():
    specs = make_specs(tasks([50, 50, 50]), 3)
    gate = TwoStepGate()
    settings = RolloutSettings(G=4, T_max=10, seed=7, concurrency=8, gate=gate, signal_K=(2, 4, 6))
    assert settings.gate_K == 2 and settings.gate_steps == (
        2,
        4,
    )  # gate_K defaults to the first check
    policy = Counting(SeededWalker(p_fwd=0.3))
    records, summary = roll(specs, settings, policy)
    assert sorted(gate.calls) == [2, 2, 2, 4, 4, 4]  # each group once at each check step
    assert max(step for _, _, step in policy.rows) == 4 and summary.n_cut == 3
    for r in records:
        assert r.cut and r.cut_step == 4 and r.gate_K == 4 and r.gate_checks == [2, 4]
        assert all(t.ended_by == "gate" and len(t.steps) == 4 for t in r.trajs)
        assert sorted(r.signals) == [2, 4]  # K=6 > cut step
        g = group_tables(r).groups.row(0, named=True)
        assert g["cut"] and g["cut_step"] == 4 and g["gate_K"] == 4 and g["n_stopped"] == 4
    # the first 4 steps are those of the ungated run with the same seeds
    ref, _ = roll(
        specs,
        RolloutSettings(G=4, T_max=10, seed=7, concurrency=8, signal_K=(2, 4, 6)),
        SeededWalker(p_fwd=0.3),
    )
    assert steps_of(ref).filter(pl.col("step") <= 4).equals(steps_of(records))


def test_multi_step_gate_skips_groups_that_ended_and_checks_past_T_max():
    # corridor of 3 with p_fwd=1: every trajectory wins at step 3, between the two checks
    gate = TwoStepGate()
    settings = RolloutSettings(G=3, T_max=10, seed=0, concurrency=3, gate=gate, signal_K=(2,))
    (rec,), _ = roll(make_specs(tasks([3]), 1), settings, SeededWalker(p_fwd=1.0))
    assert not rec.cut and rec.gate_checks == [2] and gate.calls == [2]
    assert all(t.ended_by == "done" for t in rec.trajs)
    # a check step beyond T_max is never reached; a fixed-K gate keeps its single step
    assert RolloutSettings(G=3, T_max=3, gate=TwoStepGate()).gate_steps == (2,)
    assert RolloutSettings(G=3, T_max=9, gate=FixedGate(True, K=5), gate_K=5).gate_steps == (5,)
    with pytest.raises(SrolloutError, match="first check step"):
        RolloutSettings(G=3, T_max=9, gate=TwoStepGate(), gate_K=4)


def test_greedy_eval_plays_task_i_as_the_first_trajectory_of_group_i():
    # greedy_eval runs on the engine with G=1: its outcome for task i is, action for action,
    # trajectory 0 of group i of a G=3 run with the same seed (the walker's coin is the sample
    # seed; corridors of 2..4 cells, T_max 5, so some win and some run out of steps)
    from corridor_env import Prompter

    from srollout.training.evaluate import greedy_eval

    ts = tasks([2, 3, 4, 2, 3])
    out = greedy_eval(SeededWalker(), Corridor, Prompter(), ts, T_max=5, seed=7)
    records, _ = roll(
        make_specs(ts, 5), RolloutSettings(G=3, T_max=5, seed=7, concurrency=15, signal_K=())
    )
    first = {r.spec.index: r.trajs[0] for r in records}
    assert [o.task_id for o in out] == [t.task_id for t in ts]
    assert [(o.success, o.reward, o.n_steps) for o in out] == [
        (first[i].success, first[i].reward, len(first[i].steps)) for i in range(5)
    ]
    assert 0 < sum(o.success for o in out) < 5 and {o.n_steps for o in out} != {5}
