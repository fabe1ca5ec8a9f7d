"""The TextEnv protocol every environment implements, and the task record it runs.

A *task* is one game (one prompt of the GRPO batch). A *group* is G trajectories of the same task;
the rollout engine creates G environments for it (sharing the loaded game where the engine
allows) and steps them in lock-step with the rest of the batch.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

TASK_TYPES: tuple[str, ...] = (
    "pick_and_place_simple",
    "look_at_obj_in_light",
    "pick_clean_then_place_in_recep",
    "pick_heat_then_place_in_recep",
    "pick_cool_then_place_in_recep",
    "pick_two_obj_and_place",
)


@dataclass(frozen=True)
class Task:
    """One game.

    task_id: stable id, unique within its task set (e.g. ``"train/00042"``).
    task_type: free text the reports and GRESO group by (ALFWorld: one of :data:`TASK_TYPES`;
        a library game: its game id).
    task_text: the goal sentence, e.g. ``"put a clean apple in fridge."`` ('' when the first
        observation states it).
    source: where the game comes from (ALFWorld: the game file, generated ``game.tw-pddl`` or
        an official one).
    meta: whatever ``reset`` needs (a library game: its puzzle seed, ``meta["seed"]``).
    """

    task_id: str
    task_type: str
    task_text: str
    source: str
    meta: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)


# What the engine answers an action it rejects (an invalid action).
NOTHING_HAPPENS = "Nothing happens."


@dataclass(frozen=True)
class StepResult:
    """What one environment step returns.

    observation: the new text the environment answers, only what this step adds (the engine
        keeps the conversation); ``"Nothing happens."`` for an invalid action in ALFWorld.
    reward: what this step earned, a finite number; a trajectory's reward is the sum over its
        steps (ALFWorld: 1.0 on the step the task is won, else 0.0).
    done: the episode is over, won or lost; the trajectory ends at this step. Reaching T_max is
        the engine's business, not the env's.
    valid: the action was in the admissible set before the step.
    admissible: admissible actions in the new state (may be empty: any text is an action).
    expert_plan: the planner's plan from the new state (omniscient), or () when unavailable.
    won: with ``done``, how the episode ended: True won, False lost; None (the default) keeps
        the first meaning of ``done``, won. ``won`` without ``done`` is an error.
    """

    observation: str
    reward: float
    done: bool
    valid: bool
    admissible: tuple[str, ...]
    expert_plan: tuple[str, ...] = ()
    won: bool | None = None


@runtime_checkable
class TextEnv(Protocol):
    """A multi-turn text environment.

    ``reset`` returns the initial observation (o_1, including the task sentence) and a StepResult-
    like info with ``admissible`` and ``expert_plan``. An action outside the admissible set is a
    no-op: the env answers ``"Nothing happens."``, ``valid=False``, and the step still counts.
    """

    task: Task

    def reset(self, task: Task, seed: int) -> tuple[str, StepResult]: ...

    def step(self, action: str) -> StepResult: ...

    def close(self) -> None: ...
