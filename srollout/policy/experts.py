"""Non-LLM policies behind the Policy protocol: the planner-driven experts.

``ExpertPolicy`` plays like a careful person who does not know the room: it visits receptacles
in a random order (opening closed ones) until it has seen every object the planner's plan
needs, then follows the plan (``ActRequest.expert_plan[0]``, replanned every step).
``NoisyExpertPolicy(eps)`` does the same, but with probability eps plays a noise action instead:
a random admissible action, or (a fraction ``invalid_frac`` of the time) an invalid one of the
kinds small models make — "go to" the receptacle it stands at, "take X from" the wrong
receptacle — so demonstrations contain "Nothing happens." followed by a recovery.
Two choices shape what a model trained on these demonstrations has to learn, ``take``
(``planned`` or ``greedy``) and ``thoughts`` (``react`` or ``scratchpad``, the receptacles not
checked yet in the room's listed order, so the next one to check is copied from the turn before):
docs/default-policy.md, the recipe's fields.

Responses are ReAct text; every trajectory's randomness comes from ``ActRequest.seed``. The
default-policy build plays them for its demonstrations (:mod:`srollout.default_policy.demos`).
"""

from __future__ import annotations

import random
import re
from collections.abc import Sequence
from dataclasses import dataclass, field

from srollout.envs.base import NOTHING_HAPPENS
from srollout.envs.prompts import format_response, observation_of
from srollout.errors import SrolloutError
from srollout.policy.base import ActRequest, ActResponse, TrajectoryTokens, TrajKey

_NAME = re.compile(r"\b([a-z]+ \d+)\b")


EXPLORE_ORDERS = ("random", "listed")
TAKE_RULES = ("planned", "greedy")
THOUGHT_STYLES = ("react", "scratchpad")
_PLAN_STEPS = ("go to ", "open ", "close ")


def _observation(req: ActRequest) -> str:
    """o_t of ``req``: the engine's raw observation, else read back from a default-template turn."""
    return req.observation.strip() if req.observation is not None else observation_of(req.user)


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
                obj = nxt[len(verb) + 1 :].split(" with ")[0]
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
            obj, app = a[len(verb) + 1 :].split(" with ")
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
    visited: set[str] = field(default_factory=set)  # receptacles whose inside was in view
    seen: set[str] = field(default_factory=set)  # names ("apple 2") seen in observations
    at: str = ""  # receptacle the agent stands at ("" = middle of the room)
    here: set[str] = field(default_factory=set)  # objects in view at ``at``
    holding: str = ""  # object in the agent's hands ("" = none)
    placed: set[str] = field(default_factory=set)  # objects the agent put somewhere itself
    last_action: str = ""
    last_noise: bool = False


class ExpertPolicy:
    """The planner expert with partial observability (see module docstring).

    Needs ``ActRequest.expert_plan`` (create the env with ``expert_plan=True``).
    """

    name = "expert"

    def __init__(
        self,
        *,
        seed: int = 0,
        explore: str = "random",
        take: str = "planned",
        thoughts: str = "react",
    ) -> None:
        """seed: mixed into every trajectory's ActRequest.seed (0 = the request seed alone).
        explore: ``random`` (the next receptacle to check is drawn from those not checked yet)
        or ``listed`` (the first not checked yet, in the order the room description lists
        them: a pattern a small model can learn by copying).
        take, thoughts: see the module docstring."""
        for what, value, allowed in (
            ("explore", explore, EXPLORE_ORDERS),
            ("take", take, TAKE_RULES),
            ("thoughts", thoughts, THOUGHT_STYLES),
        ):
            if value not in allowed:
                raise SrolloutError(f"{what} must be one of {', '.join(allowed)}, got {value!r}")
        self.seed = seed
        self.explore = explore
        self.take = take
        self.thoughts = thoughts
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

    def played(self, key: TrajKey, action: str, admissible: Sequence[str]) -> None:
        """Tell the expert that ``action`` (normalised), not its own answer, was played for ``key``
        this step: its next observation is then read as the outcome of that action. For labelling
        the states another policy visits (the default policy's self-correction rounds)."""
        st = self._state.get(key)
        if st is not None:
            st.last_action = action if action in admissible else ""

    # -- internals --
    def _begin(self, req: ActRequest) -> _TrajState:
        st = self._state.get(req.key)
        if st is None or req.step == 1:
            st = _TrajState(rng=random.Random(f"srollout-expert:{self.seed}:{req.seed}"))
            recs = {a[6:] for a in req.admissible if a.startswith("go to ")}
            listed = [
                n
                for n in _NAME.findall(_observation(req).split("Your task is to:")[0])
                if n in recs
            ]
            st.order = list(dict.fromkeys(listed)) + sorted(recs - set(listed))
            self._state[req.key] = st
        return st

    def _observe(self, st: _TrajState, obs: str) -> None:
        if obs == NOTHING_HAPPENS:
            return
        names = _NAME.findall(obs.split("Your task is to:")[0])
        last = st.last_action
        if last.startswith("go to "):
            st.at = last[6:]
            st.here = set(names) - {st.at}
            # greedy: checked once its inside was in view; planned (v2-v5): once arrived at
            if self.take == "planned" or f"The {st.at} is closed." not in obs:
                st.visited.add(st.at)
        elif last.startswith("open "):
            st.here = set(names) - {st.at, last[5:]}
            st.visited.add(last[5:])
        elif last.startswith("take "):
            st.holding = last[5:].split(" from ")[0]
            st.here.discard(st.holding)
        elif last.startswith("move "):
            st.placed.add(st.holding)
            st.holding = ""
        st.seen.update(names)

    def _todo(self, st: _TrajState) -> list[str]:
        """Receptacles not visited yet, in the exploration order, the current one excluded."""
        return [r for r in st.order if r not in st.visited and r != st.at]

    def _looking_for(self, st: _TrajState, plan: Sequence[str]) -> list[str]:
        """Kinds the agent still has to find: of the objects the plan takes or uses, those not
        in its hands and not seen yet."""
        return list(
            dict.fromkeys(
                _kind(n) for n in _plan_needs(plan) if n != st.holding and n not in st.seen
            )
        )

    def _scratchpad(self, st: _TrajState, plan: Sequence[str]) -> str:
        kinds = self._looking_for(st, plan)
        find = f"Find {' and '.join(kinds)}. " if kinds else ""
        return f"{find}Unchecked: {', '.join(self._todo(st)) or 'none'}."

    def _greedy_take(self, st: _TrajState, req: ActRequest, plan: Sequence[str]) -> str:
        """``take O from <here>`` for an object O in view of a kind the plan takes, hands free."""
        if st.holding or not st.at:
            return ""
        kinds = {_kind(a[5:].split(" from ")[0]) for a in plan if a.startswith("take ")}
        for obj in sorted(st.here - st.placed):
            action = f"take {obj} from {st.at}"
            if _kind(obj) in kinds and action in req.admissible:
                return action
        return ""

    def _plan_is_known(self, st: _TrajState, plan: Sequence[str]) -> bool:
        """Whether the plan's next real action (past moves and opening) names only what the
        agent has seen or holds, so following it needs no knowledge the agent lacks."""
        nxt = next((a for a in plan if not a.startswith(_PLAN_STEPS)), "")
        return all(n in st.seen or n == st.holding for n in _NAME.findall(nxt))

    def _expert_action(self, st: _TrajState, req: ActRequest, obs: str) -> tuple[str, str]:
        plan = req.expert_plan
        if not plan:
            if not req.admissible:
                raise SrolloutError(
                    "ExpertPolicy needs admissible actions and expert plans "
                    "(create the env with expert_plan=True)"
                )
            a = st.rng.choice([x for x in req.admissible if x != "help"])
            return f"I try to {a}.", a
        todo = self._todo(st)
        if self.take == "greedy":
            take = self._greedy_take(st, req, plan)
            explore = not take and todo and not self._plan_is_known(st, plan)
        else:
            take = ""
            explore = todo and any(n not in st.seen for n in _plan_needs(plan))
        pad = self.thoughts == "scratchpad"
        if take:
            return (self._scratchpad(st, plan) if pad else plan_thought([take])), take
        if explore:
            left = f"Not checked: {', '.join(todo)}."
            closed = (
                f"The {st.at} is closed." in obs
                if self.take == "planned"
                else st.at not in st.visited
            )
            if st.at and closed and f"open {st.at}" in req.admissible:
                return (
                    self._scratchpad(st, plan)
                    if pad
                    else f"The {st.at} is closed. I open it. {left}"
                ), f"open {st.at}"
            kinds = " and ".join(
                dict.fromkeys(_kind(n) for n in _plan_needs(plan) if n not in st.seen)
            )
            nxt = todo[0] if self.explore == "listed" else st.rng.choice(todo)
            return (
                self._scratchpad(st, plan)
                if pad
                else f"I need to find the {kinds}. {left} I will check {nxt}."
            ), f"go to {nxt}"
        return (self._scratchpad(st, plan) if pad else plan_thought(plan)), plan[0]

    def _choose(self, st: _TrajState, req: ActRequest, obs: str) -> tuple[str, str, bool]:
        thought, action = self._expert_action(st, req, obs)
        return thought, action, False

    def _respond(self, req: ActRequest) -> str:
        st = self._begin(req)
        obs = _observation(req)
        self._observe(st, obs)
        thought, action, noise = self._choose(st, req, obs)
        if obs == NOTHING_HAPPENS and not noise and self.thoughts == "react":
            thought = "That did not work. " + thought
        st.last_action = action if action in req.admissible else ""
        st.last_noise = noise
        return format_response(thought, action)


class NoisyExpertPolicy(ExpertPolicy):
    """ExpertPolicy that plays a noise action with probability ``eps``; a fraction
    ``invalid_frac`` of noise actions are invalid (answered "Nothing happens.")."""

    def __init__(
        self,
        eps: float = 0.3,
        invalid_frac: float = 0.3,
        *,
        seed: int = 0,
        noise: float | None = None,
        explore: str = "random",
        take: str = "planned",
        thoughts: str = "react",
    ) -> None:
        """eps: noise rate ε (``noise`` is an alias); invalid_frac: share of noise actions that
        are invalid; seed: mixed into every trajectory's seed; explore / take / thoughts: as
        ExpertPolicy. A noise turn keeps the expert's own thought (scratchpad) or says
        "Maybe I should ..." (react)."""
        super().__init__(seed=seed, explore=explore, take=take, thoughts=thoughts)
        eps = noise if noise is not None else eps
        if not 0.0 <= eps <= 1.0 or not 0.0 <= invalid_frac <= 1.0:
            raise SrolloutError(
                f"eps and invalid_frac must be in [0, 1], got {eps}, {invalid_frac}"
            )
        self.eps = eps
        self.invalid_frac = invalid_frac
        self.name = f"noisy-expert(eps={eps:g})"

    def _invalid_candidates(self, st: _TrajState, req: ActRequest) -> list[tuple[str, str]]:
        """(thought, action) pairs that the engine will reject in this state."""
        if self.take == "greedy":
            return [(f"I {a}.", a) for a in self._model_like_mistakes(st, req)]
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

    def _model_like_mistakes(self, st: _TrajState, req: ActRequest) -> list[str]:
        """The invalid actions a small policy makes most (measured on the v5 default policy's
        rollouts): "go to" where it stands, taking an object of the kind the task needs from
        where it stands though none is there, "go to" a receptacle the room does not have, and
        taking a seen object from the wrong receptacle. One of each kind that applies, so each
        kind is drawn about equally often."""
        plan = req.expert_plan
        recs = sorted({a[6:] for a in req.admissible if a.startswith("go to ")} | {st.at} - {""})
        out = []
        if st.at:
            out.append(f"go to {st.at}")
            kinds = [_kind(n) for n in _plan_needs(plan)] or [
                _kind(n) for n in sorted(st.seen - set(recs))
            ]
            if kinds:
                out.append(f"take {st.rng.choice(kinds)} {st.rng.randint(1, 3)} from {st.at}")
        if recs:
            kind = _kind(st.rng.choice(recs))
            n = 1 + max(int(r.rsplit(" ", 1)[1]) for r in recs if _kind(r) == kind)
            out.append(f"go to {kind} {n}")
        objs = sorted(st.seen - set(recs))
        if objs and recs:
            out.append(f"take {st.rng.choice(objs)} from {st.rng.choice(recs)}")
        return [a for a in out if a not in req.admissible]

    def _choose(self, st: _TrajState, req: ActRequest, obs: str) -> tuple[str, str, bool]:
        if st.rng.random() < self.eps:
            pad = self.thoughts == "scratchpad"
            if st.rng.random() < self.invalid_frac:
                cands = self._invalid_candidates(st, req)
                if cands:
                    t, a = st.rng.choice(cands)
                    return (self._scratchpad(st, req.expert_plan) if pad else t), a, True
            pool = [a for a in req.admissible if a not in ("help", "look", "inventory")]
            if pool:
                a = st.rng.choice(pool)
                return (
                    (self._scratchpad(st, req.expert_plan) if pad else f"Maybe I should {a}."),
                    a,
                    True,
                )
        return super()._choose(st, req, obs)
