"""DAgger rounds of the default-policy build (srollout.default_policy.dagger) on the real ALFWorld
engine: who plays each step, which turns carry loss, the policy's prompt in every recorded turn,
and the same config giving the same round."""

from __future__ import annotations

import dataclasses
import json
import os
import re

import pytest

pytest.importorskip("alfworld")
torch = pytest.importorskip("torch")

# with the goal in every turn (the admissible-actions list of the default policy's template would
# overflow the tiny model's 2048-token context: its 300-token vocabulary spells the room out)
TEMPLATE = "Observation: {observation}\nTask: {task}."


@pytest.fixture(scope="module")
def home(tmp_path_factory):
    """A temporary SROLLOUT_HOME, so the few games generated here stay out of the user's cache."""
    old = os.environ.get("SROLLOUT_HOME")
    os.environ["SROLLOUT_HOME"] = str(tmp_path_factory.mktemp("srollout-home"))
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("SROLLOUT_HOME", None)
        else:
            os.environ["SROLLOUT_HOME"] = old


@pytest.fixture(scope="module")
def tasks(home):
    from srollout.envs.tasks import load_task_set

    return load_task_set("train", n=3, progress=False)


@pytest.fixture(scope="module")
def model(tiny_policy):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(1)
    model = AutoModelForCausalLM.from_pretrained(tiny_policy).eval()
    return model, AutoTokenizer.from_pretrained(tiny_policy)


def _cfg(**over):
    from srollout.default_policy.recipe import BuildConfig

    return dataclasses.replace(
        BuildConfig(), thoughts="none", user_template=TEMPLATE, correction_G=2, **over
    )


def test_with_beta_one_the_expert_plays_every_step_and_every_turn_is_trained(tasks, model):
    from srollout.default_policy.dagger import play_round

    won, branches, stats = play_round(*model, tasks, "SYS", _cfg(correction_beta=1.0), 0)
    # the expert solves every generated task: 3 tasks x G=2 trajectories, all won
    assert (stats.trajectories, stats.won, stats.model_steps, stats.model_off_label) == (6, 6, 0, 0)
    assert branches == [] and stats.relabelled == 0  # the model never acted: nothing to relabel
    assert stats.expert_steps == sum(len(turns) for _, turns in won)
    for system, turns in won:
        assert system == "SYS"
        assert all(t.trained and t.assistant.startswith("Action: ") for t in turns)
        assert not any("Thought" in t.assistant for t in turns)
    # the user turns are in the policy's template, with the goal
    goals = {t.task_text.rstrip(".") for t in tasks}
    for _, turns in won:
        first = turns[0].user
        assert first.startswith("Observation: You are in the middle of a room.")
        goal = first.split("\nTask: ")[1].rstrip(".")
        assert goal in goals and f"Your task is to: {goal}." in first
        assert all(t.user.endswith(f"\nTask: {goal}.") for t in turns)


@pytest.mark.slow  # ~12 s on 2 loaded cores: four rounds of the tiny model, most to the context end
def test_model_turns_off_the_label_stay_in_the_context_untrained(tasks, model):
    from srollout.default_policy.dagger import play_round

    # beta 0: the model plays every step. The tiny model never wins, and every trajectory's next
    # turn stops fitting its 2048-token context before T_max = 30 (6 x 30 = 180 model steps
    # otherwise; collect's engine would stop with an error there). The expert plays those out (and
    # wins 4 of the 6), but they are not trained on: nothing is won
    won, branches, stats = play_round(*model, tasks, "SYS", _cfg(correction_beta=0.0), 0)
    assert (stats.trajectories, stats.won, stats.expert_steps, stats.past_context) == (6, 0, 0, 6)
    assert won == []
    assert branches == [] and stats.relabelled == 0  # nor relabelled
    assert 6 <= stats.model_steps < 180 and stats.model_off_label == stats.model_steps
    # beta 0.5: both play; in a won trajectory the expert's turns and the model's on-label turns
    # are trained and read as the label (`Action: ...`), the model's other turns keep its own
    # text (the tiny model answers `Thought: ...`) and carry no loss
    cfg = _cfg(correction_beta=0.5, correction_relabel=True)
    won, branches, stats = play_round(*model, tasks, "SYS", cfg, 0)
    assert stats.won >= 1 and stats.model_steps > 0 and stats.expert_steps > 0
    for _, turns in won:
        assert all(t.trained == t.assistant.startswith("Action: ") for t in turns)
        assert any(not t.trained for t in turns) and any(t.trained for t in turns)
    assert sum(not t.trained for _, turns in won for t in turns) <= stats.model_off_label
    # every off-label model turn of a won trajectory has its branch: the turns before it, none
    # trained, then its user turn answered by the expert's label (trained); lost trajectories
    # that fit the context add theirs, so there are at least as many as untrained won turns
    assert stats.relabelled == len(branches) <= stats.model_off_label
    assert len(branches) >= sum(not t.trained for _, turns in won for t in turns) > 0
    for _, b in branches:
        assert not any(t.trained for t in b[:-1])
        assert b[-1].trained and b[-1].assistant.startswith("Action: ")
    for _, turns in won:
        for j, t in enumerate(turns):
            if not t.trained:
                head = [u._replace(trained=False) for u in turns[:j]]
                assert any(b[:-1] == head and b[-1].user == t.user for _, b in branches)
    # same config and round: the same round, step for step; another round index: other seeds
    won2, branches2, stats2 = play_round(*model, tasks, "SYS", cfg, 0)
    assert won2 == won and branches2 == branches
    assert stats2._replace(seconds=0) == stats._replace(seconds=0)
    _, _, stats3 = play_round(*model, tasks, "SYS", cfg, 1)
    assert stats3._replace(seconds=0) != stats._replace(seconds=0)


def test_without_relabel_a_round_has_no_branches_and_the_same_rollouts(tasks, model):
    from srollout.default_policy.dagger import play_round

    # relabelling is off by default
    won, branches, stats = play_round(*model, tasks, "SYS", _cfg(correction_beta=0.5), 0)
    assert branches == [] and stats.relabelled == 0 and stats.model_off_label > 0
    # the rollouts themselves do not depend on it
    relabel = _cfg(correction_beta=0.5, correction_relabel=True)
    won2, _, stats2 = play_round(*model, tasks, "SYS", relabel, 0)
    assert won2 == won and stats2._replace(seconds=0, relabelled=0) == stats._replace(seconds=0)


def test_relabel_branches_by_hand():
    from srollout.default_policy.dagger import relabel_branches
    from srollout.policy.chat import Turn

    turns = [
        Turn("u1", "Action: a1", True),
        Turn("u2", "Action: bad", False),
        Turn("u3", "Action: a3", True),
        Turn("u4", "Thought: hm", False),
    ]
    assert relabel_branches(turns, [(1, "Action: a2"), (3, "Action: a4")]) == [
        [Turn("u1", "Action: a1", False), Turn("u2", "Action: a2", True)],
        [
            Turn("u1", "Action: a1", False),
            Turn("u2", "Action: bad", False),
            Turn("u3", "Action: a3", False),
            Turn("u4", "Action: a4", True),
        ],
    ]
    assert relabel_branches(turns, []) == []


def test_round_tasks_are_a_fresh_seeded_sample_each_round(tasks):
    from srollout.default_policy.dagger import round_tasks

    cfg = _cfg(correction_tasks=2)
    r0 = round_tasks(tasks, cfg, 0)
    assert len(r0) == 2 and r0 == round_tasks(tasks, cfg, 0) and len({t.task_id for t in r0}) == 2
    # 3 choose 2 = 3 possible samples: over six rounds, not always the first one
    assert [round_tasks(tasks, cfg, r) for r in range(1, 7)] != [r0] * 6
    assert len(round_tasks(tasks, _cfg(correction_tasks=50), 0)) == 3  # never more than there are


def test_the_build_runs_its_rounds_and_records_them(home, tmp_path):
    from tiny_policy import TINY_CONFIG, synthetic_demos

    from srollout.default_policy.build import build_from_demos
    from srollout.envs.prompts import model_prompt, system_prompt

    cfg = dataclasses.replace(
        TINY_CONFIG,
        epochs=1,
        n_demo_tasks=2,
        correction_rounds=1,
        correction_tasks=2,
        correction_G=2,
        correction_beta=1.0,
        correction_epochs=1,
        correction_replay=3,
        user_template=TEMPLATE,
        max_context=8192,
    )  # room for 30 ReAct turns
    build_from_demos(synthetic_demos(8, seed=1), cfg, tmp_path / "m")
    info = json.loads((tmp_path / "m" / "build.json").read_text())
    (r,) = info["dagger_rounds"]
    assert (r["trajectories"], r["won"], r["model_steps"]) == (4, 4, 0)
    # the ReAct system prompt with a user template of its own: both saved for every stage to use
    assert model_prompt(tmp_path / "m") == (system_prompt(), TEMPLATE)


@pytest.mark.parametrize(
    "field, value, message",
    [
        ("thoughts", "verbose", "BuildConfig.thoughts: expected one of none, react, scratchpad"),
        ("take", "eager", "BuildConfig.take: expected one of planned, greedy"),
        ("user_template", "Obs: {obs}", "`user_template` must be a string with {observation}"),
        ("correction_beta", 1.5, "correction_beta in [0, 1]"),
        ("correction_beta_decay", -0.5, "correction_beta in [0, 1] (its decay too)"),
    ],
)
def test_a_bad_build_config_is_refused_before_any_work(field, value, message, tmp_path):
    from tiny_policy import TINY_CONFIG

    from srollout.default_policy.build import build_default_policy
    from srollout.errors import SrolloutError

    with pytest.raises(SrolloutError, match=re.escape(message)):
        build_default_policy(
            dataclasses.replace(TINY_CONFIG, **{field: value}), out=tmp_path / "m", quiet=True
        )
    assert not (tmp_path / "m").exists()
