"""The engine's calls into environments: each trajectory's own random generators, one error naming
where a call failed, and the checks on what a call returned.

Randomness: around every ``reset`` and ``step`` the trajectory's own state of Python's and
NumPy's global generators is swapped in, and the process's back after (why, and ``global_rng =
False``: docs/environments.md, "Seeds").
"""

from __future__ import annotations

import math
import numbers
import random
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np

from srollout.envs.base import StepResult, TextEnv
from srollout.envs.registry import call_env, check_step_result
from srollout.errors import EnvError

Text = str | Callable[[], str]  # a message part, or what makes it when an error needs it


def env_random(env: Any, seed: int) -> EnvRandom | _Shared:
    """The generators a trajectory's calls of ``env`` run with: its own (:class:`EnvRandom`),
    unless the environment declares ``global_rng = False`` (it never reads or moves them, as
    ALFWorld's engine; swapping the states costs ~0.2 ms a call)."""
    return EnvRandom(seed) if getattr(env, "global_rng", True) else SHARED


class _Shared:
    """The process's own generators, untouched: for an environment that does not use them."""

    @contextmanager
    def active(self) -> Iterator[None]:
        yield


SHARED = _Shared()


class EnvRandom:
    """One trajectory's states of ``random`` and ``numpy.random``'s global generators."""

    __slots__ = ("_np", "_py")

    def __init__(self, seed: int) -> None:
        saved = random.getstate(), np.random.get_state()
        random.seed(seed)
        np.random.seed(seed % 2**32)
        self._py: Any = random.getstate()
        self._np: Any = np.random.get_state()
        random.setstate(saved[0])
        np.random.set_state(saved[1])

    @contextmanager
    def active(self) -> Iterator[None]:
        """Run the block on this trajectory's generators; keep what it drew, restore the rest."""
        saved = random.getstate(), np.random.get_state()
        random.setstate(self._py)
        np.random.set_state(self._np)
        try:
            yield
        finally:
            self._py, self._np = random.getstate(), np.random.get_state()
            random.setstate(saved[0])
            np.random.set_state(saved[1])


def env_name(env: Any) -> str:
    """How an error names the environment: its class."""
    return f"environment {type(env).__name__}"


def env_call(fn: Callable[..., Any], name: str, what: Text, where: Text, *args: Any) -> Any:
    """``fn(*args)``; anything it raises but a SrolloutError becomes one :class:`EnvError`
    (:func:`srollout.envs.registry.call_env`; ``what`` / ``where`` may be zero-argument
    callables, made only then)."""
    return call_env(fn, name, what, *args, error=EnvError, at=where)


def _text(x: Text) -> str:
    return x() if callable(x) else x


def reset_result(out: Any, name: str, where: Text) -> tuple[str, StepResult]:
    """``reset``'s answer, checked: (observation str, a StepResult-like info)."""
    if not (isinstance(out, tuple) and len(out) == 2 and isinstance(out[0], str)):
        raise EnvError(
            f"{name}: reset(task, seed) must return (observation: str, StepResult), got "
            f"{type(out).__name__} ({_text(where)})"
        )
    if not isinstance(out[1], StepResult):
        check_step_result(out[1], name, f"reset ({_text(where)})", EnvError)
    return out


def outcome(result: StepResult, name: str, where: Text) -> bool:
    """Whether a step that ends the episode won it (``won``, or True when the environment says
    only ``done``). What the protocol does not allow is one :class:`EnvError` naming the
    environment, group, trajectory and step: not a StepResult, a reward that is not a finite
    number, ``won`` without ``done``."""
    if not isinstance(result, StepResult):  # (a StepResult needs no check: the hot path)
        check_step_result(result, name, f"step ({_text(where)})", EnvError)
    reward = result.reward
    if (
        isinstance(reward, bool)
        or not isinstance(reward, numbers.Real)
        or not math.isfinite(reward)
    ):
        raise EnvError(
            f"{name} gave the reward {reward!r} at {_text(where)}: it must be a finite number"
        )
    won = getattr(result, "won", None)
    if won is not None and not result.done:
        raise EnvError(
            f"{name} said won={won!r} without done=True at {_text(where)}: won says how an "
            "episode that is over ended"
        )
    return True if won is None else bool(won)


def env_step(env: TextEnv, action: str) -> StepResult:
    """Step ``env``; kept apart so a profiler shows environment time on its own line."""
    return env.step(action)


__all__ = ("EnvRandom", "env_random", "env_call", "env_name", "env_step", "outcome", "reset_result")
