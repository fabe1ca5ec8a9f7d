"""GroupBarrier: the gate resolved once for G asyncio sessions (plain asyncio, no framework)."""

from __future__ import annotations

import asyncio
import selectors
from types import SimpleNamespace
from typing import NamedTuple

import pytest
from corridor_env import roll, tasks

from srollout.core.gate import FixedGate, Gate, GateRule
from srollout.errors import SrolloutError
from srollout.integrations import group_barrier
from srollout.integrations.group_barrier import DECIDED, NOT_SHOWN, TIMEOUT, GroupBarrier
from srollout.rollout.engine import RolloutSettings, make_specs


class VirtualClock:
    """Seconds that pass only when every task waits: then the loop moves the clock straight to
    its next timer instead of sleeping (see _JumpingSelector). Sleeps and timeouts keep their
    order exactly and take no real time, whatever the machine's load."""

    def __init__(self) -> None:
        self.now = 0.0

    def monotonic(self) -> float:
        return self.now


class _JumpingSelector(selectors.DefaultSelector):
    def __init__(self, clock: VirtualClock) -> None:
        super().__init__()
        self.clock = clock

    def select(self, timeout=None):
        ready = super().select(0)
        if not ready and timeout is None:
            raise RuntimeError("every task waits and no timer is set: the test would hang")
        if not ready:
            self.clock.now += timeout  # nothing to do until the next timer: go there at once
        return ready


class VirtualTime(NamedTuple):
    clock: VirtualClock
    run: object  # run(coroutine) -> its result, on a loop whose time is the clock's


@pytest.fixture
def virtual_time(monkeypatch) -> VirtualTime:
    """The barrier's clock (time.monotonic) and the event loop's (loop.time: sleeps, timers),
    both one VirtualClock starting at 0."""
    clock = VirtualClock()
    monkeypatch.setattr(group_barrier, "time", SimpleNamespace(monotonic=clock.monotonic))

    def run(coroutine):
        loop = asyncio.SelectorEventLoop(_JumpingSelector(clock))
        loop.time = clock.monotonic
        try:
            return loop.run_until_complete(coroutine)
        finally:
            loop.close()

    return VirtualTime(clock, run)


class CountingGate(Gate):
    """A GateRule that counts how often the barrier asks it."""

    def __init__(self, rule: GateRule) -> None:
        self.rule, self.K, self.calls = rule, rule.K, 0

    def decide(self, signals):
        self.calls += 1
        return self.rule.decide(signals)


async def play(barrier, uid, index, actions, ended_after=None, log=None):
    """One session: report ``actions`` one by one (ending after the last if ``ended_after``);
    stop on a cut. Returns (decisions of step(), fate, steps played)."""
    member = barrier.join(uid, index)
    decisions = []
    try:
        for t, action in enumerate(actions, start=1):
            await asyncio.sleep(0)  # let the other sessions interleave, as real generation would
            ended = ended_after is not None and t == ended_after
            decision = await member.step(action, f"o{t}", ended=ended)
            decisions.append(decision)
            if log is not None:
                log.append((index, t))
            if ended or decision.cut:
                break
        else:
            member.end()
        fate = await member.outcome()
        return decisions, fate, member.n_steps
    finally:
        member.end()


# Four sessions, K = 3. Session 2 wins at step 2 (its prefix is END-padded to [a, b, END]).
#   pairwise action-level Levenshtein of the 3-prefixes:
#   (0,1) abc/abd 1, (0,2) abc/abE 1, (0,3) abc/abc 0, (1,2) abd/abE 1, (1,3) abd/abc 1, (2,3) 1
#   d_3 = (1+1+0+1+1+1) / (6 pairs * 3) = 5/18 = 0.2778;  tau_3 = 1/4 (one ended before step 3)
GROUP = [["a", "b", "c", "x", "y"], ["a", "b", "d", "x"], ["a", "b"], ["a", "b", "c", "z"]]
ENDS = [None, None, 2, None]


async def run_group(barrier, uid="g0"):
    return await asyncio.gather(
        *(play(barrier, uid, i, acts, ENDS[i]) for i, acts in enumerate(GROUP))
    )


def test_hand_worked_group_is_cut_once_and_every_session_gets_the_same_decision():
    gate = CountingGate(GateRule(rule="r1", K=3, d_L=0.3))  # 5/18 < 0.3: cut
    barrier = GroupBarrier(gate, G=4)
    results = asyncio.run(run_group(barrier))
    assert gate.calls == 1
    fates = [fate for _, fate, _ in results]
    assert all(f.cut and f.K == 3 and f.how == DECIDED for f in fates)
    assert fates[0].signals.prefix_edit_distance_mean == pytest.approx(5 / 18)
    assert fates[0].signals.termination_fraction == pytest.approx(1 / 4)
    # o_3 = "o3" for the three sessions acting, END for session 2: 2 distinct of 4
    assert fates[0].signals.obs_unique_ratio == pytest.approx(2 / 4)
    # the sessions still acting stopped at step 3, the one that won at step 2 played 2 steps
    assert [n for _, _, n in results] == [3, 3, 2, 3]
    # the three live sessions got the cut from step() at K; the ended one only from outcome()
    assert [d[-1].cut for d, _, _ in results] == [True, True, False, True]
    assert barrier.open_groups == 0


def test_hand_worked_group_is_kept_below_the_threshold_and_sessions_play_on():
    gate = CountingGate(GateRule(rule="r1", K=3, d_L=0.25))  # 5/18 >= 0.25: keep
    barrier = GroupBarrier(gate, G=4)
    results = asyncio.run(run_group(barrier))
    assert gate.calls == 1
    assert all(not fate.cut and fate.how == DECIDED and fate.K == 3 for _, fate, _ in results)
    assert [n for _, _, n in results] == [5, 4, 2, 4]
    assert barrier.open_groups == 0


def test_r3_reads_tau_from_the_session_that_ended():
    # d_3 = 5/18 >= d_L = 0.1, but tau_3 = 1/4 >= t_high = 0.25: R3 cuts
    barrier = GroupBarrier(GateRule(rule="r3", K=3, d_L=0.1, t_high=0.25), G=4)
    assert all(fate.cut for _, fate, _ in asyncio.run(run_group(barrier)))


def test_a_group_with_no_session_acting_after_K_is_not_shown_to_the_gate():
    gate = CountingGate(GateRule(K=3, d_L=1.0))  # would cut anything it saw
    barrier = GroupBarrier(gate, G=2)

    async def main():
        return await asyncio.gather(
            play(barrier, "g", 0, ["a", "b"], ended_after=2),
            play(barrier, "g", 1, ["a", "b", "c"], ended_after=3),
        )

    results = asyncio.run(main())
    # session 1 ended at step 3 itself: nobody acts after K (the engine's rule)
    assert gate.calls == 0
    assert all(not fate.cut and fate.how == NOT_SHOWN for _, fate, _ in results)


def test_a_session_that_never_arrives_times_out_and_the_group_is_kept(virtual_time):
    barrier = GroupBarrier(GateRule(K=3, d_L=1.0), G=4, timeout_s=0.05)
    late = asyncio.Event()

    async def late_session():
        member = barrier.join("g", 3)
        try:
            await late.wait()  # stuck (a slow server) until the others were released
            decision = await member.step("a", "o1")  # steps 1-3 arrive after the timeout
            await member.step("a", "o2")
            decision = await member.step("a", "o3")
            return decision
        finally:
            member.end()

    async def main():
        late_task = asyncio.create_task(late_session())
        others = [asyncio.create_task(play(barrier, "g", i, GROUP[i], ENDS[i])) for i in range(3)]
        done = await asyncio.gather(*others)
        late.set()
        return done, await late_task

    (others, late_decision) = virtual_time.run(main())
    # released timeout_s after the last report (every session joined at 0 and reported at once)
    assert virtual_time.clock.now == pytest.approx(0.05)
    for _, fate, _ in others:
        assert not fate.cut and fate.how == TIMEOUT and fate.K == 3 and fate.n_sessions == 4
    assert [n for _, _, n in others] == [5, 4, 2]  # kept: they played their episodes out
    assert late_decision.how == TIMEOUT and not late_decision.cut  # the same decision, at once
    assert barrier.open_groups == 0


def test_a_group_short_of_sessions_is_released_by_the_timeout(virtual_time):
    barrier = GroupBarrier(FixedGate(cut=True, K=2), G=3, timeout_s=0.05)

    async def main():
        return await asyncio.gather(
            play(barrier, "g", 0, ["a", "b", "c"]), play(barrier, "g", 1, ["a", "b", "c"])
        )

    for _, fate, n in virtual_time.run(main()):
        assert not fate.cut and fate.how == TIMEOUT and fate.n_sessions == 2 and n == 3
    assert virtual_time.clock.now == pytest.approx(0.05)


@pytest.mark.parametrize(("timeout_s", "how"), [(0.2, DECIDED), (0.04, TIMEOUT)])
def test_the_clock_restarts_on_every_report(virtual_time, timeout_s, how):
    # Session 0 ends at step 1 and waits for the group's fate while session 1 plays 9 steps,
    # 0.05 s apart: 0.45 s in all. A timeout of 0.2 s is longer than every gap: the clock
    # restarts at each report and never runs out, the gate decides at K=8. One of 0.04 s is
    # shorter than the first gap: the group is released (kept) before session 1's first step.
    barrier = GroupBarrier(GateRule(K=8, d_L=0.0), G=2, timeout_s=timeout_s)

    async def slow(member_index):
        member = barrier.join("g", member_index)
        try:
            for t in range(1, 10):
                await asyncio.sleep(0.05)
                d = await member.step("go", f"o{t}", ended=t == 9)
            return await member.outcome(), d
        finally:
            member.end()

    async def main():
        return await asyncio.gather(play(barrier, "g", 0, ["go"], ended_after=1), slow(1))

    (_, fate0, _), (fate1, _) = virtual_time.run(main())
    assert fate0.how == how and fate1.how == how and not fate0.cut
    assert virtual_time.clock.now == pytest.approx(0.45)


def test_a_session_that_fails_counts_as_ended_and_frees_the_others():
    barrier = GroupBarrier(GateRule(K=2, d_L=0.6), G=2)

    async def failing():
        member = barrier.join("g", 1)
        try:
            await member.step("a", "o1")
            raise RuntimeError("server down")
        finally:
            member.end()

    async def main():
        return await asyncio.gather(
            play(barrier, "g", 0, ["a", "b", "c"]), failing(), return_exceptions=True
        )

    (decisions, fate, n), err = asyncio.run(main())
    assert isinstance(err, RuntimeError)
    # [a, b] vs [a, END]: d_2 = 1/2 < 0.6: cut, decided on the failed session's one action
    assert fate.cut and fate.signals.prefix_edit_distance_mean == pytest.approx(0.5) and n == 2
    assert barrier.open_groups == 0


def test_groups_of_the_wrong_size_are_refused_at_join():
    barrier = GroupBarrier(GateRule(K=2), G=2)
    with pytest.raises(SrolloutError, match=r"outside 0\.\.1.*G=2"):
        barrier.join("g", 2)
    barrier.join("g", 0)
    with pytest.raises(SrolloutError, match="already has a session 0"):
        barrier.join("g", 0)
    barrier.join("g")  # the next free index: 1
    with pytest.raises(SrolloutError, match="already has its G=2 sessions"):
        barrier.join("g")
    with pytest.raises(SrolloutError, match="G >= 2"):
        GroupBarrier(GateRule(K=2), G=1)
    with pytest.raises(SrolloutError, match="timeout_s"):
        GroupBarrier(GateRule(K=2), G=2, timeout_s=0)


def test_reporting_after_a_cut_or_after_the_end_is_an_error():
    barrier = GroupBarrier(FixedGate(cut=True, K=1), G=2)

    async def main():
        a, b = barrier.join("g", 0), barrier.join("g", 1)
        da, db = await asyncio.gather(a.step("x"), b.step("y"))
        assert da.cut and db.cut
        with pytest.raises(SrolloutError, match="after the group was cut at step 1"):
            await a.step("x")
        a.end()
        with pytest.raises(SrolloutError, match="after it ended"):
            await a.step("x")
        b.end()

    asyncio.run(main())
    assert barrier.open_groups == 0


def test_groups_are_independent():
    gate = CountingGate(GateRule(K=3, d_L=0.3))
    barrier = GroupBarrier(gate, G=4)

    async def main():
        return await asyncio.gather(run_group(barrier, "u1"), run_group(barrier, "u2"))

    r1, r2 = asyncio.run(main())
    assert gate.calls == 2 and all(f.cut for _, f, _ in r1 + r2)


# the 12 groups' d_3 (ungated, seed 5): 1/6, 1/3 x3, 7/18 x2, 4/9, 1/2, 5/9 x2, 11/18 x2;
# R1 cuts d_3 < d_L: none below 0.1, one below 0.3, seven below 0.5
@pytest.mark.parametrize(("d_L", "n_cut"), [(0.1, 0), (0.3, 1), (0.5, 7)])
def test_the_barrier_cuts_the_groups_the_engine_cuts(d_L, n_cut):
    """Replay the engine's ungated trajectories as asyncio sessions: the barrier cuts the same
    groups at the same step as the engine's own gate, and the same steps are played."""
    G, K = 4, 3
    specs = make_specs(tasks([2, 3, 4, 5, 8, 12]), 12)
    full, _ = roll(specs, RolloutSettings(G=G, T_max=10, seed=5, signal_K=(), arm="baseline"))
    gate = GateRule(K=K, d_L=d_L)
    gated, _ = roll(
        specs, RolloutSettings(G=G, T_max=10, seed=5, signal_K=(), gate=gate, gate_K=K, arm="gated")
    )
    engine_cut = {r.group_id: (r.cut, r.cut_step) for r in gated}
    engine_steps = {r.group_id: [len(t.actions) for t in r.trajs] for r in gated}
    barrier = GroupBarrier(gate, G=G)

    async def replay(rec):
        async def session(t):
            member = barrier.join(rec.group_id, t.traj_idx)
            try:
                for i, (a, o) in enumerate(zip(t.actions, t.observations, strict=True), 1):
                    d = await member.step(a, o, ended=i == len(t.actions))
                    if d.cut:
                        break
                return await member.outcome(), member.n_steps
            finally:
                member.end()

        return await asyncio.gather(*(session(t) for t in rec.trajs))

    async def main():
        return await asyncio.gather(*(replay(r) for r in full))

    for rec, out in zip(full, asyncio.run(main()), strict=True):
        fates = {(f.cut, f.K if f.cut else None) for f, _ in out}
        assert fates == {engine_cut[rec.group_id]}, rec.group_id
        assert [n for _, n in out] == engine_steps[rec.group_id], rec.group_id
    assert sum(c for c, _ in engine_cut.values()) == n_cut
    assert barrier.open_groups == 0
