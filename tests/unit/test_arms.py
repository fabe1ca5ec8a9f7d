"""Arms (srollout.core.arms): names, DAPO dynamic sampling with a cap, GRESO skipping,
hand-worked."""

from __future__ import annotations

import logging
from typing import NamedTuple

import pytest

from srollout.core.arms import (
    ARM_NAMES,
    ArmSpec,
    GresoSkipper,
    arm_summary,
    dapo_fill,
    greso_filter,
    is_useful,
    parse_arm,
    parse_arms,
)
from srollout.errors import SrolloutError


class Grp(NamedTuple):
    rewards: tuple[float, ...]
    cut: bool = False
    n_gen_tokens: int = 10


def test_arm_names_parse_into_four_switches():
    assert ARM_NAMES[:6] == ("baseline", "gated", "dapo", "greso", "gated+dapo", "gated+greso")
    assert ARM_NAMES[6:] == ("stall", "gated+stall", "stall+dapo", "stall+greso", "loop")
    assert parse_arm("loop") == ArmSpec("loop", gate=False, dapo=False, greso=False, loop=True)
    assert not any(parse_arm(n).loop for n in ARM_NAMES[:-1])
    assert parse_arm("stall+dapo") == ArmSpec(
        "stall+dapo", gate=False, dapo=True, greso=False, stall=True
    )
    assert parse_arm("gated+stall").gate and parse_arm("gated+stall").stall
    assert not any(parse_arm(n).stall for n in ARM_NAMES[:6])
    assert parse_arm("baseline") == ArmSpec("baseline", gate=False, dapo=False, greso=False)
    assert parse_arm("gated+dapo") == ArmSpec("gated+dapo", gate=True, dapo=True, greso=False)
    assert parse_arm(" Gated+GRESO ") == ArmSpec("gated+greso", gate=True, dapo=False, greso=True)
    assert parse_arm("greso").greso and not parse_arm("greso").gate
    assert [a.name for a in parse_arms("baseline,gated+dapo")] == ["baseline", "gated+dapo"]
    assert [a.name for a in parse_arms(("dapo", "greso"))] == ["dapo", "greso"]
    for bad in ("dapo+gated", "other", ""):
        with pytest.raises(SrolloutError):
            parse_arms(bad)
    with pytest.raises(SrolloutError, match="once"):
        parse_arms("gated,gated")
    with pytest.raises(SrolloutError, match="expected"):
        parse_arms("baseline,,gated")


def test_a_group_is_useful_iff_uncut_with_reward_variance():
    assert is_useful(Grp((1.0, 0.0)))
    assert not is_useful(Grp((0.0, 0.0))) and not is_useful(Grp((1.0, 1.0)))
    assert not is_useful(
        Grp((1.0, 0.0), cut=True)
    )  # a cut group leaves the batch, whatever its truncated rewards


def _scripted(rounds: list[list[Grp]]):
    """sample_round that returns the scripted rounds in order and logs what it was asked."""
    asked: list[tuple[int, int]] = []

    def sample_round(n_needed: int, round_index: int) -> list[Grp]:
        asked.append((n_needed, round_index))
        return rounds[round_index][:n_needed]

    return sample_round, asked


def test_dapo_cap_hit_returns_what_it_has_and_warns(caplog):
    # target 4 useful groups, at most 2 extra rounds.
    # round 0 (4 asked): [1,0] useful, [0,0] zv, [1,1] zv, [0,1] useful -> 2 kept, 2 still needed
    # round 1 (2 asked): [0,0], [1,1] -> nothing useful
    # round 2 (2 asked): [1,0] useful, [0,0] zv -> 3 kept; the cap is reached: 3 of 4, no raise
    rounds = [
        [Grp((1, 0)), Grp((0, 0)), Grp((1, 1)), Grp((0, 1))],
        [Grp((0, 0)), Grp((1, 1))],
        [Grp((1, 0), n_gen_tokens=7), Grp((0, 0))],
        [Grp((1, 0))],  # never asked for
    ]
    sample_round, asked = _scripted(rounds)
    with caplog.at_level(logging.WARNING, logger="srollout.core.arms"):
        res = dapo_fill(4, sample_round, max_rounds=2, tokens=lambda g: g.n_gen_tokens)
    assert asked == [(4, 0), (2, 1), (2, 2)]
    assert res.hit_cap and not res.exhausted
    assert [g.rewards for g in res.useful] == [(1, 0), (0, 1), (1, 0)]
    assert len(res.generated) == 8 and res.n_generated == 8
    assert [(r.n_requested, r.n_generated, r.n_useful) for r in res.rounds] == [
        (4, 4, 2),
        (2, 2, 0),
        (2, 2, 1),
    ]
    assert [r.n_gen_tokens for r in res.rounds] == [40, 20, 17] and res.n_gen_tokens == 77
    assert res.n_rounds == 3 and res.n_extra_rounds == 2
    assert "3 of 4 useful groups" in caplog.text


def test_dapo_stops_as_soon_as_the_batch_is_full():
    # round 0: 1 of 3 useful; round 1 (2 asked): both useful -> full, round 2 never runs
    rounds = [
        [Grp((0, 0)), Grp((1, 0)), Grp((1, 1))],
        [Grp((0, 1)), Grp((1, 0))],
        [Grp((1, 0))] * 3,
    ]
    sample_round, asked = _scripted(rounds)
    res = dapo_fill(3, sample_round, max_rounds=5)
    assert asked == [(3, 0), (2, 1)]
    assert not res.hit_cap and len(res.useful) == 3 and res.n_gen_tokens == 0


def test_dapo_drops_cut_groups_and_takes_no_extra_round_at_cap_zero():
    rounds = [[Grp((1, 0), cut=True), Grp((0, 1))]]
    sample_round, asked = _scripted(rounds)
    res = dapo_fill(2, sample_round, max_rounds=0)
    assert asked == [(2, 0)] and res.hit_cap and [g.rewards for g in res.useful] == [(0, 1)]


def test_dapo_stops_when_no_more_groups_come():
    sample_round, asked = _scripted([[Grp((0, 0))], []])
    res = dapo_fill(1, sample_round, max_rounds=3)
    assert asked == [(1, 0), (1, 1)] and res.exhausted and not res.hit_cap and res.useful == ()
    assert res.n_rounds == 1 and res.n_generated == 1  # the empty round is not a round
    with pytest.raises(SrolloutError):
        dapo_fill(0, sample_round, max_rounds=1)
    with pytest.raises(SrolloutError):
        dapo_fill(1, sample_round, max_rounds=-1)


def test_greso_skip_sequence_with_a_fixed_seed():
    """Prompts a (always zero-variance), b (always mixed), c (always zero-variance), every
    iteration, p = 0.5, seed 0. Skip iff z >= 1 and u >= 0.5^z (thresholds 0.5, 0.25, 0.125).
    The draws u(prompt, iteration) are pinned below; a skipped prompt records nothing."""
    s = GresoSkipper(0.5, seed=0)
    u = {
        ("a", 2): 0.6370,
        ("a", 3): 0.2817,
        ("a", 4): 0.2166,
        ("a", 5): 0.7608,
        ("c", 2): 0.2735,
        ("c", 3): 0.1928,
        ("c", 4): 0.8072,
        ("c", 5): 0.2252,
    }
    for key, value in u.items():
        assert s.draw(*key) == pytest.approx(value, abs=5e-5)
    skipped = []
    for it in range(1, 7):
        for pid in "abc":
            if s.should_skip(pid, it):
                skipped.append(f"{pid}{it}")
            else:
                s.record(pid, it, zero_var=pid != "b")
    # it1: nothing seen. it2: a z=1 u=.637>=.5 skip; c z=1 u=.274 roll out (z->2).
    # it3: a z=1 u=.282 roll out (z->2); c z=2 u=.193<.25 roll out (z->3).
    # it4: a z=2 u=.217<.25 roll out (z->3); c z=3 u=.807 skip. it5-6: a, c at z=3 skip (u>=.125).
    assert skipped == ["a2", "c4", "a5", "c5", "a6", "c6"]
    assert s.streak("a") == 3 and s.streak("b") == 0 and s.streak("c") == 3
    assert s.skip_probability("a", 7) == pytest.approx(0.875) and s.skip_probability("b", 7) == 0.0


def test_greso_streak_resets_and_extreme_exploration_probabilities():
    s = GresoSkipper(0.0, seed=3)
    s.record("x", 1, True)
    s.record("x", 2, False)
    s.record("x", 3, True)
    assert s.streak("x") == 1 and s.streak("x", before=3) == 0 and s.streak("new") == 0
    assert s.should_skip("x", 4) and not s.should_skip(
        "x", 3
    )  # p = 0: skip every prompt with z >= 1
    always = GresoSkipper(1.0, seed=3, history=s.history())
    assert not any(always.should_skip("x", it) for it in range(4, 50))  # p = 1: never skip
    with pytest.raises(SrolloutError):
        GresoSkipper(1.5, seed=0)


def test_greso_decisions_are_order_free_and_survive_a_checkpoint():
    a = GresoSkipper(0.3, seed=11)
    for it in range(1, 4):
        for pid in ("p", "q", "r"):
            a.record(pid, it, zero_var=True)
    a.record("q", 4, False)
    b = GresoSkipper(0.3, seed=11, history=a.history()[::-1])  # restored in another order
    b.record("q", 5, True)  # an outcome after the checkpoint of iteration 4 ...
    b.truncate(4)  # ... forgotten on resume
    ids = ["r", "q", "p"]
    assert greso_filter(a, ids, 5) == greso_filter(b, ids, 5)
    kept, skipped = greso_filter(a, ids, 5)
    assert 1 in kept  # q's last group had variance: never skipped
    assert sorted(kept + skipped) == [0, 1, 2]
    assert GresoSkipper(0.3, seed=12).draw("p", 5) != a.draw("p", 5)


def test_arm_summary_counts_useful_groups_per_second():
    rows = [
        {"iter_s": 2.0, "n_gen_tokens": 100, "n_useful": 3},
        {"iter_s": 3.0, "n_gen_tokens": 50, "n_useful": 2},
    ]
    assert arm_summary(rows) == {"wall_s": 5.0, "gen_tokens": 150, "useful": 5, "useful_per_s": 1.0}
    assert arm_summary([])["useful_per_s"] != arm_summary([])["useful_per_s"]  # NaN without time


def test_an_arm_carries_only_the_gates_it_applies():
    from srollout.core.gate import GateRule
    from srollout.core.trajectory_gate import LoopGate, StallGate

    rule, stall = GateRule(K=10, d_L=0.12), StallGate(8, 10)
    both = parse_arm("gated+stall").with_gate(rule, 10, stall)
    assert (both.gate_rule, both.gate_K, both.traj_gate) == (rule, 10, stall)
    alone = parse_arm("stall").with_gate(rule, 10, stall)
    assert (alone.gate_rule, alone.gate_K, alone.traj_gate) == (None, None, stall)
    gated = parse_arm("gated+dapo").with_gate(rule, 10, stall)
    assert (gated.gate_rule, gated.traj_gate) == (rule, None)
    assert parse_arm("baseline").with_gate(rule, 10, stall) == parse_arm("baseline")
    loop = LoopGate(k0=3)
    looped = parse_arm("loop").with_gate(rule, 10, stall, loop)
    assert (looped.gate_rule, looped.gate_K, looped.traj_gate) == (None, None, loop)
    assert parse_arm("stall").with_gate(rule, 10, stall, loop).traj_gate == stall
    assert parse_arm("gated").with_gate(rule, 10, stall, loop).traj_gate is None


def test_one_arm_strategy_greso_before_dapo_after_the_rollout():
    """roll_arm, the strategy ab-rollout and train-onpolicy share, on hand-made groups."""
    from srollout.core.arms import DapoRound, roll_arm

    zero, mixed = (0.0, 0.0), (0.0, 1.0)
    calls = []

    def roll(specs):
        calls.append(("roll", list(specs)))
        return [Grp(mixed if s in "ac" else zero, cut=s == "d") for s in specs]

    def refill(r, n):
        calls.append(("refill", r, n))
        return [Grp(mixed)] * n if r == 2 else [Grp(zero)]

    # baseline: one round of the four planned groups; the batch is every group not cut
    run = roll_arm(parse_arm("baseline"), list("abcd"), roll, refill, iteration=1,
                   tokens=lambda g: g.n_gen_tokens)  # fmt: skip
    assert calls == [("roll", list("abcd"))] and run.skipped == () and not run.hit_cap
    assert run.batch == run.generated[:3] and run.rounds == (DapoRound(0, 4, 4, 2, 40),)
    # DAPO: round 0 gives 2 useful (a, c); round 1 asks for 2 and gets one zero-variance group;
    # round 2 asks for 2 again and fills the batch: 4 useful groups, 7 generated
    calls.clear()
    run = roll_arm(parse_arm("dapo"), list("abcd"), roll, refill, iteration=1, max_rounds=3)
    assert calls == [("roll", list("abcd")), ("refill", 1, 2), ("refill", 2, 2)]
    assert len(run.generated) == 7 and len(run.batch) == 4 and all(map(is_useful, run.batch))
    assert [r.n_useful for r in run.rounds] == [2, 0, 2] and not run.hit_cap
    # ... with a cap of one extra round it keeps the 2 it has (filling needed round 2)
    run = roll_arm(parse_arm("dapo"), list("abcd"), roll, refill, iteration=1, max_rounds=1)
    assert len(run.batch) == 2 and run.hit_cap
    # GRESO: p = 0 skips every task with a zero-variance streak before the rollout (b and d)
    skipper = GresoSkipper(0.0, seed=0)
    for task, zv in (("a", False), ("b", True), ("c", False), ("d", True)):
        skipper.record(task, 1, zero_var=zv)
    calls.clear()
    run = roll_arm(parse_arm("greso"), list("abcd"), roll, refill, iteration=2,
                   skipper=skipper, task_ids=list("abcd"))  # fmt: skip
    assert calls == [("roll", ["a", "c"])] and run.skipped == (1, 3)
    assert len(run.batch) == 2 and run.rounds == (DapoRound(0, 2, 2, 2, 0),)
