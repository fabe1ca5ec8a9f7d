"""The TextEnv protocol every environment implements, and the task record it runs (the protocol's
contract, field by field: docs/environments.md)."""

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
    """One game (one prompt of the GRPO batch): ``task_id`` unique within its task set;
    ``task_type`` free text the reports and GRESO group by (ALFWorld: one of :data:`TASK_TYPES`);
    ``task_text`` the goal ('' when the first observation states it); ``source`` where the game
    comes from; ``meta`` whatever ``reset`` needs (a library game: its puzzle seed)."""

    task_id: str
    task_type: str
    task_text: str
    source: str
    meta: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)


# What the engine answers an action it rejects (an invalid action).
NOTHING_HAPPENS = "Nothing happens."


@dataclass(frozen=True)
class StepResult:
    """What one environment step returns: only the new text this step adds (the engine keeps the
    conversation), the reward it earned (a trajectory's reward is the sum), whether the episode is
    over (T_max is the engine's business), whether the action was admissible, the new state's
    admissible actions and planner plan, and with ``done`` whether it was won (None: won)."""

    observation: str
    reward: float
    done: bool
    valid: bool
    admissible: tuple[str, ...]
    expert_plan: tuple[str, ...] = ()
    won: bool | None = None


@runtime_checkable
class TextEnv(Protocol):
    """A multi-turn text environment; ``reset`` returns o_1 (with the goal) and a StepResult whose
    ``admissible`` and ``expert_plan`` are read. An invalid action still counts as a step."""

    task: Task

    def reset(self, task: Task, seed: int) -> tuple[str, StepResult]: ...

    def step(self, action: str) -> StepResult: ...

    def close(self) -> None: ...
