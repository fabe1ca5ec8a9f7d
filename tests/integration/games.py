"""Games for the environment-protocol tests, written the way libraries we do not control write
them: a game that can be lost, pays a shaped reward on a loss, seeds Python's and NumPy's global
generators in ``reset`` and draws from them as it plays (as GEM's and TextArena's games do), and
the same game with faults a task can switch on. ``srollout collect --env games:MINEFIELD`` from
this directory.

Minefield: cross four cells; each ``step`` forward draws from the global generator and hits a
mine with probability 1/4 (lost: ``done=True, won=False``, reward 0.25 per cell crossed); the
fourth cell crossed wins (reward 1). ``wait`` does nothing. The expert always steps.
"""

from __future__ import annotations

import os
import random

import numpy as np

from srollout.envs.base import StepResult, Task
from srollout.envs.registry import EnvSpec

CELLS = 4
MINE = 0.25
ACTIONS = ("step", "wait")


def outcome(seed: int, actions: list[str]) -> tuple[list[float], list[bool], bool | None]:
    """The raw game replayed, alone in the process: the rewards, the done flags and how it
    ended (won, or None while not over) of ``actions`` from ``reset(seed)``."""
    game = Minefield()
    game.reset(TASKS["eval"][0], seed)
    rewards, dones, won = [], [], None
    for a in actions:
        r = game.step(a)
        rewards.append(r.reward)
        dones.append(r.done)
        won = r.won if r.done else None
    return rewards, dones, won


class Minefield:
    def __init__(self) -> None:
        self.task: Task | None = None
        self.cell = 0

    def reset(self, task: Task, seed: int) -> tuple[str, StepResult]:
        random.seed(seed)  # as TextArena and GEM do
        np.random.seed(seed)
        self.task, self.cell = task, 0
        text = "You stand at the edge of a minefield. Cross it: step, or wait."
        return text, StepResult(text, 0.0, False, True, ACTIONS, ("step",))

    def step(self, action: str) -> StepResult:
        fault = (self.task.meta or {}).get("fault") if self.task is not None else None
        if fault and os.environ.get("GAMES_FAULTS") == "1" and self.cell >= 1:
            if fault == "raise":
                raise RuntimeError("the game server went away")
            if fault == "nan":
                return StepResult("?", float("nan"), False, True, ACTIONS, ("step",))
            if fault == "won-not-done":
                return StepResult("?", 0.0, False, True, ACTIONS, ("step",), won=True)
            if fault == "gym":
                return ("?", 0.0, False, False, {})  # type: ignore[return-value]
        if action != "step":
            return StepResult("You wait.", 0.0, False, action in ACTIONS, ACTIONS, ("step",))
        if random.random() < MINE:
            return StepResult("A mine! You lost.", 0.25 * self.cell, True, True, (), (), won=False)
        self.cell += 1
        if self.cell == CELLS:
            return StepResult("You crossed it. You won.", 1.0, True, True, (), (), won=True)
        return StepResult(
            f"Cell {self.cell} of {CELLS}: safe.", 0.0, False, True, ACTIONS, ("step",)
        )

    def close(self) -> None:
        self.task = None


def _tasks(n: int, split: str, faults: dict[int, str] | None = None) -> list[Task]:
    faults = faults or {}
    return [
        Task(
            f"{split}/{i:03d}",
            "minefield",
            "cross the minefield",
            "",
            meta={"fault": faults.get(i)},
        )
        for i in range(n)
    ]


TASKS = {"eval": _tasks(8, "eval"), "train": _tasks(8, "train")}
MINEFIELD = EnvSpec(name="minefield", make_env=Minefield, tasks=TASKS)
# the fourth task (group g00003) faults from its second step on when GAMES_FAULTS=1
FAULTS = {
    kind: EnvSpec(
        name=f"minefield-{kind}", make_env=Minefield, tasks={"eval": _tasks(8, "eval", {3: kind})}
    )
    for kind in ("raise", "nan", "won-not-done", "gym")
}
RAISES, NAN_REWARD, WON_NOT_DONE, GYM_STEP = (
    FAULTS[k] for k in ("raise", "nan", "won-not-done", "gym")
)
# mistakes made before the first step


class GymStyle(Minefield):
    """Names no admissible action and steps the gym way: a 5-tuple."""

    def reset(self, task: Task, seed: int) -> tuple[str, StepResult]:
        text, _ = super().reset(task, seed)
        return text, StepResult(text, 0.0, False, True, ())

    def step(self, action: str):  # type: ignore[override]
        return (text := "You wait.", 0.0, False, False, {"text": text})


GYM_ALWAYS = EnvSpec(name="gym-style", make_env=GymStyle, tasks=TASKS)
AS_LIST = EnvSpec(name="as-list", make_env=Minefield, tasks=TASKS["eval"])  # type: ignore[arg-type]


def _no_such_split(split: str) -> list[Task]:
    return {"eval": TASKS["eval"]}[split]  # a KeyError for any other split


TASK_FN_RAISES = EnvSpec(name="task-fn", make_env=Minefield, tasks=_no_such_split)
_made = []


def _second_make_fails() -> Minefield:
    _made.append(1)
    if len(_made) > 1 and os.environ.get("GAMES_FAULTS") == "1":
        raise OSError("out of game licences")
    return Minefield()


LATER_MAKE_FAILS = EnvSpec(name="later-make", make_env=_second_make_fails, tasks=TASKS)
