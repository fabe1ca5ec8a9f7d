"""Your own multi-turn text environment in srollout: what it provides (:class:`EnvSpec`), how it is
named (a registry, Python entry points, ``package.module:attr``) and the check that it speaks the
:class:`~srollout.envs.base.TextEnv` protocol before anything is written.

    register_env(EnvSpec(name="key-room", make_env=KeyRoom, tasks={"train": TRAIN, "eval": EVAL}))

    srollout collect --env key-room ...             # after the module is imported, or
    srollout collect --env mypkg.game:KEY_ROOM ...  # module:attr, or an entry point of the
                                                    # group "srollout.envs" in your pyproject

``alfworld`` (the default) is an EnvSpec too (:func:`alfworld_spec`). The whole guide, with each
field of EnvSpec: docs/environments.md."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from srollout.envs.base import StepResult, Task
from srollout.errors import SrolloutError, entry_point, one_line

ALFWORLD = "alfworld"
ENTRY_POINT_GROUP = "srollout.envs"
# libraries of games: ``--env <name>:<game id>`` calls the entry point with the game id
LIBRARY_GROUP = "srollout.env_libraries"
# What a StepResult must carry for the engine (reward, done and valid go into the tables).
_RESULT_FIELDS = ("observation", "reward", "done", "valid", "admissible")
# What the pre-run check sends when reset names no admissible action (any text is an action).
PROBE_ACTION = "look"


@dataclass(frozen=True)
class EnvSpec:
    """What srollout needs to roll groups out in an environment (each field: docs/environments.md).

    make_env: ``() -> TextEnv``; one object plays many episodes (``reset`` per trajectory), so make
    it cheap. tasks: ``{split: [Task, ...]}`` or ``split -> [Task, ...]``; ids unique in a split.
    parse: ``response text -> (thought, action, normalized)``; ``normalized`` is what d_K compares.
    None for a prompt or parser field: the model's own, else the ReAct protocol
    (:class:`srollout.rollout.react.EnvPrompter`)."""

    name: str
    make_env: Callable[[], Any]
    tasks: Mapping[str, Sequence[Task]] | Callable[[str], Sequence[Task]]
    system_prompt: str | Callable[[Task], str] | None = None
    user_template: str | None = None
    parse: Callable[[str], Any] | None = None
    description: str = ""
    won_at: float | None = None
    fallback_system_prompt: str | None = None
    expert_env: Callable[[], Any] | None = None
    task_options: tuple[str, ...] = ()
    auto_workers: bool = False

    def env_factory(self, expert: bool = False) -> Callable[[], Any]:
        """What the engine makes its environments with: ``make_env`` (``expert``: for a planner
        policy, ``expert_env`` where given), with ``won_at`` each environment wrapped to say
        ``won`` by its summed reward."""
        make = self.expert_env if expert and self.expert_env is not None else self.make_env
        if self.won_at is None:
            return make
        won_at = float(self.won_at)
        return lambda: WonByReward(make(), won_at)

    def task_set(self, split: str, n: int | None = None, **options: Any) -> list[Task]:
        """The first ``n`` (all: None) tasks of ``split``; ``options`` (``difficulty``, ...) go
        to a task function that declares them in :attr:`task_options`. An unknown or empty split
        is a SrolloutError."""
        if callable(self.tasks):
            kwargs = {k: v for k, v in options.items() if k in self.task_options}
            if "n" in self.task_options:
                kwargs["n"] = n
            try:
                tasks = self.tasks(split, **kwargs)
            except SrolloutError:
                raise
            except Exception as e:
                raise SrolloutError(
                    f"environment {self.name!r}: its task function raised {type(e).__name__}: "
                    f"{one_line(e)} for the task set {split!r}"
                ) from e
        elif not isinstance(self.tasks, Mapping):
            raise SrolloutError(
                f"environment {self.name!r}: tasks must be {{split: [Task, ...]}} or a function "
                f"split -> [Task, ...], got a {type(self.tasks).__name__} (write "
                f'tasks={{"{split}": [...]}})'
            )
        elif split in self.tasks:
            tasks = self.tasks[split]
        else:
            raise SrolloutError(
                f"environment {self.name!r} has no task set {split!r} "
                f"(it has: {', '.join(map(str, self.tasks))})"
            )
        tasks = list(tasks or ())[:n]
        if not tasks:
            raise SrolloutError(f"environment {self.name!r}: task set {split!r} is empty")
        bad = next((t for t in tasks if not isinstance(t, Task)), None)
        if bad is not None:
            raise SrolloutError(
                f"environment {self.name!r}: task set {split!r} holds a "
                f"{type(bad).__name__}, not a srollout.envs.base.Task"
            )
        ids = [t.task_id for t in tasks]
        if len(set(ids)) != len(ids):
            raise SrolloutError(f"environment {self.name!r}: task ids of {split!r} are not unique")
        return tasks


class WonByReward:
    """An environment whose episodes that end without ``won`` are won iff the summed reward
    since ``reset`` reaches ``won_at`` (:attr:`EnvSpec.won_at`)."""

    def __init__(self, env: Any, won_at: float) -> None:
        self.env, self.won_at, self.total = env, won_at, 0.0

    def reset(self, task: Task, seed: int) -> Any:
        self.total = 0.0
        return self.env.reset(task, seed)

    def step(self, action: str) -> Any:
        result = self.env.step(action)
        if not hasattr(result, "reward"):
            return result  # the engine names what is wrong
        self.total += float(result.reward)
        if not result.done or getattr(result, "won", None) is not None:
            return result
        names = ("observation", "reward", "done", "valid", "admissible", "expert_plan")
        fields = {n: getattr(result, n) for n in names if hasattr(result, n)}
        return StepResult(**fields, won=self.total >= self.won_at)

    def close(self) -> None:
        self.env.close()


_REGISTRY: dict[str, EnvSpec] = {}


def register_env(spec: EnvSpec) -> EnvSpec:
    """Make ``spec`` known as ``--env spec.name`` in this process (a name registered again is
    replaced). Returns ``spec``, so a module can write ``KEY_ROOM = register_env(EnvSpec(...))``."""
    if not isinstance(spec, EnvSpec):
        raise SrolloutError(f"register_env takes an EnvSpec, got {type(spec).__name__}")
    if spec.name == ALFWORLD:
        raise SrolloutError(f"{ALFWORLD!r} is srollout's built-in environment; choose another name")
    _REGISTRY[spec.name] = spec
    return spec


def env_names() -> list[str]:
    """Every name ``--env`` accepts as a name: alfworld, registered ones, entry points; then
    the libraries of games, as ``<library>:<game id>``."""
    from importlib.metadata import entry_points

    points = [ep.name for ep in entry_points(group=ENTRY_POINT_GROUP)]
    libraries = [f"{ep.name}:<game id>" for ep in entry_points(group=LIBRARY_GROUP)]
    return sorted({ALFWORLD, *_REGISTRY, *points}) + sorted(libraries)


def resolve_env(name: str) -> EnvSpec:
    """The EnvSpec ``--env name`` means: a registered name, an entry point of group
    ``srollout.envs``, or ``package.module:attr`` (imported with the working directory on
    ``sys.path``, as ``uvicorn`` does), where attr is an EnvSpec or a function returning one.
    ``alfworld`` is the built-in spec. Anything else is one SrolloutError."""
    if name == ALFWORLD:
        return alfworld_spec()
    if name in _REGISTRY:
        return _REGISTRY[name]
    from importlib.metadata import entry_points

    found = entry_point(ENTRY_POINT_GROUP, name, f"--env {name}")
    if found is not None:
        return _as_spec(found[0], f"--env {name} (entry point {found[1]})")
    prefix, _, game = name.partition(":")
    family = next((ep for ep in entry_points(group=LIBRARY_GROUP) if ep.name == prefix), None)
    if game and family is not None:  # <library>:<game id>: the library's function of the id
        return _family_spec(family, game, name)
    if ":" in name:
        return _as_spec(_import_attr(name), f"--env {name}")
    raise SrolloutError(
        f"--env {name!r}: no such environment (known: {', '.join(env_names())}; or give "
        "package.module:attr)"
    )


def _family_spec(point: Any, game: str, name: str) -> EnvSpec:
    """``--env <library>:<game id>``: the entry point ``library`` called with the game id."""
    try:
        make = point.load()
        target = make(game)
    except SrolloutError:
        raise
    except Exception as e:
        raise SrolloutError(
            f"--env {name}: entry point {point.value!r} failed ({type(e).__name__}: {one_line(e)})"
        ) from e
    return _as_spec(target, f"--env {name} (entry point {point.value})")


def _import_attr(ref: str) -> Any:
    module_name, _, attr = ref.partition(":")
    if not module_name or not attr:
        raise SrolloutError(f"--env {ref!r}: write package.module:attr")
    if "" not in sys.path and "." not in sys.path:
        sys.path.insert(0, "")  # the working directory, as `python -m` has it
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise SrolloutError(f"--env {ref}: cannot import {module_name!r} ({one_line(e)})") from e
    except Exception as e:  # a syntax error, or anything the module raises as it is imported
        at = f" ({Path(e.filename).name}, line {e.lineno})" if isinstance(e, SyntaxError) else ""
        raise SrolloutError(
            f"--env {ref}: importing {module_name!r} raised {type(e).__name__}{at}: "
            f"{getattr(e, 'msg', None) or one_line(e)}"
        ) from e
    try:
        return getattr(module, attr)
    except AttributeError:
        raise SrolloutError(f"--env {ref}: module {module_name!r} has no {attr!r}") from None


def _as_spec(target: Any, where: str) -> EnvSpec:
    if not isinstance(target, EnvSpec) and callable(target):
        target = target()
    if not isinstance(target, EnvSpec):
        raise SrolloutError(
            f"{where}: not an EnvSpec (nor a function returning one), got {type(target).__name__}"
        )
    return target


def check_env(spec: EnvSpec, tasks: Sequence[Task]) -> None:
    """Play the protocol once, before a run writes anything: make, ``reset(tasks[0], 0)``, ``step``
    its first admissible action (or :data:`PROBE_ACTION`), ``close``; a failure is one
    SrolloutError naming what is wrong."""
    where = f"environment {spec.name!r}"
    env = call_env(spec.env_factory(), where, "make_env()")
    missing = [m for m in ("reset", "step", "close") if not callable(getattr(env, m, None))]
    if missing:
        raise SrolloutError(
            f"{where}: {type(env).__name__} does not implement the TextEnv protocol "
            f"(no {', '.join(missing)}; see srollout.envs.base.TextEnv)"
        )
    try:
        out = call_env(env.reset, where, "reset(task, seed)", tasks[0], 0)
        if not (isinstance(out, tuple) and len(out) == 2 and isinstance(out[0], str)):
            raise SrolloutError(
                f"{where}: reset(task, seed) must return (observation: str, StepResult), got "
                f"{_shape(out)}"
            )
        check_step_result(out[1], where, "reset")
        # the first admissible action, or any text when the game names none
        action = next(iter(tuple(out[1].admissible)), PROBE_ACTION)
        what = f"step({action!r})"
        check_step_result(call_env(env.step, where, what, action), where, what)
    finally:
        env.close()


def check_step_result(
    result: Any, where: str, what: str, error: type[SrolloutError] = SrolloutError
) -> None:
    """``result`` has what the engine reads from a StepResult (a StepResult, or an object with the
    same fields); else one ``error``."""
    if isinstance(result, StepResult):
        return
    missing = [f for f in _RESULT_FIELDS if not hasattr(result, f)]
    if missing:
        raise error(
            f"{where}: {what} must give a srollout.envs.base.StepResult, got {_shape(result)} "
            f"(no {', '.join(missing)})"
        )


def call_env(
    fn: Callable[..., Any],
    where: str | Callable[[], str],
    what: str | Callable[[], str],
    *args: Any,
    error: type[SrolloutError] = SrolloutError,
    at: str | Callable[[], str] = "",
) -> Any:
    """``fn(*args)``; anything it raises but a SrolloutError becomes one ``error`` line:
    ``<where>: <what> raised <type>: <its first line>[ (<at>)]``. The texts may be zero-argument
    callables, made only when something is raised (the rollout engine calls this every step)."""
    try:
        return fn(*args)
    except SrolloutError:
        raise
    except Exception as e:
        text = [x() if callable(x) else x for x in (where, what, at)]
        tail = f" ({text[2]})" if text[2] else ""
        raise error(f"{text[0]}: {text[1]} raised {type(e).__name__}: {one_line(e)}{tail}") from e


def _shape(value: Any) -> str:
    if isinstance(value, tuple):
        return f"a tuple of {len(value)} ({', '.join(type(v).__name__ for v in value)})"
    return type(value).__name__


__all__ = (
    "ALFWORLD",
    "ENTRY_POINT_GROUP",
    "LIBRARY_GROUP",
    "EnvSpec",
    "WonByReward",
    "alfworld_spec",
    "check_env",
    "check_step_result",
    "env_names",
    "register_env",
    "resolve_env",
)


# --- ALFWorld, built in ---------------------------------------------------------------------------


def _alfworld_tasks(split: str, difficulty: str = "small", n: int | None = None) -> list[Task]:
    from srollout.envs.tasks import load_task_set

    return list(load_task_set(split, difficulty, n=n))


def _alfworld_env(expert_plan: bool) -> Any:
    from srollout.envs.alfworld_env import AlfworldEnv

    return AlfworldEnv(expert_plan=expert_plan)


def alfworld_spec() -> EnvSpec:
    """ALFWorld as an EnvSpec, the one path every environment takes: the real engine (the planner's
    plan computed only for the planner policies), srollout's generated task sets (only the first n
    games of a split are generated), the model's own prompt else ALFWorld's ReAct prompt, and
    ALFWorld's parser (verb normalisation)."""
    from srollout.envs.prompts import parse_turn, system_prompt

    return EnvSpec(
        name=ALFWORLD,
        make_env=lambda: _alfworld_env(False),
        tasks=_alfworld_tasks,
        parse=parse_turn,
        description="ALFWorld on its real engine, srollout's generated task sets (the default)",
        fallback_system_prompt=system_prompt(),
        expert_env=lambda: _alfworld_env(True),
        task_options=("difficulty", "n"),
        auto_workers=True,
    )
