"""ALFWorld on the real engine: textworld's ``PddlEnv`` + fast-downward, wrapped by ALFWorld's
``AlfredDemangler`` and ``AlfredInfos`` (``alfworld.agents.environment.alfred_tw_env``).

A game's parse is shared per process by every environment that plays it, each environment owns
a pooled copy of ``libdownward.so`` (fast-downward keeps global state per library), and a cached
grammar makes steps ~40x faster; the costs, the pitfalls handled here and the test that the
dialogue equals the stock ``PddlEnv``'s: docs/environments.md ("Groups", "Speed")."""

from __future__ import annotations

import contextlib
import copy
import functools
import hashlib
import json
import re
import sys
import types
from collections import Counter, OrderedDict, defaultdict
from dataclasses import dataclass
from typing import Any

from srollout.envs.base import NOTHING_HAPPENS, StepResult, Task
from srollout.errors import SrolloutError

_WELCOME = "-= Welcome to TextWorld, ALFRED! =-"


@contextlib.contextmanager
def _keep_argv():
    """fast-downward's translator sets ``sys.argv``; give the caller's back."""
    saved = list(sys.argv)
    try:
        yield
    finally:
        sys.argv[:] = saved


@functools.lru_cache(maxsize=1)
def _engine() -> Any:
    """Import the engine once (heavy: ~1 s). Returns a namespace of what we use."""
    from srollout.envs.gen import prepare_alfworld_import

    prepare_alfworld_import()
    try:
        with _keep_argv():
            import fast_downward
            import textworld
            from alfworld.agents.environment.alfred_tw_env import AlfredDemangler, AlfredInfos
            from textworld.envs.pddl import PddlEnv
            from textworld.envs.pddl import logic as pddl_logic
            from textworld.generator.game import EntityInfo
    except ImportError as e:
        raise SrolloutError(
            f"the ALFWorld engine cannot be imported ({e}); run `pip install alfworld==0.4.2`"
        ) from e

    return types.SimpleNamespace(
        fast_downward=fast_downward,
        textworld=textworld,
        PddlEnv=PddlEnv,
        pddl_logic=pddl_logic,
        EntityInfo=EntityInfo,
        AlfredDemangler=AlfredDemangler,
        AlfredInfos=AlfredInfos,
    )


# --- what is shared between environments ------------------------------------------------------


@dataclass(frozen=True)
class _Translation:
    """The PDDL->SAS translation of one game (pure function of domain + problem text)."""

    task: Any  # fast_downward.translate.pddl.Task
    sas: bytes
    sas_replan: bytes
    name2type: dict[str, str]
    init_facts: tuple[Any, ...]  # textworld Propositions of the static init


@dataclass(frozen=True)
class SharedGame:
    """Everything about a game that its environments can share: the game dict, the parsed
    GameLogic, the SAS translation. key: hash of the game text."""

    key: str
    game: dict
    logic: Any
    translation: _Translation


_LOGIC_CACHE: OrderedDict[str, Any] = OrderedDict()
_GAME_CACHE: OrderedDict[str, SharedGame] = OrderedDict()
_LOGIC_CACHE_SIZE = 64  # GameLogic per distinct grammar (one per domain, see _logic_for)
_GAME_CACHE_SIZE = 128


# The grammar's goal rule; games differ from the wheel's grammar only there.
_TASK_RULE = re.compile(
    r'("task":\s*\[\s*\{\s*"rhs":\s*")(Your task is to: .*?)("\s*\}\s*\])', re.S
)


def _cached(cache: OrderedDict[str, Any], size: int, texts: tuple[str, ...], make: Any) -> Any:
    """``make()``, kept in the LRU ``cache`` of ``size`` entries under the hash of ``texts``."""
    key = hashlib.sha1("\0".join(texts).encode()).hexdigest()
    if key in cache:
        cache.move_to_end(key)
        return cache[key]
    value = cache[key] = make(key)
    if len(cache) > size:
        cache.popitem(last=False)
    return value


def _parse_logic(domain: str, grammar: str) -> Any:
    def make(_key: str) -> Any:
        logic = _engine().pddl_logic.GameLogic(domain=domain, grammar=grammar)
        # our own GameLogic objects only: their grammar memoises parses (see below)
        logic.grammar.__class__ = _cached_grammar_class()
        return logic

    return _cached(_LOGIC_CACHE, _LOGIC_CACHE_SIZE, (domain, grammar), make)


def _logic_for(domain: str, grammar: str) -> Any:
    """The GameLogic of (domain, grammar). Grammars that differ only in the goal sentence share
    one parse (~0.15 s): a shallow copy gets its own ``task`` rule, parsed from the same text
    ``ContextSensitiveGrammar.parse`` would have parsed."""
    m = _TASK_RULE.search(grammar)
    if m is None:
        return _parse_logic(domain, grammar)
    base = _parse_logic(
        domain, grammar[: m.start(2)] + "Your task is to: UNKNOWN GOAL." + grammar[m.end(2) :]
    )
    from textworld.envs.pddl import textgen

    rhs = json.loads('"' + m.group(2) + '"')
    logic = copy.copy(base)
    logic.grammar = copy.copy(base.grammar)
    logic.grammar._rules = defaultdict(list, base.grammar._rules)
    logic.grammar._rules["task"] = [
        textgen.ProductionRule(lhs="task", rhs=textgen._parse_and_convert(rhs, rule_name="symbols"))
    ]
    return logic


@functools.lru_cache(maxsize=1)
def _cached_grammar_class() -> type:
    """textworld's ContextSensitiveGrammar with the same derivations, done cheaper: tatsu parses
    (pure functions of the string) are cached and derivation contexts copied shallowly (their
    entity infos and variables are never mutated). Order and rules are textworld 1.7.0's."""
    from copy import deepcopy

    from textworld.envs.pddl import textgen
    from textworld.logic import Rule

    parses: dict[str, list] = {}
    rules_cache: dict[str, Any] = {}

    def parse(start: str) -> list:
        if start not in parses:
            parses[start] = textgen._parse_and_convert(start, rule_name="symbols")
        return deepcopy(parses[start])

    def rule(expr: str) -> Any:
        if expr not in rules_cache:
            rules_cache[expr] = Rule.parse_conjunctive_query(expr)
        return rules_cache[expr]

    def ctx(context: dict) -> dict:
        return {
            "state": context["state"],
            "facts": context["facts"],
            "variables": dict(context["variables"]),
            "mapping": dict(context["mapping"]),
            "entity_infos": context["entity_infos"],
        }

    def query(expr: str, context: dict) -> list[dict]:
        out = []
        for mapping in context["state"].all_assignments(rule(expr), context["mapping"]):
            c = ctx(context)
            c["variables"].update(
                {ph.name: c["entity_infos"][var.name] for ph, var in mapping.items()}
            )
            c["mapping"].update(mapping)
            out.append(c)
        return out

    class CachedGrammar(textgen.ContextSensitiveGrammar):
        def replace(self, start: Any) -> list:
            rules = self._rules.get(str(start))
            if not rules:
                raise textgen.CSGUnknownSymbolError(start)
            state, mapping = start.context["state"], start.context["mapping"]
            for r in rules:
                if not r.condition or any(
                    True for _ in state.all_assignments(rule(r.condition), mapping)
                ):
                    break
            symbols = deepcopy(r.rhs)
            for symbol in symbols:
                symbol.context = ctx(start.context)
            return symbols

        def _expand(self, symbol: Any) -> list:
            if isinstance(symbol, textgen.NonterminalSymbol):
                return self.replace(symbol)
            if isinstance(symbol, textgen.ConditionalSymbol):
                contexts = (
                    query(symbol.given, symbol.context) if symbol.given else [ctx(symbol.context)]
                )
                out = []
                for c in contexts:
                    e = deepcopy(symbol.expression)
                    e.context = c
                    out.append(e)
                return out
            if isinstance(symbol, textgen.ListSymbol):
                symbol.symbol.context = symbol.context
                return textgen.display_list(self._expand(symbol.symbol), symbol.context)
            if isinstance(symbol, textgen.EvalSymbol):
                return symbol.derive()
            raise TypeError(f"unknown grammar symbol {type(symbol)}")

        def derive(self, start: str, context: dict | None = None) -> str:
            context = context or {}
            derivation = parse(start)[::-1]
            for symbol in derivation:
                symbol.context = ctx(context)
            derived = []
            while derivation:
                symbol = derivation.pop()
                if isinstance(symbol, textgen.TerminalSymbol):
                    derived.append(symbol)
                else:
                    derivation += self._expand(symbol)[::-1]
            return "".join(map(str, derived))

    return CachedGrammar


def _translate(domain: str, problem: str, logic: Any) -> _Translation:
    """What ``textworld.envs.pddl.logic.PddlState.__init__`` computes before touching the
    planner (textworld 1.7.0), done once per game instead of once per environment reset."""
    eng = _engine()
    fd = eng.fast_downward
    tw_logic = eng.textworld.logic
    with _keep_argv():
        task, sas = fd.pddl2sas(domain, problem)
        _, sas_replan = fd.pddl2sas(domain, problem, optimize=True)
    for type_ in task.types:
        with contextlib.suppress(ValueError):
            logic.types.add(tw_logic.Type(type_.name, type_.supertype_names))
    name2type = {o.name: o.type_name for o in task.objects}
    facts = []
    for atom in task.init:
        if isinstance(atom, fd.translate.pddl.conditions.Atom):
            if atom.predicate == "=":
                continue
            facts.append(
                tw_logic.Proposition(
                    atom.predicate, [tw_logic.Variable(a, name2type[a]) for a in atom.args]
                )
            )
        elif isinstance(atom, fd.translate.pddl.f_expression.Assign):
            if atom.fluent.symbol == "total-cost":
                continue
            name = f"{atom.expression.value}"
            if str.isdigit(name):
                continue
            facts.append(
                tw_logic.Proposition(
                    name, [tw_logic.Variable(a, name2type[a]) for a in atom.fluent.args]
                )
            )
    return _Translation(
        task, sas.encode("utf-8"), sas_replan.encode("utf-8"), name2type, tuple(facts)
    )


def shared_game(game: dict) -> SharedGame:
    """The shared, parsed form of a game dict (``pddl_domain``, ``grammar``, ``pddl_problem``),
    cached per process (LRU, 128 games)."""
    texts = (game["pddl_domain"], game["grammar"], game["pddl_problem"])

    def make(key: str) -> SharedGame:
        logic = _logic_for(game["pddl_domain"], game["grammar"])
        try:
            tr = _translate(game["pddl_domain"], game["pddl_problem"], logic)
        except (SystemExit, Exception) as e:  # the translator calls sys.exit on bad PDDL
            raise SrolloutError(f"the PDDL problem of this game does not translate: {e}") from e
        return SharedGame(key, game, logic, tr)

    return _cached(_GAME_CACHE, _GAME_CACHE_SIZE, texts, make)


# --- planner libraries --------------------------------------------------------------------------

_FREE_LIBS: list[Any] = []


def _acquire_lib() -> Any:
    if _FREE_LIBS:
        return _FREE_LIBS.pop()
    try:
        return _engine().fast_downward.load_lib()
    except OSError as e:
        raise SrolloutError(
            f"cannot load the planner library ({e}); point TMPDIR to a writable directory"
        ) from e


def _release_lib(lib: Any) -> None:
    _FREE_LIBS.append(lib)


def _new_state(lib: Any, sg: SharedGame) -> Any:
    """A fresh ``PddlState`` on ``lib`` from the shared translation (no PDDL parsing)."""
    eng = _engine()
    tr = sg.translation
    st = eng.pddl_logic.PddlState.__new__(eng.pddl_logic.PddlState)
    st._facts = defaultdict(set)
    st._vars_by_name = {}
    st._vars_by_type = defaultdict(set)
    st._var_counts = Counter()
    st._logic = sg.logic
    st.downward_lib = lib
    st.pddl_problem = sg.game["pddl_problem"]
    st.task, st.sas, st.sas_replan = tr.task, tr.sas, tr.sas_replan
    st._actions = {a.name: a for a in tr.task.actions}
    lib.load_sas(tr.sas)
    lib.load_sas_replan(tr.sas_replan)
    st.name2type = tr.name2type
    st.add_facts(tr.init_facts)
    size = lib.get_state_size()
    atoms = (eng.pddl_logic.Atom * size)()
    lib.get_state(atoms)
    st.add_facts([f for f in (a.get_fact(tr.name2type) for a in atoms) if not f.is_negation])
    return st


@functools.lru_cache(maxsize=1)
def _shared_pddl_env_class() -> type:
    """textworld's PddlEnv whose load/reset take the parsed game from ``shared_game``."""
    eng = _engine()

    class SharedPddlEnv(eng.PddlEnv):
        def __init__(self, infos: Any, lib: Any) -> None:
            eng.textworld.core.Environment.__init__(self, infos)
            self.downward_lib = lib
            self._shared: SharedGame | None = None

        def load(self, game: dict) -> None:
            sg = shared_game(game)
            self._shared = sg
            self._game_file = None
            self._game_data = sg.game
            self.walkthrough = sg.game.get("walkthrough")
            self._logic = sg.logic
            self._pddl_state = _new_state(self.downward_lib, sg)
            self._entity_infos = self._get_entity_infos()

        def reset(self):  # mirrors PddlEnv.reset (textworld 1.7.0) without re-translating
            self._pddl_state = _new_state(self.downward_lib, self._shared)
            self.prev_state = None
            self.state = eng.textworld.core.GameState()
            self._last_action = None
            self._moves = 0
            context = {
                "state": self._pddl_state,
                "facts": list(self._pddl_state.facts),
                "variables": {},
                "mapping": {},
                "entity_infos": self._entity_infos,
            }
            self.state.feedback = self._logic.grammar.derive("#intro#", context)
            self.state.raw = self.state.feedback
            self._gather_infos()
            return self.state

    return SharedPddlEnv


# --- the environment ------------------------------------------------------------------------------


def game_dict(task: Task) -> dict:
    """The ``game.tw-pddl`` dict of a task: from ``task.meta`` for generated games (problem +
    task text + walkthrough), else read from ``task.source`` (official games)."""
    from srollout.envs import gen

    meta = task.meta or {}
    if "pddl_problem" in meta:
        return {
            "pddl_domain": gen.domain_text(),
            "grammar": gen.grammar_for(task.task_text.rstrip(".")),
            "pddl_problem": meta["pddl_problem"],
            "solvable": True,
            "walkthrough": list(meta.get("walkthrough", ())),
        }
    try:
        with open(task.source) as f:
            data = json.load(f)
    except (OSError, ValueError) as e:
        raise SrolloutError(f"cannot read game file {task.source}: {e}") from e
    if "UNKNOWN GOAL" in data.get("grammar", ""):
        data = dict(
            data, grammar=data["grammar"].replace("UNKNOWN GOAL", task.task_text.rstrip("."))
        )
    return data


def strip_welcome(text: str) -> str:
    """Drop the engine's ``-= Welcome to TextWorld, ALFRED! =-`` banner from o_1."""
    text = text.strip()
    if text.startswith(_WELCOME):
        text = text[len(_WELCOME) :].strip()
    return text


class AlfworldEnv:
    """One ALFWorld game on the real engine (TextEnv); ``step`` normalises the action
    (``prompts.normalize_action``). expert_plan: replan after every step
    (``StepResult.expert_plan``; LLM rollouts may turn it off). The seed does not change it."""

    # reset and step never read or move Python's or NumPy's global generators (TextWorld keeps
    # its own; tests/component/test_envs_alfworld.py checks it), so the engine need not give
    # each trajectory its own state of them (srollout.rollout.env_calls, ~0.2 ms a call)
    global_rng = False

    def __init__(self, *, expert_plan: bool = True) -> None:
        self.expert_plan_enabled = expert_plan
        self.task: Task | None = None  # type: ignore[assignment]
        self._lib = None
        self._env = None
        self._admissible: tuple[str, ...] = ()
        self._plan: tuple[str, ...] = ()
        self.done = False
        self.won = False
        self.n_steps = 0

    def _ensure_env(self) -> Any:
        if self._env is None:
            eng = _engine()
            infos = eng.textworld.EnvInfos(
                won=True,
                admissible_commands=True,
                policy_commands=self.expert_plan_enabled,
                extras=["gamefile"],
            )
            self._lib = _acquire_lib()
            base = _shared_pddl_env_class()(infos, self._lib)
            self._env = eng.AlfredInfos(eng.AlfredDemangler(base))
        return self._env

    def reset(self, task: Task, seed: int = 0) -> tuple[str, StepResult]:
        """Load and reset ``task``; returns (o_1, info with admissible and expert_plan)."""
        env = self._ensure_env()
        with _keep_argv():
            env.load(game_dict(task))
            state = env.reset()
        self.task = task
        self.done = self.won = False
        self.n_steps = 0
        obs = strip_welcome(state.feedback)
        result = self._result(state, obs, reward=0.0, valid=True)
        return obs, result

    def step(self, action: str) -> StepResult:
        """Play one action (normalised first). Invalid -> "Nothing happens.", valid=False."""
        from srollout.envs.prompts import normalize_action

        if self._env is None or self.task is None:
            raise SrolloutError("AlfworldEnv.step called before reset")
        cmd = normalize_action(action)
        valid = cmd in self._admissible
        with _keep_argv():
            state, _, _ = self._env.step(cmd if valid else "__invalid__")
        self.n_steps += 1
        obs = state.feedback.strip() if valid else NOTHING_HAPPENS
        won = bool(state["won"])
        reward = 1.0 if (won and not self.won) else 0.0
        self.won = self.won or won
        self.done = self.won
        return self._result(state, obs, reward=reward, valid=valid)

    def _result(self, state: Any, obs: str, *, reward: float, valid: bool) -> StepResult:
        self._admissible = tuple(state["admissible_commands"] or ())
        self._plan = tuple(state["policy_commands"] or ()) if self.expert_plan_enabled else ()
        return StepResult(
            observation=obs,
            reward=reward,
            done=bool(state["won"]),
            valid=valid,
            admissible=self._admissible,
            expert_plan=self._plan,
        )

    @property
    def admissible(self) -> tuple[str, ...]:
        """Admissible actions in the current state."""
        return self._admissible

    @property
    def expert_plan(self) -> tuple[str, ...]:
        """The planner's plan from the current state (``()`` when expert_plan is off)."""
        return self._plan

    def close(self) -> None:
        """Give the planner library back to the pool (the env can be reset again later)."""
        if self._lib is not None:
            _release_lib(self._lib)
        self._lib = None
        self._env = None

    def __enter__(self) -> AlfworldEnv:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def make_group(
    task: Task, G: int, seed: int = 0, *, expert_plan: bool = True
) -> tuple[list[AlfworldEnv], list[tuple[str, StepResult]]]:
    """G environments reset on ``task`` (one parse, G planner states). Returns (envs, resets)."""
    envs = [AlfworldEnv(expert_plan=expert_plan) for _ in range(G)]
    resets = [env.reset(task, seed + i) for i, env in enumerate(envs)]
    return envs, resets
