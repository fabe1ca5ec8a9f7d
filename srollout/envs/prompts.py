"""The ReAct protocol (paper App. "Prompt templates"): system prompt, user turns, the response
format ``Thought: ... Action: <action>``, a greedy and forgiving parser, action normalisation.

Normalised actions are what the environment plays and what the divergence signals compare, so
``"Put the Apple 1 in Fridge 1."`` and ``"move apple 1 to fridge 1"`` count as the same action.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import NamedTuple

from srollout.errors import SrolloutError

ACTION_VOCABULARY: tuple[str, ...] = (
    "go to {recep}",
    "open {recep}",
    "close {recep}",
    "take {obj} from {recep}",
    "move {obj} to {recep}",
    "heat {obj} with {recep}",
    "cool {obj} with {recep}",
    "clean {obj} with {recep}",
    "use {obj}",
    "examine {obj or recep}",
    "look",
    "inventory",
)

# One short solved episode (a clean task: explore, take, clean, place), with the thoughts the
# expert policies write. Kept compact on purpose: a small model carries it at every step.
_EXAMPLE = (
    "Observation: You are in the middle of a room. Looking quickly around you, you see a "
    "cabinet 1, a countertop 1, a drawer 1, and a sinkbasin 1.\n\n"
    "Your task is to: put a clean mug in cabinet.\n"
    "Thought: I need to find the mug. I will check countertop 1.\n"
    "Action: go to countertop 1\n"
    "Observation: You arrive at countertop 1. On the countertop 1, you see a mug 1.\n"
    "Thought: I see the mug 1. I take it.\n"
    "Action: take mug 1 from countertop 1\n"
    "Observation: You pick up the mug 1 from the countertop 1.\n"
    "Thought: Now I clean the mug 1 with sinkbasin 1.\n"
    "Action: go to sinkbasin 1\n"
    "Observation: You arrive at sinkbasin 1. On the sinkbasin 1, you see nothing.\n"
    "Thought: I clean the mug 1 with the sinkbasin 1.\n"
    "Action: clean mug 1 with sinkbasin 1\n"
    "Observation: You clean the mug 1 using the sinkbasin 1.\n"
    "Thought: Now I put the mug 1 in cabinet 1.\n"
    "Action: go to cabinet 1\n"
    "Observation: You arrive at cabinet 1. The cabinet 1 is closed.\n"
    "Thought: The cabinet 1 is closed. I open it.\n"
    "Action: open cabinet 1\n"
    "Observation: You open the cabinet 1. The cabinet 1 is open. In it, you see nothing.\n"
    "Thought: I put the mug 1 in cabinet 1.\n"
    "Action: move mug 1 to cabinet 1\n"
    "Observation: You move the mug 1 to the cabinet 1."
)


def system_prompt() -> str:
    """The system message: environment, action vocabulary, response format, one example."""
    actions = ", ".join(ACTION_VOCABULARY)
    return (
        "You are an agent in a household (ALFWorld). Each turn you see an observation and "
        "reply with one short thought and one action, exactly:\n"
        "Thought: <your reasoning>\nAction: <one action>\n"
        f"Actions: {actions}.\n"
        'An impossible action answers "Nothing happens." and wastes a step.\n'
        f"Example:\n{_EXAMPLE}"
    )


MODEL_PROMPT_FILE = "srollout.json"
# The ReAct user turn: the observation o_t alone (the paper's protocol).
USER_TEMPLATE = "Observation: {observation}"


class ModelPrompt(NamedTuple):
    """How a policy is prompted: its system prompt, and the template of its user turns
    (``{observation}`` is o_t, ``{task}`` the goal sentence without its final period,
    ``{actions}`` the admissible actions of the state, comma-separated)."""

    system: str
    user_template: str = USER_TEMPLATE


def model_prompt(model_dir: str | Path | None) -> ModelPrompt:
    """The prompt a policy is rolled out with: what its model directory asks for in
    ``srollout.json`` (``{"system_prompt": "...", "user_template": "..."}``, written by models
    fine-tuned on a prompt of their own, such as the default policy), else the ReAct prompt of
    :func:`system_prompt` with ``Observation: ...`` user turns."""
    if model_dir is not None:
        f = Path(model_dir) / MODEL_PROMPT_FILE
        if f.is_file():
            st = f.stat()
            key = (str(f.resolve()), st.st_size, st.st_mtime_ns)
            if key not in _READ:  # read once per process while the file is unchanged
                _READ[key] = _read_model_prompt(f)
            return _READ[key]
    return ModelPrompt(system_prompt())


# srollout.json files read: (path, size, mtime) -> their prompt
_READ: dict[tuple[str, int, int], ModelPrompt] = {}


def _read_model_prompt(f: Path) -> ModelPrompt:
    """The prompt a model's srollout.json asks for (one line naming the file when bad)."""
    try:
        spec = json.loads(f.read_text())
        prompt = spec.get("system_prompt")
        template = spec.get("user_template", USER_TEMPLATE)
    except (ValueError, AttributeError) as e:
        raise SrolloutError(f"{f}: not a JSON object with a `system_prompt` string ({e})") from e
    if not isinstance(prompt, str) or not prompt.strip():
        raise SrolloutError(f"{f}: `system_prompt` must be a non-empty string")
    check_user_template(template, str(f))
    return ModelPrompt(prompt, template)


def system_prompt_for(model_dir: str | Path | None) -> str:
    """The system prompt of :func:`model_prompt`."""
    return model_prompt(model_dir).system


def check_user_template(template: object, where: str) -> None:
    """A user template must be a string that names ``{observation}``, and optionally ``{task}``
    and ``{actions}``, nothing else."""
    import string

    fields = set()
    if isinstance(template, str):
        try:
            fields = {f for _, f, _, _ in string.Formatter().parse(template) if f is not None}
        except ValueError as e:
            raise SrolloutError(f"{where}: `user_template` is not a valid template ({e})") from e
    if (
        not isinstance(template, str)
        or "observation" not in fields
        or not fields <= {"observation", "task", "actions"}
    ):
        raise SrolloutError(
            f"{where}: `user_template` must be a string with {{observation}} and optionally "
            f"{{task}} and {{actions}}, got {template!r}"
        )


def user_turn(
    observation: str, task: str = "", template: str = USER_TEMPLATE, admissible: Sequence[str] = ()
) -> str:
    """One user message: the observation o_t, in ``template`` (``task``: the goal sentence;
    ``admissible``: the state's admissible actions, listed without ALFWorld's ``help``)."""
    actions = ", ".join(a for a in admissible if a != "help") if "{actions}" in template else ""
    return template.format(
        observation=observation.strip(), task=task.strip().rstrip("."), actions=actions
    )


def observation_of(user_text: str) -> str:
    """Inverse of :func:`user_turn` with the default template."""
    text = user_text.strip()
    return text[len("Observation:") :].strip() if text.startswith("Observation:") else text


def format_response(thought: str, action: str) -> str:
    """An assistant turn: ``"Thought: ...\\nAction: ..."``."""
    return f"Thought: {thought.strip()}\nAction: {action.strip()}"


class ParsedResponse(NamedTuple):
    """thought: text after ``Thought:`` ("" if missing); action: normalised action ("" if none
    found); ok: an action was found."""

    thought: str
    action: str
    ok: bool


_ACTION_RE = re.compile(r"action\s*[:：]\s*(.*)", re.IGNORECASE)
_THOUGHT_RE = re.compile(
    r"thought\s*[:：]\s*(.*?)(?=\n\s*action\s*[:：]|action\s*[:：]|$)", re.IGNORECASE | re.DOTALL
)
_VERBS = (
    "go to",
    "open",
    "close",
    "take",
    "move",
    "put",
    "heat",
    "cool",
    "clean",
    "use",
    "examine",
    "look",
    "inventory",
    "slice",
    "toggle",
)


def thought_and_action(text: str, fallback: Callable[[list[str]], str]) -> tuple[str, str]:
    """A response's thought (after ``Thought:``, spaces collapsed; '' when absent) and its raw
    action: the rest of the first ``Action:`` line (case-insensitive; the next line when that one
    is empty), or without any ``Action:`` marker ``fallback(lines)``. Code fences are dropped."""
    raw = text.replace("```", "\n").replace("\r", "")
    m = _THOUGHT_RE.search(raw)
    thought = " ".join(m.group(1).split()) if m else ""
    am = _ACTION_RE.search(raw)
    if am is None:
        return thought, fallback(raw.split("\n"))
    first = am.group(1).strip().split("\n")[0]
    if not first:  # "Action:\ngo to x"
        rest = raw[am.end() :].strip().split("\n")
        first = rest[0] if rest else ""
    return thought, first


def _last_verb_line(lines: list[str]) -> str:
    for line in reversed(lines):
        line = line.strip().strip("`*\"' ").lower()
        if any(line.startswith(v) for v in _VERBS):
            return line
    return ""


def parse_response(text: str) -> ParsedResponse:
    """Greedy, forgiving parse of a model response (:func:`thought_and_action`): text after the
    first line of the action is dropped; without an ``Action:`` marker, the last line that starts
    with an action verb is the action. The action is normalised."""
    thought, action = thought_and_action(text, _last_verb_line)
    action = normalize_action(action)
    return ParsedResponse(thought, action, bool(action))


def parse_turn(text: str) -> tuple[str, str, str]:
    """ALFWorld's parser as an environment's ``parse``: the normalised action is both sent and
    compared."""
    parsed = parse_response(text)
    return parsed.thought, parsed.action, parsed.action


_PUT_RE = re.compile(r"^(?:put|place)\s+(.+?)\s+(?:in/on|into|in|on|onto|inside|to)\s+(.+)$")
_ARTICLES = re.compile(r"\b(?:the|a|an)\s+")


def normalize_action(action: str) -> str:
    """Canonical form of an action: lower case, single spaces, no surrounding quotes / markdown /
    trailing punctuation, no articles, and the engine's dialect (``put X in/on Y`` and
    ``place X on Y`` -> ``move X to Y``; ``go X`` -> ``go to X``)."""
    a = action.strip().lower()
    a = a.split("\n")[0]
    a = a.strip("`*\"'<>[]() \t")
    a = re.sub(r"\s+", " ", a)
    a = a.rstrip(".!?,;: ")
    a = a.strip("`*\"'<>[]() \t")
    a = _ARTICLES.sub("", a) if a not in ("look", "inventory") else a
    m = _PUT_RE.match(a)
    if m:
        a = f"move {m.group(1)} to {m.group(2)}"
    if a.startswith("go ") and not a.startswith("go to "):
        a = "go to " + a[3:]
    return a.strip()
