"""The engine's :class:`~srollout.rollout.engine.Prompter`, bound to the ReAct protocol of
:mod:`srollout.envs.prompts` (system prompt, ``Observation: ...`` user turns, the forgiving
``Thought: ... Action: ...`` parser and action normalisation)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from srollout.envs.base import Task
from srollout.rollout.engine import ParsedTurn


class ReactPrompter:
    """system(task) -> the system prompt (``system``, default the ReAct prompt; see
    :func:`~srollout.envs.prompts.model_prompt` for a model's own); user(o_t, t, task) -> the user
    turn in ``user_template`` (default ``Observation: {observation}``); parse(text) ->
    (thought, action, normalised action). The env is sent the normalised action."""

    def __init__(self, system: str | None = None, user_template: str | None = None) -> None:
        from srollout.envs.prompts import USER_TEMPLATE, system_prompt

        self._system = system if system is not None else system_prompt()
        self._user_template = user_template or USER_TEMPLATE

    @classmethod
    def for_model(cls, model_dir: Any) -> ReactPrompter:
        """The prompter a model directory asks for (:func:`~srollout.envs.prompts.model_prompt`)."""
        from srollout.envs.prompts import model_prompt

        prompt = model_prompt(model_dir)
        return cls(prompt.system, prompt.user_template)

    def system(self, task: Task) -> str:
        return self._system

    def user(self, observation: str, step: int, task: Task, admissible: Sequence[str] = ()) -> str:
        from srollout.envs.prompts import user_turn

        return user_turn(observation, task.task_text, self._user_template, admissible)

    def parse(self, text: str) -> ParsedTurn:
        from srollout.envs.prompts import parse_response

        parsed = parse_response(text)
        return ParsedTurn(parsed.thought, parsed.action, parsed.action)
