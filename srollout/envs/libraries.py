"""Two environment libraries out of the box: GEM (``pip install 'srollout[gem]'``) and TextArena
(``pip install 'srollout[textarena]'``), their single-player games named on the command line::

    srollout collect --env gem:game:GuessTheNumber-v0-easy
    srollout collect --env textarena:FrozenLake-v0

Both are entry points of the group ``srollout.envs``. What each adapter settles for every game
of its library (where an episode ends and is won, one puzzle seed per group, observations that
hold only the new text, the game's own action syntax, the games refused):
docs/environments.md. The trajectory's own ``seed`` is not passed on: the game draws from the
trajectory's global generators (docs/environments.md, "Seeds")."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from srollout.envs.base import StepResult, Task
from srollout.envs.registry import EnvSpec
from srollout.errors import NotAvailableError, SrolloutError, one_line

SPLIT_BASE = {"train": 0, "eval": 1_000_000, "heldout": 2_000_000}  # puzzle seeds per split
TASKS_PER_SPLIT = 1000
SYSTEM_PROMPT = (
    "You are playing a game. Read the rules and the game's answers, think, then give your move "
    "in exactly the form the rules ask for."
)
# How every GEM game says it was won (its rewards do not: Minesweeper's last reveal pays the share
# of cells it opened); read from gem-llm 0.1.0's twelve games
WON_GEM = "Congratulations!"
_THOUGHT = re.compile(r"Thought:\s*(.*?)(?:\n\s*Action:|$)", re.IGNORECASE | re.DOTALL)


def syntax_parser(pattern: str) -> Callable[[str], Any]:
    """A parser that keeps a game's own action syntax: the whole response is sent to the game;
    the signals compare the last match of ``pattern`` in it, lower-cased and with its spaces
    collapsed (the stripped last line when nothing matches)."""
    found = re.compile(pattern)

    def parse(text: str) -> tuple[str, str, str]:
        m = _THOUGHT.search(text)
        thought = " ".join(m.group(1).split()) if m else ""
        matches = found.findall(text)
        lines = [line for line in text.splitlines() if line.strip()]
        key = matches[-1] if matches else (lines[-1] if lines else "")
        return thought, text, " ".join(key.lower().split())  # (thought, sent, compared)

    return parse


def puzzle_tasks(library: str, game_id: str) -> Callable[[str], list[Task]]:
    """Task sets of a seeded game: ``train``, ``eval`` and ``heldout``, each
    :data:`TASKS_PER_SPLIT` puzzle seeds of their own."""

    def tasks(split: str) -> list[Task]:
        if split not in SPLIT_BASE:
            raise SrolloutError(
                f"{library}:{game_id} has the task sets {', '.join(SPLIT_BASE)}, not {split!r}"
            )
        base = SPLIT_BASE[split]
        return [
            Task(f"{split}/{i:05d}", game_id, "", library, meta={"seed": base + i})
            for i in range(TASKS_PER_SPLIT)
        ]

    return tasks


@contextmanager
def _silenced() -> Iterator[None]:
    """The process's stdout and stderr to /dev/null for the block, at the file descriptors:
    nltk's downloader prints to the stderr it saw when it was imported."""
    import os
    import sys

    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    saved = [os.dup(1), os.dup(2)]
    null = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(null, 1)
        os.dup2(null, 2)
        yield
    finally:
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for fd in (*saved, null):
            os.close(fd)


def _quietly(library: str, game_id: str, make: Callable[[], Any]) -> Any:
    """``make()`` with the library's own printing to stdout / stderr kept off the console (nltk
    prints its failed downloads); an attempt to download data is one SrolloutError."""
    try:
        with _silenced():
            return make()
    except Exception as e:
        if _downloads(e):
            raise SrolloutError(
                f"{library}:{game_id} needs data it downloads at run time ({type(e).__name__}: "
                f"{one_line(e, 120)}); srollout plays only games that run offline"
            ) from e
        raise


def _downloads(err: BaseException) -> bool:
    """The game wanted data from the network (nltk's LookupError, a failed URL or socket)."""
    import urllib.error

    return isinstance(err, (LookupError, urllib.error.URLError, ConnectionError, TimeoutError))


def _spec(library: str, game_id: str, game: Any, action: str, description: str) -> EnvSpec:
    """The EnvSpec of a library's game: its puzzle seeds, the game's class, its action syntax."""
    return EnvSpec(
        name=f"{library}:{game_id}",
        make_env=lambda: game(game_id),
        tasks=puzzle_tasks(library, game_id),
        system_prompt=SYSTEM_PROMPT,
        parse=syntax_parser(action),
        description=description,
    )


# --- GEM --------------------------------------------------------------------------------------


class GemGame:
    """One GEM game as a :class:`~srollout.envs.base.TextEnv`."""

    def __init__(self, game_id: str) -> None:
        import gem

        self.game_id = game_id
        self.env = _quietly("gem", game_id, lambda: gem.make(game_id))

    def reset(self, task: Task, seed: int) -> tuple[str, StepResult]:
        puzzle = int(task.meta["seed"])
        obs, info = _quietly("gem", self.game_id, lambda: self.env.reset(seed=puzzle))
        return obs, StepResult(obs, 0.0, False, True, ())

    def step(self, action: str) -> StepResult:
        obs, reward, terminated, truncated, info = self.env.step(action)
        over = bool(terminated or truncated)
        won = over and WON_GEM in str(obs)
        suffix = (info or {}).get("suffix", "") if not over else ""
        text = f"{obs}\n{suffix}" if suffix else str(obs)
        return StepResult(text, float(reward), over, True, (), (), won=won if over else None)

    def close(self) -> None:
        pass


def gem_env(game_id: str) -> EnvSpec:
    """``--env gem:<game id>``: one of GEM's single-player games (ids ``game:...``)."""
    try:
        from gem.envs.registration import ENV_REGISTRY
    except ImportError:
        raise NotAvailableError(
            "--env gem:...: GEM is not installed; pip install 'srollout[gem]'"
        ) from None
    games = sorted(k for k in ENV_REGISTRY if k.startswith("game:"))
    if game_id not in games:
        raise SrolloutError(
            f"--env gem:{game_id}: not one of GEM's single-player games ({', '.join(games[:6])}, "
            f"... {len(games)} in all)"
        )
    return _spec("gem", game_id, GemGame, r"\\boxed\{[^}]*\}", f"GEM {game_id}")


# --- TextArena --------------------------------------------------------------------------------


class TextArenaGame:
    """One TextArena single-player game as a :class:`~srollout.envs.base.TextEnv`: its raw
    version (no wrappers), one player."""

    def __init__(self, game_id: str) -> None:
        import textarena as ta

        self.game_id = game_id
        self.env = _quietly("textarena", game_id, lambda: ta.make(f"{game_id}-raw"))

    def _news(self) -> str:
        import textarena as ta

        _, messages = self.env.get_observation()
        own = ta.ObservationType.PLAYER_ACTION
        return "\n".join(m for _, m, kind in messages if kind != own).strip()

    def reset(self, task: Task, seed: int) -> tuple[str, StepResult]:
        puzzle = int(task.meta["seed"])
        try:
            _quietly("textarena", self.game_id, lambda: self.env.reset(num_players=1, seed=puzzle))
        except (AssertionError, ValueError) as e:  # how TextArena's games refuse one player
            if "player" not in str(e).lower():
                raise
            raise SrolloutError(
                f"textarena:{self.game_id} is not a single-player game ({one_line(e)})"
            ) from e
        obs = self._news()
        return obs, StepResult(obs, 0.0, False, True, ())

    def step(self, action: str) -> StepResult:
        done, _ = self.env.step(action)
        text = self._news()
        if not done:
            return StepResult(text, 0.0, False, True, ())
        rewards, info = self.env.close()
        reward = float((rewards or {}).get(0, 0.0))
        reason = (info or {}).get(0, {}).get("reason")
        text = "\n".join(t for t in (text, f"Game over: {reason}" if reason else "") if t)
        return StepResult(text, reward, True, True, (), (), won=reward >= 1.0)

    def close(self) -> None:
        pass


def textarena_env(game_id: str) -> EnvSpec:
    """``--env textarena:<game id>``: one of TextArena's single-player games (an id it
    registers with a ``-raw`` version, e.g. ``GuessTheNumber-v0``, ``FrozenLake-v0``)."""
    try:
        from textarena.envs.registration import ENV_REGISTRY
    except ImportError:
        raise NotAvailableError(
            "--env textarena:...: TextArena is not installed; pip install 'srollout[textarena]'"
        ) from None
    if f"{game_id}-raw" not in ENV_REGISTRY:
        known = sorted(k[: -len("-raw")] for k in ENV_REGISTRY if k.endswith("-raw"))
        raise SrolloutError(
            f"--env textarena:{game_id}: TextArena has no such game ({', '.join(known[:6])}, "
            f"... {len(known)} in all)"
        )
    return _spec("textarena", game_id, TextArenaGame, r"\[[^\]]*\]", f"TextArena {game_id}")


__all__ = ("GemGame", "TextArenaGame", "gem_env", "puzzle_tasks", "syntax_parser", "textarena_env")
