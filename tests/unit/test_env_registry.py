"""Your own environment (srollout.envs.registry, srollout.rollout.react.EnvPrompter): naming it
(registry, module:attr, entry point), checking it speaks the TextEnv protocol, prompting and
parsing for it, and the engine playing it, on the corridor of corridor_env with hand-worked
numbers."""

from __future__ import annotations

import json
import sys
import textwrap

import pytest
from corridor_env import Corridor, tasks

from srollout.envs.registry import EnvSpec, check_env, env_names, register_env, resolve_env
from srollout.errors import SrolloutError
from srollout.policy.base import ActResponse
from srollout.rollout.engine import GroupSpec, ParsedTurn, RolloutSettings, run_groups
from srollout.rollout.react import GENERIC_SYSTEM_PROMPT, EnvPrompter, parse_action

CORRIDOR = EnvSpec(
    name="corridor",
    make_env=Corridor,
    tasks={"train": tasks([2, 3]), "eval": tasks([2])},
    system_prompt="Walk.",
)


def test_parse_action_sends_what_the_signals_compare():
    assert parse_action("Thought: go on.\nAction: Guess 50.") == ParsedTurn(
        "go on.", "guess 50", "guess 50"
    )
    # the next line when the Action: line is empty; no Action: -> the last non-empty line
    assert parse_action("Action:\n`Open Door`\n").action == "open door"
    assert parse_action("I think so.\n\nforward!\n") == ParsedTurn("", "forward", "forward")
    # unlike ALFWorld's normalisation, no verb dialect and no dropped articles
    assert parse_action("Action: put the apple in box").action == "put the apple in box"


def test_prompt_precedence_env_then_model_then_generic(tmp_path):
    task = tasks([2])[0]
    model = tmp_path / "model"
    model.mkdir()
    (model / "srollout.json").write_text(
        json.dumps({"system_prompt": "Own.", "user_template": "Obs: {observation} ({task})"})
    )
    own = EnvPrompter.for_env(EnvSpec("x", Corridor, {"eval": [task]}), model)
    assert own.system(task) == "Own." and own.user("cell 0", 1, task) == "Obs: cell 0 (walk)"
    generic = EnvPrompter.for_env(EnvSpec("x", Corridor, {"eval": [task]}), None)
    assert generic.system(task) == GENERIC_SYSTEM_PROMPT
    assert generic.user(" cell 0 ", 1, task) == "Observation: cell 0"
    given = EnvPrompter.for_env(
        EnvSpec("x", Corridor, {"eval": [task]}, system_prompt=lambda t: t.task_id), model
    )
    assert given.system(task) == "t/0" and given.user("c", 1, task) == "Obs: c (walk)"
    with pytest.raises(SrolloutError, match="user_template"):
        EnvPrompter.for_env(EnvSpec("x", Corridor, {"eval": [task]}, user_template="{obs}"), None)


def test_a_bad_parser_is_one_error():
    spec = EnvSpec("x", Corridor, {"eval": tasks([2])}, parse=lambda text: text)
    with pytest.raises(SrolloutError, match=r"\(thought, action, normalized\)"):
        EnvPrompter.for_env(spec, None).parse("Action: forward")


def test_resolve_by_registered_name_module_attr_and_entry_point(tmp_path, monkeypatch):
    register_env(CORRIDOR)
    assert resolve_env("corridor") is CORRIDOR and "corridor" in env_names()
    (tmp_path / "my_env_mod.py").write_text(
        textwrap.dedent(
            """
            from corridor_env import Corridor, tasks
            from srollout.envs.registry import EnvSpec
            SPEC = EnvSpec("mine", Corridor, {"eval": tasks([4])})
            def make():
                return SPEC
            NOT_A_SPEC = 3
            """
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    assert resolve_env("my_env_mod:SPEC").name == "mine"
    assert resolve_env("my_env_mod:make") is resolve_env("my_env_mod:SPEC")

    class Point:
        name, value = "ep-corridor", "my_env_mod:make"

        def load(self):
            return sys.modules["my_env_mod"].make

    import importlib.metadata

    class Library:  # a library of games: the entry point is a function of the game id
        name, value = "lib", "my_env_mod:games"

        def load(self):
            def games(game_id):
                length = int(game_id.removeprefix("corridor-"))
                return EnvSpec(f"lib:{game_id}", Corridor, {"eval": tasks([length])})

            return games

    groups = {"srollout.envs": [Point()], "srollout.env_libraries": [Library()]}
    monkeypatch.setattr(importlib.metadata, "entry_points", lambda group=None: groups[group])
    assert resolve_env("ep-corridor").name == "mine"
    game = resolve_env("lib:corridor-3")
    assert game.name == "lib:corridor-3" and game.task_set("eval") == tasks([3])
    with pytest.raises(SrolloutError, match=r"--env lib:maze: entry point 'my_env_mod:games' "):
        resolve_env("lib:maze")  # the library's own error, in one line
    assert env_names() == [
        *sorted(["alfworld", "corridor", "ep-corridor", *_others()]),
        "lib:<game id>",
    ]
    for ref, message in [
        ("nowhere", r"--env 'nowhere': no such environment \(known: alfworld, corridor"),
        ("my_env_mod:NOT_A_SPEC", "not an EnvSpec .* got int"),
        ("my_env_mod:MISSING", "has no 'MISSING'"),
        ("no_such_module_x:SPEC", "cannot import 'no_such_module_x'"),
    ]:
        with pytest.raises(SrolloutError, match=message):
            resolve_env(ref)
    # ALFWorld is a spec like any other: its tasks take the options it declares
    alfworld = resolve_env("alfworld")
    assert alfworld.name == "alfworld" and alfworld.task_options == ("difficulty", "n")
    assert alfworld.expert_env is not None and alfworld.auto_workers
    with pytest.raises(SrolloutError, match="built-in environment; choose another name"):
        register_env(EnvSpec(name="alfworld", make_env=object, tasks={}))


def _others() -> list[str]:
    from srollout.envs.registry import _REGISTRY

    return [n for n in _REGISTRY if n != "corridor"]


def test_task_sets_from_a_mapping_or_a_function():
    assert [t.task_id for t in CORRIDOR.task_set("train")] == ["t/0", "t/1"]
    with pytest.raises(SrolloutError, match="has no task set 'heldout' \\(it has: train, eval\\)"):
        CORRIDOR.task_set("heldout")
    by_fn = EnvSpec("f", Corridor, lambda split: tasks([5] * 3) if split == "eval" else [])
    assert len(by_fn.task_set("eval")) == 3
    with pytest.raises(SrolloutError, match="task set 'train' is empty"):
        by_fn.task_set("train")
    with pytest.raises(SrolloutError, match="not unique"):
        EnvSpec("d", Corridor, {"eval": tasks([2]) * 2}).task_set("eval")


class NoStep:
    def reset(self, task, seed):
        return "o", None

    def close(self):
        pass


class ResetReturnsText(Corridor):
    def reset(self, task, seed):
        return "cell 0"


class StepReturnsTuple(Corridor):
    def step(self, action):
        return ("cell 1", 0.0, False)


@pytest.mark.parametrize(
    ("make_env", "message"),
    [
        (NoStep, r"NoStep does not implement the TextEnv protocol \(no step;"),
        (
            ResetReturnsText,
            r"reset\(task, seed\) must return \(observation: str, StepResult\), got str",
        ),
        (
            StepReturnsTuple,
            r"step\('forward'\) must give a srollout.envs.base.StepResult, got a tuple of 3",
        ),
    ],
)
def test_check_env_names_what_breaks_the_protocol(make_env, message):
    spec = EnvSpec("bad", make_env, {"eval": tasks([2])})
    with pytest.raises(SrolloutError, match=message):
        check_env(spec, spec.task_set("eval"))


def test_check_env_plays_reset_and_one_admissible_step_then_closes():
    made = []

    def make():
        made.append(Corridor())
        return made[-1]

    check_env(EnvSpec("c", make, {"eval": tasks([1])}), tasks([1]))
    assert len(made) == 1 and made[0].closed and made[0].pos == 1  # "forward" won the 1-cell walk


class Scripted:
    """A Policy: trajectory i answers ``RESPONSES[i]`` at every step."""

    name = "scripted"
    RESPONSES = ("Thought: go.\nAction: Forward.", "Action: wait", "forward", "Action: WAIT!")

    def act(self, requests):
        return [ActResponse(self.RESPONSES[r.key.traj_idx], 3, 2) for r in requests]

    def finish(self, key):
        return None


def test_engine_plays_a_registered_env_with_its_prompter():
    """A corridor of 2 cells, G=4, T_max=3. The env is sent the normalised action: trajectories 0
    and 2 ("Forward.", a bare "forward") win at step 2, 1 and 3 ("wait", "WAIT!") play 3 invalid
    steps. Rewards [1, 0, 1, 0]: mixed, population variance 0.25. At K=2 the prefixes are
    (f f), (w w), (f f), (w w): pairwise edit distances 1, 0, 1, 1, 0, 1 over length 2 -> d_2 =
    (4 x 2/2) / 6 = 0.667."""
    from srollout.rollout.records import group_tables

    register_env(CORRIDOR)
    spec = resolve_env("corridor")
    records = []
    settings = RolloutSettings(G=4, T_max=3, seed=0, concurrency=4, signal_K=(2,))
    specs = [GroupSpec(0, spec.task_set("eval")[0])]
    run_groups(
        specs,
        Scripted(),
        spec.make_env,
        EnvPrompter.for_env(spec, None),
        settings,
        on_group=records.append,
    )
    (record,) = records
    assert [len(t.steps) for t in record.trajs] == [2, 3, 2, 3]
    assert record.rewards == [1.0, 0.0, 1.0, 0.0]
    assert [t.ended_by for t in record.trajs] == ["done", "max_steps", "done", "max_steps"]
    assert record.trajs[0].steps[0]["thought"] == "go."
    assert [s["valid"] for s in record.trajs[3].steps] == [False] * 3
    tables = group_tables(record)
    group = tables.groups.row(0, named=True)
    assert (group["label"], group["reward_var"], group["success_rate"]) == ("mixed", 0.25, 0.5)
    assert tables.signals.row(0, named=True)["prefix_edit_distance_mean"] == pytest.approx(4 / 6)


def test_won_at_says_what_success_is_for_a_game_that_only_says_done():
    """A corridor of 2 cells paid 0.5 a step forward (done on arrival, never ``won``): with
    won_at 1.0 arriving is won; a spec whose bar is 1.5 calls the same episode lost."""

    class Paid(Corridor):
        def step(self, action):
            r = super().step(action)
            return StepResult(r.observation, 0.5 if r.valid else 0.0, r.done, r.valid, r.admissible)

    from srollout.envs.base import StepResult

    for won_at, won in ((1.0, True), (1.5, False)):
        env = EnvSpec("paid", Paid, {"eval": tasks([2])}, won_at=won_at).env_factory()()
        env.reset(tasks([2])[0], 0)
        first, second = env.step("forward"), env.step("forward")
        assert (first.done, first.won) == (False, None)
        assert (second.done, second.won, second.reward) == (True, won, 0.5)
        env.reset(tasks([2])[0], 0)  # the sum starts again at every reset
        env.step("forward")
        assert env.step("forward").won is won
    spec = EnvSpec("plain", Corridor, {"eval": tasks([2])})
    assert spec.env_factory() is Corridor


def test_alfworlds_spec_prompts_exactly_as_the_react_prompter_did(tmp_path):
    """The one path gives ALFWorld the prompts and parses it always had: the model's own prompt
    where its directory names one (the shipped policy), else ALFWorld's ReAct prompt."""
    import json

    from srollout.default_policy import SHIPPED_DIR
    from srollout.envs.base import Task
    from srollout.rollout.react import EnvPrompter, ReactPrompter

    own = tmp_path / "own"
    own.mkdir()
    (own / "srollout.json").write_text(
        json.dumps({"system_prompt": "Be brief.", "user_template": "{task} | {observation}"})
    )
    spec = resolve_env("alfworld")
    task = Task("t/1", "pick_and_place_simple", "put a mug in the sink.", "")
    texts = ["Thought: go\nAction: Go To the Sink 1", "action: put mug 1 in/on sink 1", "junk"]
    for model_dir in (None, SHIPPED_DIR, own, tmp_path):
        old = ReactPrompter.for_model(model_dir) if model_dir is not None else ReactPrompter()
        new = EnvPrompter.for_env(spec, model_dir)
        assert new.system(task) == old.system(task)
        assert new.user("You see a sink.", 2, task, ("go to sink 1",)) == old.user(
            "You see a sink.", 2, task, ("go to sink 1",)
        )
        assert [new.parse(t) for t in texts] == [old.parse(t) for t in texts]
