"""Non-LLM policies behind the Policy protocol, and the demonstration generator.

``ExpertPolicy`` plays like a careful person who does not know the room: it visits receptacles
in a random order (opening closed ones) until it has seen every object the planner's plan
needs, then follows the plan (``ActRequest.expert_plan[0]``, replanned every step).
While exploring, its thought carries a scratchpad of the receptacles not checked yet, in the
order the room description lists them ("Not checked: cabinet 2, drawer 1."): the next list is the
previous one minus the receptacle just visited, so a small model trained on these
demonstrations only has to copy from the turn before instead of recalling the whole episode.
``NoisyExpertPolicy(eps)`` does the same, but with probability eps plays a noise action instead:
a random admissible action, or (a fraction ``invalid_frac`` of the time) an invalid one of the
kinds small models make — "go to" the receptacle it stands at, "take X from" the wrong
receptacle — so demonstrations contain "Nothing happens." followed by a recovery.
Responses are ReAct text with short templated thoughts; every trajectory's randomness comes from
``ActRequest.seed``.
"""

from __future__ import annotations

import random
import re
from collections.abc import Sequence
from dataclasses import dataclass, field

from srollout.envs.prompts import format_response, observation_of
from srollout.errors import SrolloutError
from srollout.policy.base import ActRequest, ActResponse, TrajectoryTokens, TrajKey

_NAME = re.compile(r"\b([a-z]+ \d+)\b")
_NOTHING = "Nothing happens."


EXPLORE_ORDERS = ("random", "listed")


def _kind(name: str) -> str:
    """``apple 2`` -> ``apple``."""
    return name.rsplit(" ", 1)[0]


def _plan_needs(plan: Sequence[str]) -> list[str]:
    """Objects the plan handles: X of ``take X from Y`` and ``use X``, in plan order."""
    out = []
    for a in plan:
        if a.startswith("take "):
            out.append(a[5:].split(" from ")[0])
        elif a.startswith("use "):
            out.append(a[4:])
    return list(dict.fromkeys(out))


def plan_thought(plan: Sequence[str]) -> str:
    """A short thought for playing ``plan[0]``, looking ahead to what it prepares."""
    a = plan[0]
    nxt = next((b for b in plan[1:] if not b.startswith(("go to ", "open "))), "")
    if a.startswith("go to "):
        place = a[6:]
        if nxt.startswith("take "):
            return f"I go to {place} to take the {nxt[5:].split(' from ')[0]}."
        for verb in ("heat", "cool", "clean"):
            if nxt.startswith(verb + " "):
                obj = nxt[len(verb) + 1:].split(" with ")[0]
                return f"Now I {verb} the {obj} with {place}."
        if nxt.startswith("move "):
            return f"Now I put the {nxt[5:].split(' to ')[0]} in {place}."
        if nxt.startswith("use "):
            return f"Now I go to {place} to use the {nxt[4:]}."
        return f"I go to {place}."
    if a.startswith("open "):
        return f"The {a[5:]} is closed. I open it."
    if a.startswith("take "):
        obj = a[5:].split(" from ")[0]
        return f"I see the {obj}. I take it."
    for verb in ("heat", "cool", "clean"):
        if a.startswith(verb + " "):
            obj, app = a[len(verb) + 1:].split(" with ")
            return f"I {verb} the {obj} with the {app}."
    if a.startswith("move "):
        obj, place = a[5:].split(" to ")
        return f"I put the {obj} in {place}."
    if a.startswith("use "):
        return f"I turn on the {a[4:]} to look at what I hold."
    return f"I {a}."


@dataclass
class _TrajState:
    rng: random.Random
    order: list[str] = field(default_factory=list)  # receptacles in the room description's order
    visited: set[str] = field(default_factory=set)
    seen: set[str] = field(default_factory=set)  # names ("apple 2") seen in observations
    at: str = ""  # receptacle the agent stands at ("" = middle of the room)
    last_action: str = ""
    last_noise: bool = False


class ExpertPolicy:
    """The planner expert with partial observability (see module docstring).

    Needs ``ActRequest.expert_plan`` (create the env with ``expert_plan=True``).
    """

    name = "expert"

    def __init__(self, *, seed: int = 0, explore: str = "random") -> None:
        """seed: mixed into every trajectory's ActRequest.seed (0 = the request seed alone).
        explore: ``random`` (the next receptacle to check is drawn from those not checked yet)
        or ``listed`` (the first not checked yet, in the order the room description lists
        them: a pattern a small model can learn by copying)."""
        if explore not in EXPLORE_ORDERS:
            raise SrolloutError(f"explore must be one of {', '.join(EXPLORE_ORDERS)}, got {explore!r}")
        self.seed = seed
        self.explore = explore
        self._state: dict[TrajKey, _TrajState] = {}

    # -- Policy protocol --
    def act(self, requests: list[ActRequest]) -> list[ActResponse]:
        return [ActResponse(text=self._respond(r)) for r in requests]

    def finish(self, key: TrajKey) -> TrajectoryTokens | None:
        self._state.pop(key, None)
        return None

    def was_noise(self, key: TrajKey) -> bool:
        """Whether the last response for ``key`` was a noise action (always False here)."""
        st = self._state.get(key)
        return bool(st and st.last_noise)

    # -- internals --
    def _begin(self, req: ActRequest) -> _TrajState:
        st = self._state.get(req.key)
        if st is None or req.step == 1:
            st = _TrajState(rng=random.Random(f"srollout-expert:{self.seed}:{req.seed}"))
            recs = {a[6:] for a in req.admissible if a.startswith("go to ")}
            listed = [n for n in _NAME.findall(observation_of(req.user).split("Your task is to:")[0])
                      if n in recs]
            st.order = list(dict.fromkeys(listed)) + sorted(recs - set(listed))
            self._state[req.key] = st
        return st

    def _observe(self, st: _TrajState, obs: str) -> None:
        if obs == _NOTHING:
            return
        if st.last_action.startswith("go to "):
            st.at = st.last_action[6:]
            st.visited.add(st.at)
        st.seen.update(_NAME.findall(obs.split("Your task is to:")[0]))

    def _expert_action(self, st: _TrajState, req: ActRequest, obs: str) -> tuple[str, str]:
        plan = req.expert_plan
        if not plan:
            if not req.admissible:
                raise SrolloutError("ExpertPolicy needs admissible actions and expert plans "
                                    "(create the env with expert_plan=True)")
            a = st.rng.choice([x for x in req.admissible if x != "help"])
            return f"I try to {a}.", a
        needs = _plan_needs(plan)
        unseen = [n for n in needs if n not in st.seen]
        todo = [r for r in st.order if r not in st.visited and r != st.at]
        if unseen and todo:
            left = f"Not checked: {', '.join(todo)}."
            if st.at and f"The {st.at} is closed." in obs and f"open {st.at}" in req.admissible:
                return f"The {st.at} is closed. I open it. {left}", f"open {st.at}"
            kinds = " and ".join(dict.fromkeys(_kind(n) for n in unseen))
            nxt = todo[0] if self.explore == "listed" else st.rng.choice(todo)
            return f"I need to find the {kinds}. {left} I will check {nxt}.", f"go to {nxt}"
        return plan_thought(plan), plan[0]

    def _choose(self, st: _TrajState, req: ActRequest, obs: str) -> tuple[str, str, bool]:
        thought, action = self._expert_action(st, req, obs)
        return thought, action, False

    def _respond(self, req: ActRequest) -> str:
        st = self._begin(req)
        obs = observation_of(req.user)
        self._observe(st, obs)
        thought, action, noise = self._choose(st, req, obs)
        if obs == _NOTHING and not noise:
            thought = "That did not work. " + thought
        st.last_action = action if action in req.admissible else ""
        st.last_noise = noise
        return format_response(thought, action)


class NoisyExpertPolicy(ExpertPolicy):
    """ExpertPolicy that plays a noise action with probability ``eps``; a fraction
    ``invalid_frac`` of noise actions are invalid (answered "Nothing happens.")."""

    def __init__(self, eps: float = 0.3, invalid_frac: float = 0.3, *, seed: int = 0,
                 noise: float | None = None, explore: str = "random") -> None:
        """eps: noise rate ε (``noise`` is an alias); invalid_frac: share of noise actions that
        are invalid; seed: mixed into every trajectory's seed; explore: as ExpertPolicy."""
        super().__init__(seed=seed, explore=explore)
        eps = noise if noise is not None else eps
        if not 0.0 <= eps <= 1.0 or not 0.0 <= invalid_frac <= 1.0:
            raise SrolloutError(f"eps and invalid_frac must be in [0, 1], got {eps}, {invalid_frac}")
        self.eps = eps
        self.invalid_frac = invalid_frac
        self.name = f"noisy-expert(eps={eps:g})"

    def _invalid_candidates(self, st: _TrajState, req: ActRequest) -> list[tuple[str, str]]:
        """(thought, action) pairs that the engine will reject in this state."""
        out = []
        if st.at:
            out.append((f"I go to {st.at}.", f"go to {st.at}"))
        recs = sorted({a[6:] for a in req.admissible if a.startswith("go to ")} | {st.at} - {""})
        objs = sorted(st.seen - set(recs))
        for obj in objs[:4]:
            for rec in recs[:6]:
                a = f"take {obj} from {rec}"
                if a not in req.admissible:
                    out.append((f"I take the {obj} from {rec}.", a))
        return [(t, a) for t, a in out if a not in req.admissible]

    def _choose(self, st: _TrajState, req: ActRequest, obs: str) -> tuple[str, str, bool]:
        if st.rng.random() < self.eps:
            if st.rng.random() < self.invalid_frac:
                cands = self._invalid_candidates(st, req)
                if cands:
                    t, a = st.rng.choice(cands)
                    return t, a, True
            pool = [a for a in req.admissible if a not in ("help", "look", "inventory")]
            if pool:
                a = st.rng.choice(pool)
                return f"Maybe I should {a}.", a, True
        return super()._choose(st, req, obs)
