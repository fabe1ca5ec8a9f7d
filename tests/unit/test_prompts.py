"""The ReAct protocol: response format, the forgiving parser, action normalisation."""

from __future__ import annotations

import pytest

from srollout.envs.prompts import (
    ParsedResponse,
    format_response,
    normalize_action,
    observation_of,
    parse_response,
    system_prompt,
    user_turn,
)


def test_format_then_parse_roundtrip():
    text = format_response("I need a mug.", "go to countertop 1")
    assert text == "Thought: I need a mug.\nAction: go to countertop 1"
    assert parse_response(text) == ParsedResponse("I need a mug.", "go to countertop 1", True)


@pytest.mark.parametrize(
    ("text", "thought", "action"),
    [
        # missing Thought
        ("Action: take apple 1 from countertop 1", "", "take apple 1 from countertop 1"),
        # trailing punctuation and wrong case
        ("Thought: ok\nAction: Go To Fridge 1.", "ok", "go to fridge 1"),
        # extra text after the action line
        (
            "Thought: hmm\nAction: open drawer 2\nObservation: You open the drawer 2.",
            "hmm",
            "open drawer 2",
        ),
        # both on one line
        (
            "Thought: the cabinet is closed. Action: open cabinet 1",
            "the cabinet is closed.",
            "open cabinet 1",
        ),
        # code fence, quotes, extra spaces
        ("```\nThought: go\nAction:   `go  to   sinkbasin 1`\n```", "go", "go to sinkbasin 1"),
        # put/in dialect of older ALFWorld data -> the engine's move/to
        (
            "Thought: done\nAction: put apple 1 in/on countertop 1",
            "done",
            "move apple 1 to countertop 1",
        ),
        ("Action: Put the mug 1 in the cabinet 2!", "", "move mug 1 to cabinet 2"),
        # action on the line after the marker
        ("Thought: x\nAction:\nlook", "x", "look"),
        # lower-case markers, full-width colon
        ("thought: y\naction： inventory", "y", "inventory"),
        # no marker at all: the last line that starts with a verb
        (
            "I think I should heat it.\nheat potato 1 with microwave 1",
            "",
            "heat potato 1 with microwave 1",
        ),
    ],
)
def test_parser_forgives_model_like_outputs(text, thought, action):
    parsed = parse_response(text)
    assert parsed.thought == thought
    assert parsed.action == action
    assert parsed.ok


@pytest.mark.parametrize("text", ["", "Thought: I am not sure what to do.", "hello world"])
def test_parser_without_action_is_not_ok(text):
    parsed = parse_response(text)
    assert parsed.action == ""
    assert not parsed.ok


@pytest.mark.parametrize(
    ("raw", "norm"),
    [
        ("  GO TO   Cabinet 1 ", "go to cabinet 1"),
        ("go cabinet 1", "go to cabinet 1"),
        ("place knife 1 on countertop 2", "move knife 1 to countertop 2"),
        ("put pen 1 into drawer 3.", "move pen 1 to drawer 3"),
        ("move apple 1 to fridge 1", "move apple 1 to fridge 1"),
        ("take a apple 1 from the sofa 1", "take apple 1 from sofa 1"),  # "sofa" keeps its a
        ('"look"', "look"),
        ("examine the alarmclock 1", "examine alarmclock 1"),
    ],
)
def test_normalize_action(raw, norm):
    assert normalize_action(raw) == norm


def test_normalize_is_idempotent():
    for a in ("go to cabinet 1", "move apple 1 to fridge 1", "use desklamp 1", "look"):
        assert normalize_action(normalize_action(a)) == normalize_action(a) == a


def test_system_prompt_has_vocabulary_format_and_one_example():
    sp = system_prompt()
    for verb in ("go to", "take", "move", "heat", "cool", "clean", "use", "open", "examine"):
        assert verb in sp
    assert "Thought:" in sp and "Action:" in sp and "Nothing happens." in sp
    assert sp.count("Your task is to:") == 1  # exactly one in-context example
    # every action of the example parses to itself (the example speaks the engine's dialect)
    example = sp.split("Example:", 1)[1]
    actions = [ln[len("Action: ") :] for ln in example.splitlines() if ln.startswith("Action: ")]
    assert len(actions) == 7 and all(normalize_action(a) == a for a in actions)
    assert len(sp) < 2600  # a small model carries it at every step


def test_user_turn_roundtrip():
    obs = "You arrive at fridge 1. The fridge 1 is closed."
    assert user_turn(obs) == "Observation: " + obs
    assert observation_of(user_turn(obs)) == obs


def test_a_model_directory_can_name_its_own_system_prompt(tmp_path):
    import json

    from srollout.envs.prompts import MODEL_PROMPT_FILE, system_prompt_for
    from srollout.errors import SrolloutError

    assert system_prompt_for(None) == system_prompt()
    assert system_prompt_for(tmp_path) == system_prompt()  # no srollout.json: the ReAct prompt
    (tmp_path / MODEL_PROMPT_FILE).write_text(
        json.dumps({"system_prompt": "Reply with one action."})
    )
    assert system_prompt_for(tmp_path) == "Reply with one action."
    (tmp_path / MODEL_PROMPT_FILE).write_text(json.dumps({"system_prompt": ""}))
    with pytest.raises(SrolloutError, match="non-empty"):
        system_prompt_for(tmp_path)
    (tmp_path / MODEL_PROMPT_FILE).write_text("{not json")
    with pytest.raises(SrolloutError, match=MODEL_PROMPT_FILE):
        system_prompt_for(tmp_path)


def test_a_model_directory_can_name_its_user_turn_template(tmp_path):
    import json

    from srollout.envs.base import Task
    from srollout.envs.prompts import MODEL_PROMPT_FILE, USER_TEMPLATE, model_prompt
    from srollout.errors import SrolloutError
    from srollout.rollout.react import ReactPrompter

    assert model_prompt(tmp_path).user_template == USER_TEMPLATE
    spec = {
        "system_prompt": "Act.",
        "user_template": "Observation: {observation}\nTask: {task}.\nActions: {actions}.",
    }
    (tmp_path / MODEL_PROMPT_FILE).write_text(json.dumps(spec))
    assert model_prompt(tmp_path) == ("Act.", spec["user_template"])
    prompter = ReactPrompter.for_model(tmp_path)
    task = Task("eval/x/0000", "pick_and_place_simple", "put a mug in desk.", "")
    turn = prompter.user(
        "You arrive at desk 1. On the desk 1, you see a mug 1.",
        2,
        task,
        ("go to shelf 1", "help", "take mug 1 from desk 1"),
    )
    # the task without its period, and the admissible actions without ALFWorld's `help`
    assert turn == (
        "Observation: You arrive at desk 1. On the desk 1, you see a mug 1.\n"
        "Task: put a mug in desk.\nActions: go to shelf 1, take mug 1 from desk 1."
    )
    # the default template is the paper's: the observation alone
    assert (
        ReactPrompter().user(" Nothing happens. ", 3, task, ("look",))
        == "Observation: Nothing happens."
    )
    for bad in ("Task: {task}", "{observation} {room}", 7):
        (tmp_path / MODEL_PROMPT_FILE).write_text(
            json.dumps({"system_prompt": "Act.", "user_template": bad})
        )
        with pytest.raises(SrolloutError, match="user_template"):
            model_prompt(tmp_path)


def test_a_model_prompt_is_read_once_and_again_when_its_file_changes(tmp_path):
    import json
    import os

    from srollout.envs.prompts import MODEL_PROMPT_FILE, model_prompt

    f = tmp_path / MODEL_PROMPT_FILE
    f.write_text(json.dumps({"system_prompt": "Play."}))
    first = model_prompt(tmp_path)
    assert model_prompt(tmp_path) is first  # the same object: not read again
    f.write_text(json.dumps({"system_prompt": "Play well."}))
    st = f.stat()
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns + 1))  # even within one clock tick
    assert model_prompt(tmp_path).system == "Play well."
