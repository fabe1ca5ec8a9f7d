"""The engine's :class:`~srollout.rollout.engine.Prompter`, bound to the ReAct protocol of
:mod:`srollout.envs.prompts` (system prompt, ``Observation: ...`` user turns, the forgiving
``Thought: ... Action: ...`` parser and action normalisation)."""

from __future__ import annotations

from srollout.envs.base import Task
from srollout.rollout.engine import ParsedTurn


class ReactPrompter:
    """system(task) -> the system prompt (``system``, default the ReAct prompt; see
    :func:`~srollout.envs.prompts.system_prompt_for` for a model's own); user(o_t, t, task) -> the user turn; parse(text) ->
    (thought, action, normalised action). The env is sent the normalised action."""

    def __init__(self, system: str | None = None) -> None:
        from srollout.envs.prompts import system_prompt

        self._system = system if system is not None else system_prompt()

    def system(self, task: Task) -> str:
        return self._system

    def user(self, observation: str, step: int, task: Task) -> str:
        from srollout.envs.prompts import user_turn

        return user_turn(observation)

    def parse(self, text: str) -> ParsedTurn:
        from srollout.envs.prompts import parse_response

        parsed = parse_response(text)
        return ParsedTurn(parsed.thought, parsed.action, parsed.action)
