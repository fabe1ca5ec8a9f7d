"""The batched group-rollout engine: a pool of groups in flight, stepped together, gated at step K.

One *tick* of :func:`run_groups`:

1. admit queued groups while the pool has G free slots for the next one (a slot = one live
   trajectory; ``concurrency`` slots in all); an admitted group resets its G environments;
2. one batched ``policy.act`` over every live trajectory of every group in flight;
3. parse each response into (thought, action) and step that trajectory's environment;
4. a trajectory whose episode is won (``done``) or that just took step T_max ends
   (``policy.finish``) and frees its slot; so does one the trajectory gate stops
   (``ended_by="stalled"``: :mod:`srollout.core.trajectory_gate`, shown each live trajectory's
   :class:`~srollout.core.trajectory_signals.TrajectoryState` after every step), keeping the
   reward it earned so far; its group goes on with the others and ends with its last one;
5. a group that has just taken one of the gate's check steps (K for a fixed-K rule; every
   K_j of ``gate.check_K`` for an adaptive-K gate) and still has live trajectories is shown to
   the gate; when it fires, every live trajectory of the group ends at once
   (``ended_by="gate"``, ``cut_step`` = that step), so its later steps are never generated and
   its slots (and their KV cache, freed by ``policy.finish``) go to the next queued group;
6. a group with no live trajectory left is finished: its signals at every configured K, its
   rewards, label and rows are handed to ``on_group`` as a :class:`GroupRecord`.

Seeds come from (run seed, group index, traj_idx) (:mod:`srollout.rollout.seeding`), never from
the order groups are scheduled in, so a gated and an ungated run agree up to step K.

Timing: ``gen_s`` of a step row is the tick's measured ``policy.act`` wall-clock split over the
tick's rows in proportion to the tokens each row generated (evenly when no row generated tokens,
e.g. the expert policies); ``env_s`` is that row's own measured ``env.step`` wall-clock. So the
sum of ``gen_s`` over all rows equals the measured generation time of the run.

Labels: the engine labels a group from what it observed, the truncated rewards of a cut group
included (for logging only: docs/artifacts.md, under the groups table).
"""

from __future__ import annotations

import dataclasses
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

from srollout.core.trajectory_signals import (
    LoopTracker,
    NoveltyTracker,
    TrajectoryState,
    next_rejected_run,
)
from srollout.envs.base import StepResult, Task, TextEnv
from srollout.errors import SrolloutError
from srollout.policy.base import ActRequest, ActResponse, Policy, TrajectoryTokens, TrajKey
from srollout.rollout.env_calls import (
    EnvRandom,
    env_call,
    env_name,
    env_random,
    env_step,
    outcome,
    reset_result,
)
from srollout.rollout.seeding import traj_seeds
from srollout.rollout.settings import RolloutSettings  # noqa: F401  (the engine's settings, importable here)
from srollout.schemas import StepRow

if TYPE_CHECKING:
    from srollout.core.signals import GroupSignals

# --- what the engine is given ---------------------------------------------------------------


class ParsedTurn(NamedTuple):
    """One response, parsed by the ReAct protocol.

    thought: the reasoning text ('' when absent); action: the action text sent to the env;
    normalized: the action as the signals see it (envs.prompts.normalize_action).
    """

    thought: str
    action: str
    normalized: str


class Prompter(Protocol):
    """The ReAct protocol the engine speaks (bound to ``srollout.envs.prompts`` by the stages)."""

    def system(self, task: Task) -> str: ...

    def user(
        self, observation: str, step: int, task: Task, admissible: Sequence[str] = ()
    ) -> str: ...

    def parse(self, text: str) -> ParsedTurn: ...


@dataclass(frozen=True)
class GroupSpec:
    """One group to roll out: ``index`` is its position in the run (seeds derive from it)."""

    index: int
    task: Task

    @property
    def group_id(self) -> str:
        return group_id_of(self.index)


def group_id_of(index: int) -> str:
    """Stable group id of the group at position ``index`` (same in both arms of an A/B)."""
    return f"g{index:05d}"


# --- what the engine hands back ---------------------------------------------------------------


@dataclass
class TrajRecord:
    """One finished trajectory: its per-step rows and its summary.

    steps: one dict per step with the columns of schemas.STEPS but the group's task columns.
    actions / observations: normalised a_1..a_n and the observations o_1..o_n acted on.
    audited_stop: the step the trajectory gate fired at when the audit let the trajectory run
    on (``RolloutSettings.traj_audit``; None otherwise): it played to its end for its label.
    shadow_stop: the step the trajectory gate would have stopped it at, in a shadow run
    (``RolloutSettings.shadow``; it played on).
    """

    traj_idx: int
    seed: int
    env_seed: int
    steps: list[dict[str, Any]] = field(default_factory=list)
    actions: list[str] = field(default_factory=list)
    observations: list[str] = field(default_factory=list)
    reward: float = 0.0
    success: bool = False
    ended_by: str | None = None
    n_gen_tokens: int = 0
    n_prompt_tokens: int = 0
    reset_s: float = 0.0
    tokens: TrajectoryTokens | None = None
    audited_stop: int | None = None
    shadow_stop: int | None = None

    @property
    def stalled(self) -> bool:
        """Ended by the trajectory gate."""
        return self.ended_by == "stalled"


@dataclass
class GroupRecord:
    """One finished group, everything the Parquet tables need (see rollout.records).

    cut / cut_step: whether the gate stopped the group, at which step (None when not cut).
    signals: K -> GroupSignals for every recorded K (for a cut group only K <= cut_step).
    gate_K / gate_signals: the last step the gate was evaluated at (the cut step of a cut
    group) and the signals it saw there (None when no gate ran: no gate, or every trajectory
    ended before the first check step).
    wall_s: admission to finish wall-clock of the group, seconds.
    gate_checks: every step the gate was evaluated at, in order (one for a fixed-K gate; up to
    len(check_K) for an adaptive-K gate). audited: a cut group whose trajectories ran on to the
    end for the audit (``RolloutSettings.audit``); its trajectories and rewards are full ones.
    shadow_cut_step: in a shadow run (``RolloutSettings.shadow``), the step the gate would have
    cut the group at (None: it would not); the group was not cut.
    """

    spec: GroupSpec
    G: int
    arm: str
    trajs: list[TrajRecord]
    cut: bool = False
    cut_step: int | None = None
    gate_K: int | None = None
    gate_signals: GroupSignals | None = None
    signals: dict[int, GroupSignals] = field(default_factory=dict)
    wall_s: float = 0.0
    started_tick: int = 0
    finished_tick: int = 0
    gate_checks: list[int] = field(default_factory=list)
    audited: bool = False
    shadow_cut_step: int | None = None

    @property
    def group_id(self) -> str:
        return self.spec.group_id

    @property
    def rewards(self) -> list[float]:
        return [t.reward for t in self.trajs]


class TickStats(NamedTuple):
    """One tick, for progress bars and utilisation: rows = live trajectories that acted."""

    tick: int
    rows: int
    gen_tokens: int
    gen_s: float
    env_s: float
    groups_in_flight: int
    groups_done: int


class RolloutSummary(NamedTuple):
    """Totals of one :func:`run_groups` call.

    wall_s: the call's wall-clock; gen_s / env_s / reset_s: measured generation, env-step and
    env-reset time; overhead_s = wall_s - the three; ticks: batched policy calls; rows: policy
    responses generated (= env steps taken); mean_batch = rows / ticks.
    """

    groups: int
    wall_s: float
    gen_s: float
    env_s: float
    reset_s: float
    overhead_s: float
    ticks: int
    rows: int
    mean_batch: float
    n_gen_tokens: int
    n_prompt_tokens: int
    n_cut: int
    n_stalled: int = 0

    @classmethod
    def of(cls, wall_s: float, workers: int = 1, **measured: Any) -> RolloutSummary:
        """A summary from the measured totals (every field but the two derived here):
        overhead_s = workers x wall_s minus the measured seconds (on Ray: worker-seconds spent
        on neither generation, env steps nor resets: start-up, idle, transfer), mean_batch."""
        gen_s, env_s, reset_s = measured["gen_s"], measured["env_s"], measured["reset_s"]
        ticks = measured["ticks"]
        return cls(
            wall_s=wall_s,
            overhead_s=workers * wall_s - gen_s - env_s - reset_s,
            mean_batch=measured["rows"] / ticks if ticks else 0.0,
            **measured,
        )

    @classmethod
    def total(
        cls, summaries: Sequence[RolloutSummary], wall_s: float, workers: int = 1
    ) -> RolloutSummary:
        """Several calls' totals as one summary: counts and measured seconds summed, ``wall_s``
        given (a driver's clock, or the sum of sequential calls' clocks)."""
        summed = [f for f in cls._fields if f not in ("wall_s", "overhead_s", "mean_batch")]
        return cls.of(wall_s, workers, **{f: sum(getattr(s, f) for s in summaries) for f in summed})


# --- the engine ---------------------------------------------------------------------------------


@dataclass
class _Live:
    """A trajectory in flight: its record, its env and what it acts on next."""

    rec: TrajRecord
    key: TrajKey
    env: TextEnv
    observation: str
    admissible: tuple[str, ...]
    expert_plan: tuple[str, ...]
    novelty: NoveltyTracker
    rng: EnvRandom | Any
    state: TrajectoryState = TrajectoryState(0, 0, 0)
    over: bool = False  # the environment said the episode is over (won or lost)
    loops: LoopTracker = field(default_factory=LoopTracker)  # the loop detector's signals


@dataclass
class _Group:
    record: GroupRecord
    system: str
    live: list[_Live]
    step: int = 0
    t0: float = 0.0


@dataclass
class _Totals:
    """Running totals of one :func:`run_groups` call (seconds are measured wall-clock), named as
    :class:`RolloutSummary`'s fields."""

    groups: int = 0
    gen_s: float = 0.0
    env_s: float = 0.0
    reset_s: float = 0.0
    ticks: int = 0
    rows: int = 0
    n_gen_tokens: int = 0
    n_prompt_tokens: int = 0
    n_cut: int = 0
    n_stalled: int = 0

    def summary(self, wall_s: float) -> RolloutSummary:
        return RolloutSummary.of(wall_s, **dataclasses.asdict(self))


class _TickResult(NamedTuple):
    """What one batched policy call produced: rows acted, generated tokens, measured seconds."""

    rows: int
    gen_tokens: int
    prompt_tokens: int
    gen_s: float
    env_s: float


def _step_row(
    state: TrajectoryState,
    turn: ParsedTurn,
    resp: ActResponse,
    result: StepResult,
    gen_s: float,
    env_s: float,
) -> dict[str, Any]:
    """One step's row: :class:`srollout.schemas.StepRow`, the columns of schemas.STEPS but the
    group's and trajectory's keys (records.py adds them)."""
    return StepRow(
        step=state.step,
        thought=turn.thought,
        action=turn.normalized,
        response=resp.text,
        observation=result.observation,
        valid=bool(result.valid),
        reward=float(result.reward),
        done=bool(result.done),
        n_prompt_tokens=int(resp.n_prompt_tokens),
        n_gen_tokens=int(resp.n_gen_tokens),
        logprob_mean=float(resp.logprob_mean),
        logprob_min=float(resp.logprob_min),
        steps_since_new=state.since_new,
        rejected_run=state.rejected_run,
        gen_s=gen_s,
        env_s=env_s,
    )._asdict()


class _Pool:
    """The groups in flight of one :func:`run_groups` call, with its environments and totals.

    Each method is one step of a tick (see the module docstring): :meth:`admit_queued` (1),
    :meth:`act` (2-3), :meth:`advance` (4-5), :meth:`finish_groups` (6).
    """

    def __init__(
        self,
        policy: Policy,
        env_factory: Callable[[], TextEnv],
        prompter: Prompter,
        settings: RolloutSettings,
        on_group: Callable[[GroupRecord], None] | None,
        compute_signals: Callable[..., GroupSignals],
        envs: list[TextEnv] | None = None,
    ) -> None:
        self.policy = policy
        self.env_factory = env_factory
        self.prompter = prompter
        self.settings = settings
        self.on_group = on_group
        self.compute_signals = compute_signals
        self.gate_steps = frozenset(settings.gate_steps)
        self.in_flight: list[_Group] = []
        self.idle_envs: list[TextEnv] = envs if envs is not None else []
        self.all_envs: list[TextEnv] = []  # made by this call; closed at its end unless lent
        self.lent = envs is not None
        self.totals = _Totals()

    # environments and trajectories

    def take_env(self) -> TextEnv:
        """A free environment, made by ``env_factory`` when none is idle."""
        if self.idle_envs:
            return self.idle_envs.pop()
        name = f"environment #{len(self.all_envs) + 1}"
        env = env_call(self.env_factory, name, "make_env()", "a new environment for the pool")
        self.all_envs.append(env)
        return env

    def end(self, live: _Live, ended_by: str) -> None:
        """End one trajectory: record why, collect its tokens, free its environment."""
        live.rec.ended_by = ended_by
        live.rec.tokens = self.policy.finish(live.key)
        self.idle_envs.append(live.env)

    def close(self) -> None:
        for env in [] if self.lent else self.all_envs:
            env.close()

    # 1. admission

    def admit(self, spec: GroupSpec, tick: int) -> _Group:
        """Start one group: reset G environments with the group's seeds."""
        settings = self.settings
        g0 = time.perf_counter()
        record = GroupRecord(spec=spec, G=settings.G, arm=settings.arm, trajs=[], started_tick=tick)
        group = _Group(record=record, system=self.prompter.system(spec.task), live=[], t0=g0)
        for i in range(settings.G):
            seeds = traj_seeds(settings.seed, spec.index, i)
            rec = TrajRecord(traj_idx=i, seed=seeds.sample, env_seed=seeds.env)
            env = self.take_env()
            r0 = time.perf_counter()
            rng = env_random(env, seeds.env)  # the game's own global generators (env_calls.py)
            where = f"group {spec.group_id} (task {spec.task.task_id}), trajectory {i}"
            with rng.active():
                out = env_call(
                    env.reset, env_name(env), "reset(task, seed)", where, spec.task, seeds.env
                )
            observation, info = reset_result(out, env_name(env), where)
            rec.reset_s = time.perf_counter() - r0
            self.totals.reset_s += rec.reset_s
            record.trajs.append(rec)
            key = TrajKey(spec.group_id, i)
            admissible, plan = tuple(info.admissible), tuple(info.expert_plan)
            novelty = NoveltyTracker(observation)
            group.live.append(_Live(rec, key, env, observation, admissible, plan, novelty, rng))
        return group

    def admit_queued(self, queue: deque[GroupSpec], tick: int) -> None:
        """Admit queued groups while the pool has G free slots for the next one."""
        free = self.settings.concurrency - sum(len(g.live) for g in self.in_flight)
        while queue and free >= self.settings.G:
            self.in_flight.append(self.admit(queue.popleft(), tick))
            free -= self.settings.G

    # 2-3. one batched policy call, then one env step per live trajectory

    def _request(self, group: _Group, live: _Live) -> ActRequest:
        step = group.step + 1
        return ActRequest(
            key=live.key,
            step=step,
            seed=live.rec.seed,
            system=group.system,
            user=self.prompter.user(
                live.observation, step, group.record.spec.task, live.admissible
            ),
            admissible=live.admissible,
            expert_plan=live.expert_plan,
            observation=live.observation,
        )

    def act(self) -> _TickResult:
        """One ``policy.act`` over every live trajectory; step each one's environment."""
        rows = [(g, live) for g in self.in_flight for live in g.live]
        requests = [self._request(g, live) for g, live in rows]
        a0 = time.perf_counter()
        responses = self.policy.act(requests)
        gen_s = time.perf_counter() - a0
        if len(responses) != len(requests):
            raise RuntimeError(
                f"policy {self.policy.name!r} returned {len(responses)} responses "
                f"for {len(requests)} requests"
            )
        tick_tokens = sum(r.n_gen_tokens for r in responses)
        tick_env_s = 0.0
        for (g, live), resp in zip(rows, responses, strict=True):
            # gen_s is split over the tick's rows by generated tokens (evenly when none)
            share = resp.n_gen_tokens / tick_tokens if tick_tokens > 0 else 1.0 / len(rows)
            turn = self.prompter.parse(resp.text)
            e0 = time.perf_counter()
            where = partial(_step_where, g, live)  # made only when an error needs it
            with live.rng.active():
                result = env_call(
                    env_step,
                    env_name(live.env),
                    partial(_step_what, turn),
                    where,
                    live.env,
                    turn.action,
                )
            env_s = time.perf_counter() - e0
            won = outcome(result, env_name(live.env), where)
            tick_env_s += env_s
            rec = live.rec
            rec.actions.append(turn.normalized)
            rec.observations.append(live.observation)
            rec.reward += float(result.reward)
            rec.n_gen_tokens += int(resp.n_gen_tokens)
            rec.n_prompt_tokens += int(resp.n_prompt_tokens)
            rejected = next_rejected_run(live.state.rejected_run, bool(result.valid))
            since_new = live.novelty.step(result.observation)
            loops = live.loops.step(turn.normalized, result.observation, bool(result.valid))
            live.state = TrajectoryState(g.step + 1, since_new, rejected, loops)
            rec.steps.append(_step_row(live.state, turn, resp, result, gen_s * share, env_s))
            live.observation = result.observation
            live.admissible = tuple(result.admissible)
            live.expert_plan = tuple(result.expert_plan)
            if result.done:  # over: won, unless the environment says it was lost
                live.over, rec.success = True, won
        prompt_tokens = sum(r.n_prompt_tokens for r in responses)
        return _TickResult(len(rows), tick_tokens, prompt_tokens, gen_s, tick_env_s)

    # 4-5. end finished trajectories, show groups at a check step to the gate

    def advance(self) -> None:
        """Count the step taken by every group in flight; end won, T_max and stalled
        trajectories; gate."""
        traj_gate, traj_audit = self.settings.traj_gate, self.settings.traj_audit
        for g in self.in_flight:
            g.step += 1
            still = []
            for live in g.live:
                if live.over:
                    self.end(live, "done" if live.rec.success else "lost")
                elif g.step >= self.settings.T_max:
                    self.end(live, "max_steps")
                elif (
                    traj_gate is not None
                    and live.rec.audited_stop is None
                    and live.rec.shadow_stop is None
                    and traj_gate.stops(live.state)
                ):
                    if self.settings.shadow:  # recorded, and nothing stops
                        live.rec.shadow_stop = g.step
                        still.append(live)
                    elif traj_audit is not None and traj_audit(
                        g.record.spec.index, live.rec.traj_idx
                    ):
                        live.rec.audited_stop = g.step  # the audit lets it run on for its label
                        still.append(live)
                    else:
                        self.end(live, "stalled")
                        self.totals.n_stalled += 1
                else:
                    still.append(live)
            g.live = still
            decided = g.record.cut or g.record.shadow_cut_step is not None
            if g.step in self.gate_steps and g.live and not decided:
                self.check_gate(g)

    def check_gate(self, g: _Group) -> None:
        """Show the group's signals at this step to the gate; when it fires, end the group."""
        trajs = g.record.trajs
        actions, observations = [t.actions for t in trajs], [t.observations for t in trajs]
        sig = with_step_signals(self.compute_signals(actions, g.step, observations), trajs, g.step)
        g.record.gate_K, g.record.gate_signals = g.step, sig
        g.record.gate_checks.append(g.step)
        if self.settings.gate.decide_at(g.step, sig):
            if self.settings.shadow:  # recorded, and the group plays on
                g.record.shadow_cut_step = g.step
                return
            g.record.cut, g.record.cut_step = True, g.step
            self.totals.n_cut += 1
            audit = self.settings.audit
            if audit is not None and audit(g.record.spec.index):
                g.record.audited = True  # the cut stands; the audit lets it run to the end
                return
            for live in g.live:
                self.end(live, "gate")
            g.live = []

    # 6. finished groups

    def finish_groups(self, tick: int) -> None:
        """Hand every group with no live trajectory left to ``on_group``."""
        finished = [g for g in self.in_flight if not g.live]
        self.in_flight = [g for g in self.in_flight if g.live]
        for g in finished:
            self.finalize(g, tick)

    def finalize(self, group: _Group, tick: int) -> None:
        """Record the group's signals at every recorded K it reached, its wall-clock; emit it."""
        record = group.record
        record.finished_tick = tick
        last = record.cut_step if record.cut else self.settings.T_max
        actions = [t.actions for t in record.trajs]
        observations = [t.observations for t in record.trajs]
        for k in self.settings.recorded_K:
            if k == record.gate_K and record.gate_signals is not None:
                record.signals[k] = record.gate_signals  # the gate's own, from the same prefix
            elif k <= last:
                record.signals[k] = with_step_signals(
                    self.compute_signals(actions, k, observations), record.trajs, k
                )
        record.wall_s = time.perf_counter() - group.t0
        self.totals.groups += 1
        if self.on_group is not None:
            self.on_group(record)

    def count(self, tick: _TickResult) -> None:
        """Add one tick to the run's totals."""
        totals = self.totals
        totals.gen_s += tick.gen_s
        totals.env_s += tick.env_s
        totals.rows += tick.rows
        totals.ticks += 1
        totals.n_gen_tokens += tick.gen_tokens
        totals.n_prompt_tokens += tick.prompt_tokens


def run_groups(
    specs: Sequence[GroupSpec],
    policy: Policy,
    env_factory: Callable[[], TextEnv],
    prompter: Prompter,
    settings: RolloutSettings,
    on_group: Callable[[GroupRecord], None] | None = None,
    on_tick: Callable[[TickStats], None] | None = None,
    envs: list[TextEnv] | None = None,
) -> RolloutSummary:
    """Roll out every group of ``specs`` through the batched pool; return the run's totals.

    specs: the groups, started in this order as slots free up; each finished group is passed to
    ``on_group`` (in finishing order, which depends on scheduling; its content does not).
    env_factory: makes one environment; the engine keeps a free list of them and ``reset``s a
    free one for each new trajectory, closing all at the end. envs: a free list lent by the
    caller instead (a Ray worker's, kept warm between calls): drawn from, refilled with what
    this call makes, and never closed here.
    """
    from srollout.core.signals import compute_signals

    t_start = time.perf_counter()
    queue = deque(specs)
    pool = _Pool(policy, env_factory, prompter, settings, on_group, compute_signals, envs)
    tick = 0
    try:
        while queue or pool.in_flight:
            pool.admit_queued(queue, tick)
            tick += 1
            result = pool.act()
            pool.advance()
            pool.finish_groups(tick)
            pool.count(result)
            if on_tick is not None:
                on_tick(
                    TickStats(
                        tick,
                        result.rows,
                        result.gen_tokens,
                        result.gen_s,
                        result.env_s,
                        len(pool.in_flight),
                        pool.totals.groups,
                    )
                )
    finally:
        pool.close()
    return pool.totals.summary(time.perf_counter() - t_start)


def with_step_signals(sig: GroupSignals, trajs: Sequence[TrajRecord], K: int) -> GroupSignals:
    """``sig`` with the group's step signals at K (:mod:`srollout.core.step_signals`), read from
    the step rows the trajectories recorded."""
    from srollout.core.step_signals import STEP_COLUMNS, step_signals

    columns = {col: [[row[col] for row in t.steps] for t in trajs] for col in STEP_COLUMNS}
    return sig.with_steps(tuple(step_signals(columns, K).items()))


def _step_where(g: _Group, live: _Live) -> str:
    return (
        f"group {g.record.group_id} (task {g.record.spec.task.task_id}), trajectory "
        f"{live.rec.traj_idx}, step {g.step + 1}"
    )


def _step_what(turn: ParsedTurn) -> str:
    return f"step({turn.action!r})"


def make_specs(tasks: Sequence[Task], n_groups: int, start: int = 0) -> list[GroupSpec]:
    """Groups ``start..n_groups-1`` of a run: group i plays ``tasks[i % len(tasks)]``, so past
    the task set's end tasks repeat in order, with fresh seeds (seeds derive from the index)."""
    if not tasks:
        raise SrolloutError("the task set is empty")
    return [GroupSpec(index=i, task=tasks[i % len(tasks)]) for i in range(start, n_groups)]


def select(specs: Iterable[GroupSpec], skip_ids: Iterable[str]) -> list[GroupSpec]:
    """``specs`` without the groups whose id is in ``skip_ids`` (resume: finished parts)."""
    skip = set(skip_ids)
    return [s for s in specs if s.group_id not in skip]
