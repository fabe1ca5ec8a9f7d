"""The gate for a group whose G trajectories run as G separate asyncio tasks (no framework).

srollout's engine steps a group's G trajectories in lock-step, so at step K it holds all G
action prefixes in one place. Trainers such as verl run each of a prompt's n samples as its own
coroutine; :class:`GroupBarrier` brings them together at the gate's check steps:

1. every session joins its group before its first ``await`` (``barrier.join(uid, index)``);
2. after every environment step it reports the action it took, the observation it acted on, and
   whether its episode is over (``await member.step(action, observation, ended=...)``). The call
   returns at once, except after a check step K (the gate's K; each of an adaptive gate's
   ``check_K``) for a session that is still acting: that one waits until each of the G sessions
   has taken step K or ended;
3. the gate is resolved once for the group, on the G action lists, and every session gets the
   same :class:`GateDecision`. The engine's rules hold (:mod:`srollout.rollout.engine`, tick
   step 5): a session that ended before step K counts with its shorter action list (the signals
   pad it with END, so "finished" differs from "still acting"); a group with no session still
   acting after step K is not shown to the gate and is kept;
4. ``await member.outcome()`` gives the group's fate. A session that ended before K waits here
   for the others, because a cut group is dropped whole, the trajectories that finished early
   included (DESIGN: "A cut group is dropped from the GRPO batch entirely");
5. ``member.end()`` (call it in ``finally``) says the session is gone; the group's state is freed
   when the last session that joined it is gone.

Timeout (an inactivity clock): while a session waits, the group is released if none of its
sessions has reported anything (join, step or end) for ``timeout_s`` seconds. The group is then
**kept**: the waiting sessions get ``GateDecision(cut=False, how="timeout")``, a late session
gets the same decision when it arrives, and the group's later check steps are skipped. Keeping is
the safe side: a missed cut costs the compute the gate would have saved (and a trainer's own
after-rollout filter still drops the group if it has zero reward variance), whereas a cut decided
on part of the group could drop a group that carries learning signal. The clock restarts on every
report, so a session that ended at step 2 and waits while the others play to step K never times
out as long as they keep stepping.

Wrong group size: a session index outside ``0..G-1``, a second session with the same index, or a
(G+1)-th session raise :class:`SrolloutError` at ``join``. A group that never gets its G-th
session is released by the timeout (``GateDecision.n_sessions`` says how many had joined).

Usage (one event loop; the G sessions must run concurrently)::

    barrier = GroupBarrier(GateRule(K=10, d_L=0.12), G=8)

    async def session(uid, i):
        member = barrier.join(uid, i)
        try:
            for t in range(1, T_max + 1):
                action, observation, done = await play_one_step(...)
                decision = await member.step(action, observation, ended=done or t == T_max)
                if done or t == T_max or decision.cut:
                    break
            fate = await member.outcome()  # fate.cut: drop this trajectory (constant reward)
        finally:
            member.end()
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from srollout.core.gate import Gate, require_group_gate
from srollout.core.signals import GroupSignals, compute_signals
from srollout.errors import SrolloutError

logger = logging.getLogger(__name__)

# GateDecision.how
RUNNING = "running"  # no decision at this step (not a check step, or the session just ended)
DECIDED = "gate"  # the gate saw the group's G action lists at step K
NOT_SHOWN = "ended"  # no session was still acting after step K: not shown to the gate, kept
TIMEOUT = "timeout"  # the group went timeout_s without a report while a session waited: kept


class GateDecision(NamedTuple):
    """What the barrier tells a session.

    cut: the group is cut (stop; its trajectories are dropped). K: the check step this answers
    (None while running). how: ``"running"``, ``"gate"``, ``"ended"`` or ``"timeout"`` (module
    constants RUNNING, DECIDED, NOT_SHOWN, TIMEOUT). signals: the group's signals at K when the
    gate saw it, else None. n_sessions: sessions that had joined the group when it was decided.
    """

    cut: bool
    K: int | None = None
    how: str = RUNNING
    signals: GroupSignals | None = None
    n_sessions: int = 0


_RUNNING = GateDecision(cut=False)


@dataclass
class _Session:
    actions: list[str] = field(default_factory=list)
    observations: list[str | None] = field(default_factory=list)
    ended: bool = False  # the episode is over (done, step limit, error): no more actions
    gone: bool = False  # end() was called


@dataclass
class _Group:
    uid: Hashable
    sessions: dict[int, _Session] = field(default_factory=dict)
    next_check: int = 0  # index into the barrier's check steps of the first undecided one
    decided: dict[int, GateDecision] = field(default_factory=dict)  # check step -> decision
    fate: GateDecision | None = None  # cut, or kept for good (every check step passed, timeout)
    waiters: dict[int | None, list[asyncio.Future]] = field(default_factory=dict)  # None: fate
    last_report: float = 0.0  # time.monotonic() of the last join / step / end
    timer: asyncio.TimerHandle | None = None


class GroupMember:
    """One session's handle on its group (made by :meth:`GroupBarrier.join`)."""

    def __init__(self, barrier: GroupBarrier, group: _Group, index: int) -> None:
        self._barrier, self._group, self.index = barrier, group, index
        self._session = group.sessions[index]

    @property
    def uid(self) -> Hashable:
        return self._group.uid

    @property
    def n_steps(self) -> int:
        """Actions reported so far."""
        return len(self._session.actions)

    async def step(
        self, action: str, observation: str | None = None, *, ended: bool = False
    ) -> GateDecision:
        """Report step t = n_steps + 1: the (normalised) action taken, the observation it was
        chosen on (o_t; None if the caller has none, then the signals go without observations)
        and whether the episode is over after it. Waits for the group's decision when t is a
        check step and the session goes on; otherwise returns at once (``cut=False``)."""
        session, group = self._session, self._group
        if session.ended or session.gone:
            raise SrolloutError(
                f"session {self.index} of group {group.uid!r} reported a step after it ended"
            )
        if group.fate is not None and group.fate.cut:
            raise SrolloutError(
                f"session {self.index} of group {group.uid!r} reported a step "
                f"after the group was cut at step {group.fate.K}; stop the session"
            )
        session.actions.append(action)
        session.observations.append(observation)
        session.ended = bool(ended)
        t = len(session.actions)
        self._barrier._reported(group)
        if session.ended or t not in self._barrier.check_K:
            return _RUNNING
        if t in group.decided:
            return group.decided[t]
        return await self._barrier._wait(group, t)

    async def outcome(self) -> GateDecision:
        """The group's fate: cut (at ``K``), or kept once no check step can cut it any more."""
        group = self._group
        if group.fate is not None:
            return group.fate
        if not self._session.ended:
            # A session that is still acting may call this only after its last check step.
            last = self._barrier.check_K[-1]
            if len(self._session.actions) < last:
                raise SrolloutError(
                    f"session {self.index} of group {group.uid!r} asked for the group's outcome "
                    f"at step {len(self._session.actions)} while still acting; report its steps "
                    f"(with ended=True on the last) or call end() first"
                )
        return await self._barrier._wait(group, None)

    def end(self) -> None:
        """The session is gone (finished, cut, or failed): its actions so far count as ended.
        Idempotent; call it in ``finally``."""
        session = self._session
        if session.gone:
            return
        session.ended = session.gone = True
        self._barrier._reported(self._group)


class GroupBarrier:
    """Resolves ``gate`` once per group of G concurrent sessions (see the module docstring).

    gate: any srollout gate (GateRule, FixedGate, a loaded gate.json; an adaptive gate checks at
    each of its ``check_K``). G: sessions per group (>= 2). timeout_s: seconds a group may go
    without any report while a session waits before it is released and kept (> 0).
    """

    def __init__(self, gate: Gate, G: int, timeout_s: float = 600.0) -> None:
        if isinstance(G, bool) or not isinstance(G, int) or G < 2:
            raise SrolloutError(f"a group needs G >= 2 sessions for the gate, got G={G!r}")
        if (
            isinstance(timeout_s, bool)
            or not isinstance(timeout_s, (int, float))
            or not timeout_s > 0
        ):
            raise SrolloutError(f"timeout_s must be a number of seconds > 0, got {timeout_s!r}")
        require_group_gate(gate)
        self.gate, self.G, self.timeout_s = gate, G, float(timeout_s)
        self.check_K: tuple[int, ...] = gate.check_steps()
        self._groups: dict[Hashable, _Group] = {}

    def __repr__(self) -> str:
        return f"GroupBarrier(G={self.G}, check_K={self.check_K}, groups={len(self._groups)})"

    @property
    def open_groups(self) -> int:
        """Groups with at least one session not yet gone (their state is held)."""
        return len(self._groups)

    def join(self, uid: Hashable, index: int | None = None) -> GroupMember:
        """Register session ``index`` (0..G-1; None = the next free one) of group ``uid``."""
        group = self._groups.get(uid)
        if group is None:
            group = self._groups[uid] = _Group(uid)
        if index is None:
            free = [i for i in range(self.G) if i not in group.sessions]
            if not free:
                raise SrolloutError(
                    f"group {uid!r} already has its G={self.G} sessions; the "
                    f"barrier was built for groups of G={self.G}"
                )
            index = free[0]
        if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < self.G:
            raise SrolloutError(
                f"session index {index!r} of group {uid!r} is outside "
                f"0..{self.G - 1}: the barrier was built for groups of G={self.G} "
                "sessions"
            )
        if index in group.sessions:
            raise SrolloutError(f"group {uid!r} already has a session {index}")
        group.sessions[index] = _Session()
        member = GroupMember(self, group, index)
        self._reported(group)
        return member

    # --- internals ---------------------------------------------------------------------------

    def _reported(self, group: _Group) -> None:
        """A session of ``group`` joined, stepped or ended: restart its clock, decide what can
        be decided, free the group when every session is gone."""
        group.last_report = time.monotonic()
        self._advance(group)
        if all(s.gone for s in group.sessions.values()):
            if group.timer is not None:
                group.timer.cancel()
            if self._groups.get(group.uid) is group:
                del self._groups[group.uid]

    def _advance(self, group: _Group) -> None:
        """Decide every check step all G sessions have reached (taken it, or ended)."""
        while group.fate is None:
            if group.next_check >= len(self.check_K):
                # Every check step passed without a cut: kept for good, with the last decision.
                last = group.decided.get(self.check_K[-1], GateDecision(cut=False))
                self._settle(group, None, last)
                return
            k = self.check_K[group.next_check]
            if len(group.sessions) < self.G or not all(
                s.ended or len(s.actions) >= k for s in group.sessions.values()
            ):
                return
            decision = self._decide(group, k)
            self._settle(group, k, decision)
            group.next_check += 1
            if decision.cut:
                self._settle(group, None, decision)

    def _decide(self, group: _Group, k: int) -> GateDecision:
        sessions = [group.sessions[i] for i in range(self.G)]
        if not any(not s.ended and len(s.actions) >= k for s in sessions):
            return GateDecision(cut=False, K=k, how=NOT_SHOWN, n_sessions=self.G)
        actions = [s.actions for s in sessions]
        observations = [s.observations for s in sessions]
        if any(o is None for obs in observations for o in obs[:k]):
            signals = compute_signals(actions, k)
        else:
            signals = compute_signals(actions, k, observations)  # type: ignore[arg-type]
        cut = bool(self.gate.decide_at(k, signals))
        return GateDecision(cut=cut, K=k, how=DECIDED, signals=signals, n_sessions=self.G)

    def _settle(self, group: _Group, k: int | None, decision: GateDecision) -> None:
        """Record ``decision`` for check step ``k`` (None: the group's fate); wake its waiters."""
        if k is None:
            group.fate = decision
        else:
            group.decided[k] = decision
        for fut in group.waiters.pop(k, []):
            if not fut.done():
                fut.set_result(decision)
        if group.fate is not None:
            # A cut or a timeout also answers every later check step and the fate.
            for key in list(group.waiters):
                for fut in group.waiters.pop(key):
                    if not fut.done():
                        fut.set_result(group.fate)

    async def _wait(self, group: _Group, k: int | None) -> GateDecision:
        if k is None and group.fate is not None:
            return group.fate
        if k is not None and k in group.decided:
            return group.decided[k]
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        group.waiters.setdefault(k, []).append(fut)
        if group.timer is None:
            group.timer = loop.call_at(self._deadline(group, loop), self._check_timeout, group)
        return await fut

    def _deadline(self, group: _Group, loop: Any) -> float:
        return loop.time() + max(0.0, group.last_report + self.timeout_s - time.monotonic())

    def _check_timeout(self, group: _Group) -> None:
        group.timer = None
        if group.fate is not None or not group.waiters:
            return
        loop = asyncio.get_running_loop()
        if time.monotonic() - group.last_report < self.timeout_s:  # a report came in: wait on
            group.timer = loop.call_at(self._deadline(group, loop), self._check_timeout, group)
            return
        k = self.check_K[group.next_check] if group.next_check < len(self.check_K) else None
        missing = [
            i
            for i in range(self.G)
            if i not in group.sessions
            or not (group.sessions[i].ended or len(group.sessions[i].actions) >= (k or 0))
        ]
        logger.warning(
            "srollout gate: group %r kept without a decision at step %s: no report for "
            "%.0f s, sessions %s had not arrived (%d of G=%d joined)",
            group.uid,
            k,
            self.timeout_s,
            missing,
            len(group.sessions),
            self.G,
        )
        decision = GateDecision(cut=False, K=k, how=TIMEOUT, n_sessions=len(group.sessions))
        for later in self.check_K[group.next_check :]:
            group.decided[later] = decision
        group.next_check = len(self.check_K)
        self._settle(group, None, decision)
