"""The gate for a group whose G trajectories run as G separate asyncio tasks (no framework):
:class:`GroupBarrier` resolves the gate once per group at its check steps, under the engine's
rules. The usage example and what it guarantees: docs/integrations.md ("Any asyncio loop: the
group barrier")."""

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
    """What the barrier tells a session: whether the group is cut, the check step K this answers
    (None while running), ``how`` (RUNNING, DECIDED, NOT_SHOWN or TIMEOUT), the group's signals at
    K when the gate saw it, and how many sessions had joined when it was decided."""

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
    """Resolves ``gate`` (any srollout gate; an adaptive one at each of its ``check_K``) once per
    group of G >= 2 concurrent sessions; a group with no report for ``timeout_s`` seconds while a
    session waits is released and kept (why: docs/integrations.md)."""

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
        known = not any(o is None for obs in observations for o in obs[:k])  # else without them
        signals = compute_signals(actions, k, observations if known else None)  # type: ignore[arg-type]
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
