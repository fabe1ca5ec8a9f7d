"""Generated task sets (mix, determinism, disjointness, cache), the official-data loader, and
the demonstrations of the noisy expert."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from srollout.envs.base import TASK_TYPES
from srollout.errors import SrolloutError

pytest.importorskip("alfworld")


@pytest.fixture()
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("SROLLOUT_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def test_type_counts_follow_the_paper_mix():
    from srollout.envs.tasks import type_counts

    c = type_counts(100)
    assert [
        c[t]
        for t in (
            "pick_and_place_simple",
            "pick_two_obj_and_place",
            "pick_clean_then_place_in_recep",
            "pick_heat_then_place_in_recep",
            "pick_cool_then_place_in_recep",
            "look_at_obj_in_light",
        )
    ] == [24, 20, 18, 11, 19, 8]
    # n=12: floors 2,2,2,1,2,0 (=9); the 3 largest remainders are look .96, simple .88, two .40
    c12 = type_counts(12)
    assert (
        c12["look_at_obj_in_light"],
        c12["pick_and_place_simple"],
        c12["pick_two_obj_and_place"],
        c12["pick_clean_then_place_in_recep"],
        c12["pick_heat_then_place_in_recep"],
        c12["pick_cool_then_place_in_recep"],
    ) == (1, 3, 3, 2, 1, 2)
    for n in (1, 7, 33, 1000):
        assert sum(type_counts(n).values()) == n


def test_generation_is_deterministic_and_seed_dependent():
    from srollout.envs.gen import DIFFICULTIES, generate_game

    d = DIFFICULTIES["small"]
    for tt in TASK_TYPES:
        a, b = generate_game(tt, 5, d), generate_game(tt, 5, d)
        assert a == b
        assert generate_game(tt, 6, d).pddl_problem != a.pddl_problem


def test_difficulty_knob_sets_room_size_and_distractors():
    from srollout.envs.gen import Difficulty, generate_game

    def declared(spec, kind):
        block = spec.pddl_problem.split("(:objects", 1)[1].split(")", 1)[0]
        return sum(1 for ln in block.splitlines() if ln.strip().endswith(f" - {kind}"))

    def n_receptacles(spec):
        return declared(spec, "receptacle")

    def n_objects(spec):
        return declared(spec, "object")

    small = [generate_game("pick_and_place_simple", s, Difficulty(4, 0)) for s in range(10)]
    big = [generate_game("pick_and_place_simple", s, Difficulty(0, 12)) for s in range(10)]
    # required receptacles are kept, so a 4-receptacle room may grow by one
    assert all(n_receptacles(g) <= 5 for g in small)
    assert all(n_objects(g) == 1 for g in small)  # only the task's object
    assert min(n_receptacles(g) for g in big) > 5
    assert all(n_objects(g) > 1 for g in big)


def test_task_sets_are_cached_deterministic_and_disjoint(home, tmp_path, monkeypatch):
    from srollout.envs.gen import seen_floorplans
    from srollout.envs.tasks import load_task_set

    train = load_task_set("train", n=20, progress=False)
    eval_ = load_task_set("eval", n=10, progress=False)
    held = load_task_set("heldout", n=6, progress=False)
    problems = [{t.meta["pddl_problem"] for t in s} for s in (train, eval_, held)]
    assert not (problems[0] & problems[1]) and not (problems[0] & problems[2])
    assert not (problems[1] & problems[2])
    assert len(problems[0]) == 20  # no duplicates inside a set
    seen = {fp for tt in TASK_TYPES for fp in seen_floorplans(tt)}
    assert all(t.meta["floorplan"] not in seen for t in held)  # unseen scenes only
    assert len({t.task_id for t in train}) == 20
    assert all(t.task_id.startswith("train/") for t in train)

    # cached: a second call reads the files; the same set regenerated elsewhere is identical
    files = sorted(p.name for p in (home / "games").rglob("*.jsonl"))
    assert files and load_task_set("eval", n=10, progress=False) == eval_
    monkeypatch.setenv("SROLLOUT_HOME", str(tmp_path / "other-home"))
    again = load_task_set("eval", n=10, progress=False)
    assert [t.meta["pddl_problem"] for t in again] == [t.meta["pddl_problem"] for t in eval_]
    # a prefix of a bigger set is the same games (ids are per type)
    bigger = {t.task_id: t for t in load_task_set("eval", n=14, progress=False)}
    assert all(bigger[t.task_id].meta["pddl_problem"] == t.meta["pddl_problem"] for t in eval_)


def test_game_generation_reports_progress_and_only_what_is_missing(home, capsys):
    from srollout.envs.tasks import load_task_set

    calls: list[tuple[int, int]] = []
    load_task_set("eval", n=6, progress=lambda done, total: calls.append((done, total)))
    assert calls == [(0, 6), (1, 6), (2, 6), (3, 6), (4, 6), (5, 6), (6, 6)]
    calls.clear()
    load_task_set("eval", n=6, progress=lambda done, total: calls.append((done, total)))
    assert calls == []  # all cached: nothing to report
    # 8 tasks = 2 more games; off a terminal (pytest captures stdout) progress=True is the stages'
    # bar: a plain line at the first game (then at most every 30 s) and one when it is done
    load_task_set("eval", n=8)
    out = capsys.readouterr().out
    assert "generating eval games (r6-d3): 1/2 games" in out, out
    assert "generating eval games (r6-d3): 2/2 games" in out, out


def test_unknown_names_are_clear_errors(home):
    from srollout.envs.tasks import load_task_set

    with pytest.raises(SrolloutError, match="unknown task set"):
        load_task_set("valid_sen")
    with pytest.raises(SrolloutError, match="unknown difficulty"):
        load_task_set("eval", difficulty="huge", n=1)


def test_official_split_without_data_says_how_to_get_it(home, tmp_path, monkeypatch):
    from srollout.envs.tasks import load_task_set

    monkeypatch.setenv("ALFWORLD_DATA", str(tmp_path / "nothing-here"))
    with pytest.raises(SrolloutError, match="alfworld-download"):
        load_task_set("valid_seen")


def test_official_games_load_and_play(home, tmp_path, monkeypatch):
    """A directory laid out like the official data (json_2.1.1/<split>/<task>/<trial>/)."""
    from srollout.envs.alfworld_env import AlfworldEnv
    from srollout.envs.tasks import load_task_set, write_game_file

    tasks = load_task_set("eval", n=2, progress=False)
    root = tmp_path / "alfworld"
    for i, task in enumerate(tasks):
        trial = root / "json_2.1.1" / "valid_seen" / f"{task.task_type}-x-{i}" / "trial_T0"
        path = write_game_file(task, trial / "game.tw-pddl")
        if i == 1:  # an older game file: goal left as "UNKNOWN GOAL", text from traj_data
            data = json.loads(path.read_text())
            data["grammar"] = data["grammar"].replace(task.task_text.rstrip("."), "UNKNOWN GOAL")
            path.write_text(json.dumps(data))
        p = {
            "object_target": "Apple",
            "parent_target": "Fridge",
            "toggle_target": "",
            "mrecep_target": "",
            "object_sliced": False,
        }
        (trial / "traj_data.json").write_text(
            json.dumps({"task_type": task.task_type, "pddl_params": p})
        )
    monkeypatch.setenv("ALFWORLD_DATA", str(root))
    official = load_task_set("valid_seen")
    assert len(official) == 2
    assert official[0].task_text == tasks[0].task_text
    assert "apple" in official[1].task_text
    env = AlfworldEnv()
    for task in official:
        obs, info = env.reset(task, 0)
        assert f"Your task is to: {task.task_text}" in obs
        for a in info.expert_plan:
            r = env.step(a)
        assert r.done
    env.close()


def test_noisy_demonstrations_contain_recoveries_and_are_reproducible(home):
    from srollout.default_policy.demos import generate_demonstrations
    from srollout.envs.tasks import load_task_set

    tasks = load_task_set("eval", n=6, progress=False)
    demos = generate_demonstrations(
        tasks, 12, eps=(0.0, 0.5), seed=3, invalid_frac=0.5, progress=False
    )
    assert demos == generate_demonstrations(
        tasks, 12, eps=(0.0, 0.5), seed=3, invalid_frac=0.5, progress=False
    )
    clean, noisy = demos[:6], demos[6:]
    assert all(e.eps == 0.0 and e.success for e in clean)
    assert not any(t.is_noise or not t.valid for e in clean for t in e.turns)
    assert all(e.eps == 0.5 for e in noisy)
    assert sum(e.success for e in noisy) >= 5
    turns = [t for e in noisy for t in e.turns]
    assert any(t.is_noise for t in turns)
    # an invalid noise action is answered "Nothing happens." and followed by a non-noise turn
    pairs = [
        (a, b) for e in noisy for a, b in zip(e.turns, e.turns[1:], strict=False) if not a.valid
    ]
    assert pairs and all(b.user == "Observation: Nothing happens." for _, b in pairs)
    assert all(a.is_noise for a, _ in pairs)  # only noise is ever invalid
    # every assistant turn is ReAct text that parses
    assert all(t.assistant.startswith("Thought: ") and "\nAction: " in t.assistant for t in turns)
    # the builder's spelling of the same call
    alias = generate_demonstrations(
        tasks, episodes_per_task=2, noise=(0.0, 0.5), seed=3, invalid_fraction=0.5, progress=False
    )
    assert [e.steps for e in alias] == [e.turns for e in demos]
    assert Counter(e.task_type for e in demos) == Counter(2 * [t.task_type for t in tasks])
