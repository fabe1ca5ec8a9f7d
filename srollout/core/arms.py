"""Training and A/B *arms* (paper §"Composition with DAPO and GRESO"): GRESO skips a prompt
*before* its rollout (:class:`GresoSkipper`), the gates act *during* it, DAPO drops zero-variance
groups *after* it and refills (:func:`dapo_fill`). What each arm does: docs/ab-rollout.md and
docs/training.md.

An arm is a name from :data:`ARM_NAMES` (its parts joined by ``+``); :func:`parse_arm` turns it into
an :class:`ArmSpec`. A *skip part* of another package (:func:`skip_part`, or an entry point of group
``srollout.arms``) stands wherever ``greso`` may (docs/extending.md). Pure Python (numpy at most),
so a trainer or the ``ab-rollout`` stage reuses the same logic; :func:`roll_arm` is the one strategy
both run.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Generic, NamedTuple, Protocol, TypeVar

import numpy as np

from srollout.core.grpo import is_zero_variance
from srollout.errors import SrolloutError, entry_point

if TYPE_CHECKING:
    from srollout.core.gate import Gate

log = logging.getLogger(__name__)

ARM_NAMES: tuple[str, ...] = (
    "baseline",
    "gated",
    "dapo",
    "greso",
    "gated+dapo",
    "gated+greso",
    "stall",
    "gated+stall",
    "stall+dapo",
    "stall+greso",
    "loop",
)


@dataclass(frozen=True)
class ArmSpec:
    """One arm: ``name`` (one of :data:`ARM_NAMES`), its switches and, once :meth:`with_gate`
    attached them, the gates it applies (None on an arm without them).

    gate, stall, loop, dapo, greso: the parts of the name; skip: the skip part greso runs
    (``greso=True`` alone means ``skip="greso"``; a ``skip`` implies greso). gate_rule / gate_K:
    the :class:`srollout.core.gate.Gate` and its step K; traj_gate: the ``StallGate`` or
    ``LoopGate``.
    """

    name: str
    gate: bool
    dapo: bool
    greso: bool
    stall: bool = False
    gate_rule: Gate | None = None
    gate_K: int | None = None
    traj_gate: Any = None
    skip: str | None = None
    loop: bool = False

    def __post_init__(self) -> None:
        if self.greso and self.skip is None:
            object.__setattr__(self, "skip", "greso")
        elif self.skip is not None and not self.greso:
            object.__setattr__(self, "greso", True)

    def with_gate(
        self,
        gate_rule: Gate | None,
        gate_K: int | None,
        traj_gate: Any = None,
        loop_gate: Any = None,
    ) -> ArmSpec:
        """This arm with ``gate_rule`` at step ``gate_K`` attached if it is a gated arm,
        ``traj_gate`` if it is a stall arm and ``loop_gate`` if it is the loop arm; an arm never
        carries a gate it does not apply."""
        if self.gate:
            self = replace(self, gate_rule=gate_rule, gate_K=gate_K)
        if self.loop:
            return replace(self, traj_gate=loop_gate)
        return replace(self, traj_gate=traj_gate) if self.stall else self


def _arm(name: str) -> ArmSpec:
    parts = name.split("+")
    return ArmSpec(
        name,
        gate="gated" in parts,
        dapo="dapo" in parts,
        greso="greso" in parts,
        stall="stall" in parts,
        loop="loop" in parts,
    )


_ARMS: dict[str, ArmSpec] = {name: _arm(name) for name in ARM_NAMES}


def parse_arm(name: str) -> ArmSpec:
    """``"gated+dapo"`` -> ArmSpec("gated+dapo", gate=True, dapo=True, greso=False); a name
    with a registered skip part where :data:`ARM_NAMES` has ``greso`` (``"gated+cooldown"``) ->
    the same switches with ``skip="cooldown"``; unknown -> SrolloutError."""
    key = str(name).strip().lower()
    if key in _ARMS:
        return _ARMS[key]
    parts = key.split("+")
    own = [p for p in parts if p not in _BUILT_IN_PARTS]
    if len(own) == 1 and "greso" not in parts and _skip_factory(own[0]) is not None:
        as_greso = "+".join("greso" if p == own[0] else p for p in parts)
        if as_greso in _ARMS:
            return replace(_ARMS[as_greso], name=key, skip=own[0])
    parts_known = sorted(set(_SKIP_PARTS) - {"greso"})
    more = f"; skip parts: {', '.join(parts_known)}" if parts_known else ""
    raise SrolloutError(
        f"unknown arm {name!r}: expected one of {', '.join(ARM_NAMES)} (a skip part of another "
        f"package, entry point group {SKIP_ENTRY_POINT_GROUP!r}, stands where greso does{more})"
    )


def parse_arms(text: str | Iterable[str]) -> tuple[ArmSpec, ...]:
    """``"baseline,gated+dapo"`` (or a sequence of names) -> the ArmSpecs in order.

    Empty items, unknown names and repeated arms raise one SrolloutError."""
    names = (
        [p.strip() for p in text.split(",")]
        if isinstance(text, str)
        else [str(p).strip() for p in text]
    )
    if not names or any(not n for n in names):
        raise SrolloutError(
            f"arms: expected names separated by commas ({', '.join(ARM_NAMES)}), got {text!r}"
        )
    arms = tuple(parse_arm(n) for n in names)
    seen = [a.name for a in arms]
    if len(set(seen)) != len(seen):
        raise SrolloutError(f"arms: each arm once, got {','.join(seen)!r}")
    return arms


# --- DAPO dynamic sampling ---------------------------------------------------------------------

GroupT = TypeVar("GroupT")


def is_useful(group: Any) -> bool:
    """A group belongs in the GRPO batch iff it was not cut (``group.cut``, False when absent) and
    its rewards (``group.rewards``, length G) have non-zero variance (σ_r > 0)."""
    return not bool(getattr(group, "cut", False)) and not is_zero_variance(list(group.rewards))


class DapoRound(NamedTuple):
    """One sampling round: round_index (0 = the iteration's first, full round), n_requested
    groups asked for, n_generated groups returned, n_useful of them, n_gen_tokens generated."""

    round_index: int
    n_requested: int
    n_generated: int
    n_useful: int
    n_gen_tokens: int


@dataclass(frozen=True)
class DapoResult(Generic[GroupT]):
    """What :func:`dapo_fill` gathered: ``useful`` (at most ``target_groups``, the GRPO batch) and
    ``generated`` (every group) in sampling order; ``rounds``, one per round that generated groups;
    ``hit_cap``: still short after the last allowed extra round; ``exhausted``: a round returned no
    group, so sampling stopped (that round is not in ``rounds``)."""

    useful: tuple[GroupT, ...]
    generated: tuple[GroupT, ...]
    rounds: tuple[DapoRound, ...]
    hit_cap: bool
    exhausted: bool

    @property
    def n_rounds(self) -> int:
        return len(self.rounds)

    @property
    def n_extra_rounds(self) -> int:
        return max(len(self.rounds) - 1, 0)

    @property
    def n_generated(self) -> int:
        return sum(r.n_generated for r in self.rounds)

    @property
    def n_gen_tokens(self) -> int:
        return sum(r.n_gen_tokens for r in self.rounds)


def dapo_fill(
    target_groups: int,
    sample_round: Callable[[int, int], Sequence[GroupT]],
    max_rounds: int,
    *,
    useful: Callable[[GroupT], bool] = is_useful,
    tokens: Callable[[GroupT], int] | None = None,
    warn: bool = True,
) -> DapoResult[GroupT]:
    """DAPO dynamic sampling as a pure driver: round 0 asks ``sample_round(target_groups, 0)``; the
    groups that are not ``useful`` (zero reward variance, or cut) are dropped, and while the batch
    is short and fewer than ``max_rounds`` *extra* rounds ran, round r asks ``sample_round(n_needed,
    r)``.

    Never raises on a short batch: it returns what was gathered with ``hit_cap`` or ``exhausted``
    (a round returned nothing), and logs a warning unless ``warn`` is False. Useful groups beyond
    the target are generated but not kept. ``tokens(group)`` counts generated tokens for the
    per-round totals (0 when not given).
    """
    if target_groups < 1:
        raise SrolloutError(f"DAPO needs a target of >= 1 useful groups, got {target_groups}")
    if max_rounds < 0:
        raise SrolloutError(f"DAPO's cap on extra rounds must be >= 0, got {max_rounds}")
    kept: list[GroupT] = []
    generated: list[GroupT] = []
    rounds: list[DapoRound] = []
    exhausted = False
    for r in range(max_rounds + 1):
        need = target_groups - len(kept)
        if need <= 0:
            break
        groups = list(sample_round(need, r))
        if not groups:  # nothing left to sample: not a round
            exhausted = True
            break
        good = [g for g in groups if useful(g)]
        n_tok = sum(int(tokens(g)) for g in groups) if tokens is not None else 0
        rounds.append(DapoRound(r, need, len(groups), len(good), n_tok))
        generated += groups
        kept += good[:need]
    hit_cap = len(kept) < target_groups and not exhausted
    if warn and len(kept) < target_groups:  # the cap, or no prompt left: never a raise
        why = "; no more prompts to sample"
        if hit_cap:
            why = f" after {max_rounds} extra round(s) (the cap)"
        log.warning(
            "DAPO: %d of %d useful groups%s; training on what was gathered",
            len(kept),
            target_groups,
            why,
        )
    return DapoResult(tuple(kept), tuple(generated), tuple(rounds), hit_cap, exhausted)


def extra_round_tasks(
    pool_size: int, used: set[int], iteration: int, round_index: int, n: int, seed: int
) -> list[int]:
    """Indices of up to ``n`` prompts for DAPO's extra round ``round_index`` (>= 1) of
    ``iteration``: distinct, none of ``used`` (this iteration's prompts so far), a draw of
    (seed, iteration, round); fewer (or none) when the pool runs out."""
    free = sorted(set(range(pool_size)) - used)
    k = min(n, len(free))
    if k == 0:
        return []
    rng = np.random.default_rng([seed, iteration, 0x7A5C, round_index])
    return sorted(int(free[i]) for i in rng.choice(len(free), size=k, replace=False))


# --- GRESO pre-rollout skipping ------------------------------------------------------------------


class GresoOutcome(NamedTuple):
    """One observed group of a prompt: prompt_id, the iteration it ran in, whether it was
    zero-variance (or cut: a cut group gave no gradient either)."""

    prompt_id: str
    iteration: int
    zero_var: bool


class GresoSkipper:
    """GRESO-style pre-rollout skipping with one fixed exploration probability p: prompt x is
    skipped at ``iteration`` iff z(x) >= 1 and u(x, iteration) >= p ** z(x), z(x) its most recent
    consecutive zero-variance groups before ``iteration``, u a hash of (seed, prompt_id, iteration)
    (:meth:`draw`), so a decision depends on no order or RNG state and a resumed run decides the
    same. A skipped prompt records no outcome, so its streak stays until an exploration roll-out
    breaks it. GRESO's own per-prompt adaptation of p is left out: one number sets an arm
    (docs/ab-rollout.md)."""

    def __init__(self, p_explore: float, seed: int, history: Iterable[GresoOutcome] = ()) -> None:
        if not 0.0 <= p_explore <= 1.0:
            raise SrolloutError(
                f"GRESO exploration probability must lie in [0, 1], got {p_explore}"
            )
        self.p_explore = float(p_explore)
        self.seed = int(seed)
        self._history: dict[str, list[GresoOutcome]] = {}
        for outcome in history:
            self.record(*outcome)

    def record(self, prompt_id: str, iteration: int, zero_var: bool) -> None:
        """Note that a group of ``prompt_id`` ran at ``iteration`` and whether it was
        zero-variance."""
        self._history.setdefault(str(prompt_id), []).append(
            GresoOutcome(str(prompt_id), int(iteration), bool(zero_var))
        )

    def streak(self, prompt_id: str, before: int | None = None) -> int:
        """z: the most recent consecutive zero-variance groups of ``prompt_id`` (only outcomes of
        iterations < ``before`` when given)."""
        z = 0
        # by iteration, so a history restored in any order gives the same streak
        for o in sorted(
            self._history.get(str(prompt_id), []), key=lambda o: o.iteration, reverse=True
        ):
            if before is not None and o.iteration >= before:
                continue
            if not o.zero_var:
                break
            z += 1
        return z

    def draw(self, prompt_id: str, iteration: int) -> float:
        """u(prompt_id, iteration) in [0, 1): the first 8 bytes of
        blake2b(seed|prompt_id|iteration) / 2^64."""
        digest = hashlib.blake2b(
            f"{self.seed}|{prompt_id}|{int(iteration)}".encode(), digest_size=8
        ).digest()
        return int.from_bytes(digest, "big") / 2.0**64

    def skip_probability(self, prompt_id: str, iteration: int) -> float:
        """1 - p^z (0 for z = 0)."""
        z = self.streak(prompt_id, before=iteration)
        return 0.0 if z == 0 else 1.0 - self.p_explore**z

    def should_skip(self, prompt_id: str, iteration: int) -> bool:
        """True iff the prompt is skipped at ``iteration`` (the rule in the class docstring)."""
        z = self.streak(prompt_id, before=iteration)
        return z >= 1 and self.draw(prompt_id, iteration) >= self.p_explore**z

    def history(self) -> list[GresoOutcome]:
        """Every recorded outcome (checkpoint this; ``GresoSkipper(p, seed, history)`` restores)."""
        return [o for outcomes in self._history.values() for o in outcomes]

    def truncate(self, last_iteration: int) -> None:
        """Forget outcomes of iterations > ``last_iteration`` (a resume from that checkpoint)."""
        for key, outcomes in self._history.items():
            self._history[key] = [o for o in outcomes if o.iteration <= last_iteration]


class Skipper(Protocol):
    """What a skip part builds: the pre-rollout skip of one arm (GRESO's :class:`GresoSkipper`
    is one). ``record`` is told every group the arm rolled out (a cut group counts as
    zero-variance: it gave no gradient); ``history`` / ``truncate`` checkpoint and resume it."""

    def should_skip(self, prompt_id: str, iteration: int) -> bool: ...

    def record(self, prompt_id: str, iteration: int, zero_var: bool) -> None: ...

    def history(self) -> list[GresoOutcome]: ...

    def truncate(self, last_iteration: int) -> None: ...


SKIP_ENTRY_POINT_GROUP = "srollout.arms"  # skip parts of other packages: name = the part
_BUILT_IN_PARTS = frozenset({"baseline", "gated", "stall", "dapo", "greso", "loop"})
SkipFactory = Callable[..., Skipper]
_SKIP_PARTS: dict[str, SkipFactory] = {}


def skip_part(name: str) -> Callable[[SkipFactory], SkipFactory]:
    """Decorator: register ``factory(*, seed, history, p_explore) -> Skipper`` (a class or a
    function) as the skip part ``name``, usable wherever an arm name has ``greso``: ``name``,
    ``gated+name``, ``stall+name``. ``seed`` is the run's seed, ``history`` the outcomes known
    before the run (``--greso-history``, a resumed run's own), ``p_explore``
    ``--greso-p-explore`` (a part may ignore it)."""
    key = str(name).strip().lower()
    if not key or not key.replace("-", "").replace("_", "").isalnum():
        raise SrolloutError(f"skip part {name!r}: a name of letters, digits, '-' and '_'")
    if key in _BUILT_IN_PARTS and (key != "greso" or key in _SKIP_PARTS):
        raise SrolloutError(f"{key!r} is a part of srollout's own arms; choose another name")

    def register(factory: SkipFactory) -> SkipFactory:
        _SKIP_PARTS[key] = factory
        return factory

    return register


@skip_part("greso")
def _greso_part(*, seed: int, history: Iterable[GresoOutcome], p_explore: float) -> Skipper:
    return GresoSkipper(p_explore, seed, history)


def _skip_factory(name: str) -> SkipFactory | None:
    """The registered factory of skip part ``name``, else its entry point's (loaded and
    registered), else None."""
    if name in _SKIP_PARTS:
        return _SKIP_PARTS[name]
    found = entry_point(SKIP_ENTRY_POINT_GROUP, name, f"arm part {name!r}")
    return None if found is None else skip_part(name)(found[0])


def skipper_for(
    name: str, *, seed: int, p_explore: float, history: Iterable[GresoOutcome] = ()
) -> Skipper:
    """The skipper of skip part ``name`` (``"greso"``, or one registered / an entry point), fed
    ``history``; an unknown name is one SrolloutError."""
    factory = _skip_factory(str(name).strip().lower())
    if factory is None:
        known = ", ".join(sorted(_SKIP_PARTS))
        raise SrolloutError(
            f"no skip part {name!r} (known: {known}; a part of another package is found through "
            f"an entry point of group {SKIP_ENTRY_POINT_GROUP!r})"
        )
    return factory(seed=int(seed), history=list(history), p_explore=float(p_explore))


def make_skipper(
    arm: ArmSpec, *, seed: int, p_explore: float, history: Iterable[GresoOutcome] = ()
) -> Skipper | None:
    """The pre-rollout skip of ``arm`` (None on an arm that skips nothing), fed ``history``."""
    if arm.skip is None:
        return None
    return skipper_for(arm.skip, seed=seed, p_explore=p_explore, history=history)


def greso_filter(
    skipper: Skipper, prompt_ids: Sequence[str], iteration: int
) -> tuple[list[int], list[int]]:
    """Split positions of ``prompt_ids`` into (kept, skipped) at ``iteration``, order kept."""
    kept, skipped = [], []
    for i, pid in enumerate(prompt_ids):
        (skipped if skipper.should_skip(pid, iteration) else kept).append(i)
    return kept, skipped


def greso_outcomes(groups: Iterable[Any]) -> list[tuple[str, bool]]:
    """(task id, zero-variance) of each group rolled out, what a :class:`Skipper` records: a cut
    group gave no gradient either, so it counts as zero-variance (``not is_useful``)."""
    return [(g.spec.task.task_id, not is_useful(g)) for g in groups]


def record_outcomes(skipper: Skipper, iteration: int, outcomes: Iterable[Sequence[Any]]) -> None:
    """Tell ``skipper`` each (task id, zero-variance) of :func:`greso_outcomes` at ``iteration``."""
    for task_id, zero_var in outcomes:
        skipper.record(task_id, iteration, bool(zero_var))


class ArmRollout(NamedTuple):
    """One arm's rollout of one batch (:func:`roll_arm`): ``generated`` every group rolled out,
    round by round; ``batch`` the groups the update gets (a DAPO arm: the useful ones; any other:
    every group not cut); ``skipped`` the positions of the planned groups GRESO skipped;
    ``rounds`` the sampling rounds (one for an arm without DAPO); ``hit_cap`` DAPO's cap."""

    generated: tuple[Any, ...]
    batch: tuple[Any, ...]
    skipped: tuple[int, ...]
    rounds: tuple[DapoRound, ...]
    hit_cap: bool


def roll_arm(
    arm: ArmSpec,
    planned: Sequence[Any],
    roll: Callable[[list[Any]], Sequence[Any]],
    refill: Callable[[int, int], Sequence[Any]],
    *,
    iteration: int,
    skipper: Skipper | None = None,
    task_ids: Sequence[str] = (),
    max_rounds: int = 3,
    tokens: Callable[[Any], int] | None = None,
    warn: bool = True,
) -> ArmRollout:
    """The arm strategy ``ab-rollout`` and ``train-onpolicy`` share, for one batch of ``planned``
    group specs: a GRESO arm first skips the planned groups whose tasks (``task_ids``) ``skipper``
    draws out at ``iteration``; the gates act inside ``roll(specs)`` (the stage's engine call); a
    DAPO arm then refills through ``refill(r, n_needed)`` (each stage seeds its extra groups its own
    way), as :func:`dapo_fill` does (``warn``: its short-batch warning). ``tokens(record)`` counts a
    group's generated tokens."""
    keep, skipped = list(range(len(planned))), []
    if arm.greso and skipper is not None:
        keep, skipped = greso_filter(skipper, task_ids, iteration)
    first = [planned[i] for i in keep]
    if arm.dapo:
        filled = dapo_fill(
            len(first),
            lambda n, r: roll(first) if r == 0 else refill(r, n),
            max_rounds,
            tokens=tokens,
            warn=warn,
        )
        generated, batch = tuple(filled.generated), tuple(filled.useful)
        return ArmRollout(generated, batch, tuple(skipped), tuple(filled.rounds), filled.hit_cap)
    records = tuple(roll(first))
    n_tokens = sum(int(tokens(r)) for r in records) if tokens is not None else 0
    n_useful = sum(map(is_useful, records))
    rounds = (DapoRound(0, len(first), len(records), n_useful, n_tokens),) if records else ()
    batch = tuple(r for r in records if not r.cut)
    return ArmRollout(records, batch, tuple(skipped), rounds, False)


def arm_summary(rows: Sequence[Mapping[str, Any]]) -> dict[str, float]:
    """Totals of one arm's per-iteration rows (keys ``iter_s``, ``n_gen_tokens``, ``n_useful``):
    wall_s (s), gen_tokens, useful groups and useful_per_s = useful / wall_s (NaN when no time)."""
    wall = float(sum(float(r["iter_s"]) for r in rows))
    tokens = int(sum(int(r["n_gen_tokens"]) for r in rows))
    useful = int(sum(int(r["n_useful"]) for r in rows))
    return {
        "wall_s": wall,
        "gen_tokens": tokens,
        "useful": useful,
        "useful_per_s": useful / wall if wall > 0 else float("nan"),
    }
