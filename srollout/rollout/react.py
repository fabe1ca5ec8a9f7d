"""The engine's :class:`~srollout.rollout.engine.Prompter`, bound to the ReAct protocol of
:mod:`srollout.envs.prompts` (system prompt, ``Observation: ...`` user turns, the forgiving
``Thought: ... Action: ...`` parser and action normalisation): :class:`ReactPrompter` for
ALFWorld, :class:`EnvPrompter` for an environment of your own (:mod:`srollout.envs.registry`)."""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from srollout.envs.base import Task
from srollout.errors import SrolloutError
from srollout.rollout.engine import ParsedTurn

GENERIC_SYSTEM_PROMPT = (
    "You are an agent in a text environment. Each turn you see an observation and reply with one "
    "short thought and one action, exactly:\nThought: <your reasoning>\nAction: <one action>"
)


def normalize_text(action: str) -> str:
    """The generic action normalisation: the first line, lower case, single spaces, without
    surrounding quotes / markdown / brackets and trailing punctuation (``"Guess 50."`` ->
    ``"guess 50"``). Unlike ALFWorld's it knows no verbs and drops no words."""
    a = action.strip().split("\n")[0].lower()
    a = re.sub(r"\s+", " ", a).strip("`*\"'<>[]() \t").rstrip(".!?,;: ")
    return a.strip("`*\"'<>[]() \t")


def parse_action(text: str) -> ParsedTurn:
    """The default parser of an environment of your own
    (:func:`~srollout.envs.prompts.thought_and_action`; without any ``Action:`` the last non-empty
    line is the action); both ``action`` (sent to the environment) and ``normalized`` (compared by
    the signals) are :func:`normalize_text` of it, so the environment plays exactly what the
    signals compare."""
    from srollout.envs.prompts import thought_and_action

    thought, first = thought_and_action(text, _last_line)
    action = normalize_text(first)
    return ParsedTurn(thought, action, action)


def _last_line(lines: list[str]) -> str:
    return next((line for line in reversed(lines) if line.strip()), "")


class EnvPrompter:
    """The Prompter of an environment (:class:`srollout.envs.registry.EnvSpec`, ALFWorld's
    included): its system prompt and user template where it gives them, else the model's own
    (``srollout.json`` in the model directory), else the spec's ``fallback_system_prompt`` (else
    :data:`GENERIC_SYSTEM_PROMPT`) and ``Observation: {observation}``; its parser, else
    :func:`parse_action`."""

    def __init__(
        self,
        system: str | Callable[[Task], str],
        user_template: str | None = None,
        parse: Callable[[str], Any] | None = None,
    ) -> None:
        from srollout.envs.prompts import USER_TEMPLATE

        self._system = system
        self._user_template = user_template or USER_TEMPLATE
        self._parse = parse or parse_action

    @classmethod
    def for_env(cls, spec: Any, model_dir: Any = None) -> EnvPrompter:
        """The prompter of ``spec`` for the model in ``model_dir`` (None: no model prompt)."""
        from srollout.envs.prompts import MODEL_PROMPT_FILE, check_user_template, model_prompt

        own = None
        if model_dir is not None and (Path(model_dir) / MODEL_PROMPT_FILE).is_file():
            own = model_prompt(model_dir)
        system = spec.system_prompt
        if system is None:
            fallback = spec.fallback_system_prompt or GENERIC_SYSTEM_PROMPT
            system = own.system if own is not None else fallback
        template = spec.user_template
        if template is None:
            template = own.user_template if own is not None else None
        else:
            check_user_template(template, f"environment {spec.name!r}")
        return cls(system, template, spec.parse)

    def system(self, task: Task) -> str:
        return self._system(task) if callable(self._system) else self._system

    def user(self, observation: str, step: int, task: Task, admissible: Sequence[str] = ()) -> str:
        from srollout.envs.prompts import user_turn

        return user_turn(observation, task.task_text, self._user_template, admissible)

    def parse(self, text: str) -> ParsedTurn:
        turn = self._parse(text)
        if not (isinstance(turn, tuple) and len(turn) == 3):
            raise SrolloutError(
                "an environment's parse(text) must return (thought, action, normalized), got "
                f"{type(turn).__name__}"
            )
        return ParsedTurn(*(str(x) for x in turn))


class ReactPrompter(EnvPrompter):
    """The :class:`EnvPrompter` of ALFWorld's ReAct protocol: ``system`` (default the ReAct
    prompt; see :func:`~srollout.envs.prompts.model_prompt` for a model's own), ``user_template``
    (default ``Observation: {observation}``) and ALFWorld's parser
    (:func:`~srollout.envs.prompts.parse_turn`)."""

    def __init__(self, system: str | None = None, user_template: str | None = None) -> None:
        from srollout.envs.prompts import parse_turn, system_prompt

        super().__init__(
            system if system is not None else system_prompt(), user_template, parse_turn
        )

    @classmethod
    def for_model(cls, model_dir: Any) -> ReactPrompter:
        """The prompter a model directory asks for (:func:`~srollout.envs.prompts.model_prompt`)."""
        from srollout.envs.prompts import model_prompt

        prompt = model_prompt(model_dir)
        return cls(prompt.system, prompt.user_template)
