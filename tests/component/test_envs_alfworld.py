"""ALFWorld on the real engine, on generated games: the expert solves every task type, invalid
actions are no-ops that count, same seed -> same game and same observations, group sharing keeps
environments independent, and the dialogue equals textworld's stock PddlEnv."""

from __future__ import annotations

import os
import random
import sys

import pytest

from srollout.envs.base import TASK_TYPES, TextEnv
from srollout.policy.base import ActRequest, Policy, TrajKey

pytest.importorskip("alfworld")
pytest.importorskip("textworld")


@pytest.fixture(scope="module")
def tasks(tmp_path_factory):
    """12 eval games (all six types) generated once into a temporary SROLLOUT_HOME."""
    from srollout.envs.tasks import load_task_set

    old = os.environ.get("SROLLOUT_HOME")
    os.environ["SROLLOUT_HOME"] = str(tmp_path_factory.mktemp("srollout-home"))
    try:
        yield load_task_set("eval", n=12, progress=False)
    finally:
        if old is None:
            os.environ.pop("SROLLOUT_HOME", None)
        else:
            os.environ["SROLLOUT_HOME"] = old


@pytest.fixture()
def env():
    from srollout.envs.alfworld_env import AlfworldEnv

    e = AlfworldEnv(expert_plan=True)
    yield e
    e.close()


def _play_policy(env, task, policy, seed, max_steps=30):
    """Drive ``policy`` like the rollout engine does; returns (won, steps, observations)."""
    from srollout.envs.prompts import parse_response, system_prompt, user_turn

    obs, info = env.reset(task, seed)
    key = TrajKey("g", 0)
    seen = [obs]
    for step in range(1, max_steps + 1):
        req = ActRequest(
            key, step, seed, system_prompt(), user_turn(obs), info.admissible, info.expert_plan
        )
        res = env.step(parse_response(policy.act([req])[0].text).action)
        seen.append(res.observation)
        obs, info = res.observation, res
        if res.done:
            policy.finish(key)
            return True, step, seen
    policy.finish(key)
    return False, max_steps, seen


def test_env_and_experts_implement_the_protocols(env):
    from srollout.policy.experts import ExpertPolicy, NoisyExpertPolicy

    assert isinstance(env, TextEnv)
    assert isinstance(ExpertPolicy(), Policy) and isinstance(NoisyExpertPolicy(0.2), Policy)


def test_the_set_covers_all_six_task_types(tasks):
    assert {t.task_type for t in tasks} == set(TASK_TYPES)


def test_expert_solves_every_task_type(tasks, env):
    from srollout.policy.experts import ExpertPolicy

    solved = {}
    for i, task in enumerate(tasks):
        won, steps, _ = _play_policy(env, task, ExpertPolicy(), seed=i)
        solved.setdefault(task.task_type, []).append(won)
        # the partially observable expert explores, so it needs at least the planner's steps
        assert steps >= len(task.meta["walkthrough"])
    assert set(solved) == set(TASK_TYPES)
    assert all(all(v) for v in solved.values()), solved


def test_stored_walkthrough_wins_with_reward_one_on_the_last_step(tasks, env):
    for task in tasks:
        obs, info = env.reset(task, 0)
        assert f"Your task is to: {task.task_text}" in obs
        assert not obs.startswith("-=")  # the TextWorld banner is stripped
        walk = task.meta["walkthrough"]
        for j, a in enumerate(walk):
            r = env.step(a)
            assert r.valid
            assert r.done == (j == len(walk) - 1)
            assert r.reward == (1.0 if j == len(walk) - 1 else 0.0)


def test_invalid_action_is_a_noop_that_counts(tasks, env):
    task = tasks[0]
    _, info = env.reset(task, 0)
    first = info.expert_plan[0]
    assert first.startswith("go to ")
    r1 = env.step(first)
    before = r1.admissible
    # "go to" where it stands is not an action in ALFWorld: the classic small-model mistake
    for bad in (first, "fly to the moon", ""):
        r = env.step(bad)
        assert (r.observation, r.valid, r.reward, r.done) == ("Nothing happens.", False, 0.0, False)
        assert r.admissible == before  # the state did not change
    assert env.n_steps == 4  # the three invalid actions counted as steps
    # and the game is still winnable from the unchanged state
    for a in r.expert_plan:
        r = env.step(a)
    assert r.done and r.reward == 1.0


def test_actions_are_normalised_before_the_engine_sees_them(tasks, env):
    from srollout.envs.prompts import normalize_action

    task = next(t for t in tasks if t.task_type == "pick_and_place_simple")
    env.reset(task, 0)
    walk = task.meta["walkthrough"]
    for a in walk[:-1]:
        assert env.step(a.upper() + ".").valid
    obj, rec = walk[-1][len("move ") :].split(" to ")
    put = f"Put the {obj} in/on {rec}"
    assert normalize_action(put) == walk[-1]
    r = env.step(put)
    assert r.valid and r.done


def test_same_seed_same_observations(tasks):
    from srollout.envs.alfworld_env import AlfworldEnv

    def run(task):
        rng = random.Random(7)
        e = AlfworldEnv()
        obs, info = e.reset(task, 3)
        out = [obs]
        for _ in range(12):
            a = rng.choice(info.admissible) if rng.random() < 0.5 else info.expert_plan[0]
            info = e.step(a)
            out.append((a, info.observation, info.admissible, info.expert_plan))
            if info.done:
                break
        e.close()
        return out

    for task in tasks[:4]:
        assert run(task) == run(task)


def test_group_members_share_the_parse_but_not_the_state(tasks):
    from srollout.envs import alfworld_env as aw

    task = next(t for t in tasks if t.task_type == "pick_heat_then_place_in_recep")
    envs, resets = aw.make_group(task, 8, seed=0)
    try:
        assert len({obs for obs, _ in resets}) == 1
        shared = {id(e._env.unwrapped._shared) for e in envs}
        assert len(shared) == 1  # one parsed game for the whole group
        walk = task.meta["walkthrough"]
        # env 0 plays the task to the end; env 1 stays at the start
        for a in walk:
            r0 = envs[0].step(a)
        assert r0.done
        r1 = envs[1].step(walk[0])
        assert r1.valid and not r1.done
        # env 1 sees exactly what a fresh, unshared env sees after the same first action
        fresh = aw.AlfworldEnv()
        fresh.reset(task, 0)
        rf = fresh.step(walk[0])
        fresh.close()
        assert (r1.observation, r1.admissible, r1.expert_plan) == (
            rf.observation,
            rf.admissible,
            rf.expert_plan,
        )
    finally:
        for e in envs:
            e.close()


def test_step_is_an_independent_planner_state(tasks):
    from srollout.envs.alfworld_env import make_group

    task = next(t for t in tasks if t.task_type == "pick_two_obj_and_place")
    envs, resets = make_group(task, 2)
    try:
        walk = task.meta["walkthrough"]
        take = next(i for i, a in enumerate(walk) if a.startswith("take "))
        for a in walk[: take + 1]:
            envs[0].step(a)
        for a in walk[:take]:
            envs[1].step(a)
        # env 1 can still take the object env 0 already holds
        assert walk[take] in envs[1].admissible
        assert walk[take] not in envs[0].admissible
    finally:
        for e in envs:
            e.close()


def test_dialogue_equals_textworlds_stock_pddl_env(tasks):
    """Our shared-parse, cached-grammar engine gives the stock engine's exact text."""
    from srollout.envs.alfworld_env import AlfworldEnv, _engine, game_dict, strip_welcome

    eng = _engine()
    infos = eng.textworld.EnvInfos(
        won=True, admissible_commands=True, policy_commands=True, extras=["gamefile"]
    )
    stock = eng.AlfredInfos(eng.AlfredDemangler(eng.PddlEnv(infos)))
    mine = AlfworldEnv()
    rng = random.Random(0)
    for task in tasks[:3]:
        obs, r = mine.reset(task, 0)
        stock.load(game_dict(task))
        st = stock.reset()
        assert obs == strip_welcome(st.feedback)
        assert r.admissible == tuple(st["admissible_commands"])
        assert r.expert_plan == tuple(st["policy_commands"])
        for _ in range(8):
            a = rng.choice(r.admissible)
            r = mine.step(a)
            st, _, _ = stock.step(a)
            assert r.observation == st.feedback.strip()
            assert r.admissible == tuple(st["admissible_commands"])
            assert r.expert_plan == tuple(st["policy_commands"])
            assert r.done == bool(st["won"])
    mine.close()


def test_sys_argv_survives_the_engine(tasks, env):
    before = list(sys.argv)
    env.reset(tasks[1], 0)
    env.step("look")
    assert sys.argv == before


def test_step_before_reset_is_a_clear_error():
    from srollout.envs.alfworld_env import AlfworldEnv
    from srollout.errors import SrolloutError

    with pytest.raises(SrolloutError, match="before reset"):
        AlfworldEnv().step("look")


def test_listed_exploration_checks_receptacles_in_the_rooms_order_and_still_wins(tasks, env):
    import re

    from srollout.errors import SrolloutError
    from srollout.policy.experts import ExpertPolicy

    with pytest.raises(SrolloutError, match="explore must be one of random, listed"):
        ExpertPolicy(explore="alphabetical")
    for i, task in enumerate(tasks[:6]):
        obs, _ = env.reset(task, i)
        listed = re.findall(r"an? ([a-z]+ \d+)", obs.split("Your task is to:")[0])
        won, _, seen = _play_policy(env, task, ExpertPolicy(explore="listed"), seed=i)
        assert won
        # nothing is visible from the middle of the room: the first move is to the first
        # receptacle the description lists ("You arrive at <it>."), whatever the seed
        assert seen[1].startswith(f"You arrive at {listed[0]}."), (listed, seen[1])


def _kind(name):
    return name.rsplit(" ", 1)[0]


def test_greedy_expert_takes_a_needed_object_at_first_sight_and_wins(tasks, env):
    import re

    from srollout.envs.prompts import parse_response, system_prompt, user_turn
    from srollout.policy.experts import ExpertPolicy

    names = re.compile(r"\b([a-z]+ \d+)\b")
    checked = 0
    for i, task in enumerate(tasks):
        needed = {
            _kind(a[5:].split(" from ")[0])
            for a in task.meta["walkthrough"]
            if a.startswith("take ")
        }
        policy = ExpertPolicy(explore="listed", take="greedy")
        obs, info = env.reset(task, i)
        key = TrajKey("g", 0)
        holding, placed, won = "", set(), False
        for step in range(1, 31):
            req = ActRequest(
                key, step, i, system_prompt(), user_turn(obs), info.admissible, info.expert_plan
            )
            action = parse_response(policy.act([req])[0].text).action
            m = re.match(r"You (?:arrive at|open the) ([a-z]+ \d+)\.", obs)
            if m and not holding:
                here = set(names.findall(obs)) - {m.group(1)} - placed
                in_view = sorted(o for o in here if _kind(o) in needed)
                if in_view:  # hands free and a needed kind in view: take it now, not later
                    assert action == f"take {in_view[0]} from {m.group(1)}", (
                        task.task_text,
                        obs,
                        action,
                    )
                    checked += 1
            res = env.step(action)
            assert res.valid, (task.task_text, obs, action)
            if action.startswith("take "):
                holding = action[5:].split(" from ")[0]
            elif action.startswith("move "):
                placed.add(holding)
                holding = ""
            obs, info = res.observation, res
            if res.done:
                won = True
                break
        policy.finish(key)
        assert won, task.task_text
    assert checked >= len(tasks) // 2, checked  # the rule was exercised, not vacuously true


def test_scratchpad_thought_is_what_to_find_and_the_receptacles_left_in_the_rooms_order(tasks, env):
    import re

    from srollout.envs.prompts import parse_response, system_prompt, user_turn
    from srollout.policy.experts import ExpertPolicy

    task = next(t for t in tasks if t.task_type == "pick_and_place_simple")
    obs, info = env.reset(task, 0)
    listed = re.findall(r"an? ([a-z]+ \d+)", obs.split("Your task is to:")[0])
    kind = _kind(task.meta["walkthrough"][1][5:].split(" from ")[0])
    policy = ExpertPolicy(explore="listed", take="greedy", thoughts="scratchpad")
    key = TrajKey("g", 0)
    req = ActRequest(key, 1, 0, system_prompt(), user_turn(obs), info.admissible, info.expert_plan)
    text = policy.act([req])[0].text
    assert (
        text == f"Thought: Find {kind}. Unchecked: {', '.join(listed)}.\nAction: go to {listed[0]}"
    )
    res = env.step(f"go to {listed[0]}")
    req = ActRequest(
        key, 2, 0, system_prompt(), user_turn(res.observation), res.admissible, res.expert_plan
    )
    thought = parse_response(policy.act([req])[0].text).thought
    # the receptacle just reached is no longer listed, whether or not its inside was in view
    assert thought.endswith(f"Unchecked: {', '.join(listed[1:])}.")


def test_played_tells_the_expert_what_another_policy_did(tasks, env):
    import re

    from srollout.envs.prompts import parse_response, system_prompt, user_turn
    from srollout.policy.experts import ExpertPolicy

    task = tasks[0]
    obs, info = env.reset(task, 0)
    listed = re.findall(r"an? ([a-z]+ \d+)", obs.split("Your task is to:")[0])
    policy = ExpertPolicy(explore="listed", take="greedy", thoughts="scratchpad")
    key = TrajKey("g", 0)
    req = ActRequest(key, 1, 0, system_prompt(), user_turn(obs), info.admissible, info.expert_plan)
    assert parse_response(policy.act([req])[0].text).action == f"go to {listed[0]}"
    # another policy went to the last receptacle instead: the expert reads the next observation
    # as the outcome of that move (it now stands there, and the list keeps the first one)
    other = f"go to {listed[-1]}"
    policy.played(key, other, info.admissible)
    res = env.step(other)
    req = ActRequest(
        key, 2, 0, system_prompt(), user_turn(res.observation), res.admissible, res.expert_plan
    )
    thought = parse_response(policy.act([req])[0].text).thought
    assert thought.endswith(f"Unchecked: {', '.join(listed[:-1])}."), thought


def test_greedy_noise_makes_the_mistakes_small_policies_make(tasks, env):
    from srollout.envs.prompts import parse_response, system_prompt, user_turn
    from srollout.policy.experts import NoisyExpertPolicy

    seen_kinds, n_noise = set(), 0
    for i, task in enumerate(tasks[:6]):
        # half the steps noise, every noise step invalid when an invalid candidate applies
        policy = NoisyExpertPolicy(0.5, 1.0, explore="listed", take="greedy", thoughts="scratchpad")
        obs, info = env.reset(task, i)
        recs = {a[6:] for a in info.admissible if a.startswith("go to ")}
        key, at = TrajKey("g", 0), ""
        for step in range(1, 21):
            req = ActRequest(
                key, step, i, system_prompt(), user_turn(obs), info.admissible, info.expert_plan
            )
            action = parse_response(policy.act([req])[0].text).action
            res = env.step(action)
            if policy.was_noise(key):
                n_noise += 1
                assert not res.valid, action  # a "go to" a receptacle the room lacks always applies
                if action == f"go to {at}":
                    seen_kinds.add("go to where it stands")
                elif action.startswith("go to "):
                    assert action[6:] not in recs
                    seen_kinds.add("go to a receptacle the room lacks")
                else:
                    assert action.startswith("take ")
                    seen_kinds.add("take what is not there")
            elif action.startswith("go to "):
                at = action[6:]
            obs, info = res.observation, res
            if res.done:
                break
        policy.finish(key)
    assert n_noise >= 20
    assert seen_kinds == {
        "go to where it stands",
        "go to a receptacle the room lacks",
        "take what is not there",
    }


def test_demonstrations_do_not_depend_on_the_number_of_workers(tasks):
    from srollout.default_policy.demos import generate_demonstrations

    kw = dict(
        episodes_per_task=2,
        noise=(0.1, 0.3),
        invalid_fraction=0.5,
        seed=3,
        progress=False,
        explore="listed",
        take="greedy",
        thoughts="scratchpad",
    )
    one = generate_demonstrations(tasks[:3], **kw)
    two = generate_demonstrations(tasks[:3], **kw, workers=2)
    assert len(one) == 6 and [e.turns for e in one] == [e.turns for e in two]
    assert [e.task_id for e in one] == [t.task_id for t in tasks[:3]] * 2
    # each turn keeps o_t itself: the user turn is it in the default template, the first is the
    # room's description and a turn after an invalid action is "Nothing happens."
    from srollout.envs.prompts import user_turn

    turns = [t for e in one for t in e.turns]
    assert all(t.user == user_turn(t.observation) for t in turns)
    assert all(e.turns[0].observation.startswith("You are in the middle of a room.") for e in one)
    assert sum(not t.valid for t in turns) >= 2  # the noise made some invalid actions
    assert all(
        b.observation == "Nothing happens."
        for e in one
        for a, b in zip(e.turns, e.turns[1:], strict=False)
        if not a.valid
    )


def test_an_expert_plays_the_same_whatever_template_the_prompter_wraps_observations_in(tasks):
    # the engine hands non-LLM policies o_t itself (ActRequest.observation), so an expert driven
    # with a model's prompt (goal and admissible actions in every user turn: a DAgger round)
    # plays as with plain observations. React thoughts show it: "That did not work." follows a
    # "Nothing happens." observation, which a templated turn never equals
    from srollout.envs.alfworld_env import AlfworldEnv
    from srollout.policy.experts import NoisyExpertPolicy
    from srollout.rollout.engine import RolloutSettings, make_specs, run_groups
    from srollout.rollout.react import ReactPrompter

    def responses(template):
        out = {}

        def keep(group):
            out[group.group_id] = [[s["response"] for s in t.steps] for t in group.trajs]

        run_groups(
            make_specs(tasks[:3], 3),
            NoisyExpertPolicy(0.5, 1.0, explore="listed", thoughts="react"),
            lambda: AlfworldEnv(expert_plan=True),
            ReactPrompter(user_template=template),
            RolloutSettings(G=2, T_max=30, seed=3, signal_K=()),
            on_group=keep,
        )
        return out

    plain = responses("Observation: {observation}")
    templated = responses("Observation: {observation}\nTask: {task}.\nActions: {actions}.")
    assert templated == plain
    assert (
        sum(
            r.startswith("Thought: That did not work.")
            for g in plain.values()
            for t in g
            for r in t
        )
        >= 3
    )


def test_the_engine_never_touches_the_global_generators(tasks):
    """AlfworldEnv says ``global_rng = False`` (the rollout engine then spares it the swap of
    each trajectory's generator states): reset and steps, valid and not, with and without the
    planner, leave Python's and NumPy's global generators as they were."""
    import numpy as np

    from srollout.envs.alfworld_env import AlfworldEnv

    assert AlfworldEnv.global_rng is False
    for expert_plan in (True, False):
        env = AlfworldEnv(expert_plan=expert_plan)
        for task in tasks[:2]:
            before = random.getstate(), np.random.get_state()[1].copy()
            _, info = env.reset(task, 7)
            for action in [*list(info.admissible)[:4], "go to nowhere 9"]:
                env.step(action)
            assert random.getstate() == before[0]
            assert (np.random.get_state()[1] == before[1]).all()
        env.close()
