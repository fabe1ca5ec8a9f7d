"""GEM and TextArena out of the box (srollout.envs.libraries), on their real games: scripted
players that bisect Guess the Number in each library's own syntax (``\\boxed{7}``, ``[7]``),
lose it in each library's ways, and play GEM's Minesweeper, whose mines come from the global
generator at the first reveal. Every trajectory is replayed through the raw game alone and must
earn the same rewards and end the same way; a group plays one board; a board is the same at any
concurrency. The CLI plays each library by name on tiny settings with the shipped model."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest

from srollout.policy.base import ActResponse
from srollout.rollout.engine import GroupSpec, RolloutSettings, run_groups
from srollout.rollout.react import EnvPrompter


def _need(module: str):
    """The library, or a skip outside CI (CI installs both: `make setup-games`)."""
    if os.environ.get("CI"):
        return __import__(module)
    return pytest.importorskip(module)


class Bisect:
    """Trajectory 0 bisects from the middle, 2 from the top; 1 answers without the game's
    syntax; 3 repeats the lowest number of the range. ``fmt`` writes a guess in the game's
    syntax."""

    name = "bisect"

    def __init__(self, fmt: str, hint: re.Pattern[str]) -> None:
        self.fmt, self.hint, self.state, self.floor = fmt, hint, {}, {}
        self.first_observations: dict[str, set[str]] = {}

    def act(self, requests):
        out = []
        for r in requests:
            key = (r.key.group_id, r.key.traj_idx)
            if r.step == 1:
                lo, hi = map(int, re.search(r"between (\d+) and (\d+)", r.observation).groups())
                self.state[key] = [lo, hi, None]
                self.floor[key] = lo
                self.first_observations.setdefault(r.key.group_id, set()).add(r.observation)
            lo, hi, last = self.state[key]
            m = self.hint.search(r.observation) if last is not None else None
            if m and m.group(1) == "higher":
                lo = last + 1
            elif m:
                hi = last - 1
            i = r.key.traj_idx
            first = self.floor[key]
            guess = {
                0: (lo + hi) // 2,
                2: hi if last is None else (lo + hi + 1) // 2,
                3: first,
            }.get(i)
            self.state[key] = [lo, hi, guess]
            text = (
                "Thought: I pass.\nAction: pass"
                if guess is None
                else (f"Thought: between {lo} and {hi}.\nAction: {self.fmt.format(guess)}")
            )
            out.append(ActResponse(text, 5, 3))
        return out

    def finish(self, key):
        return None


def _roll(spec, policy, n_groups=2, G=4, T_max=12, concurrency=8):
    records = []
    settings = RolloutSettings(G=G, T_max=T_max, seed=11, concurrency=concurrency, signal_K=(2,))
    tasks = spec.task_set("eval")
    run_groups(
        [GroupSpec(i, tasks[i]) for i in range(n_groups)],
        policy,
        spec.env_factory(),
        EnvPrompter.for_env(spec, None),
        settings,
        on_group=records.append,
    )
    return sorted(records, key=lambda r: r.spec.index)


def test_gem_guess_the_number_wins_and_loses_as_the_raw_game_does():
    gem = _need("gem")
    from srollout.envs.libraries import gem_env

    game = "game:GuessTheNumber-v0-easy"
    spec = gem_env(game)
    player = Bisect("I guess \\boxed{{{}}}", re.compile(r"target number is (higher|lower)"))
    records = _roll(spec, player)
    for r in records:
        assert len(player.first_observations[r.group_id]) == 1  # one board for the group
        t = {x.traj_idx: x for x in r.trajs}
        assert (t[0].ended_by, t[0].success, t[0].reward) == ("done", True, 1.0)
        assert (t[2].ended_by, t[2].success, t[2].reward) == ("done", True, 1.0)
        # no \boxed{}: GEM ends the game at once with its format penalty; a loss
        assert (t[1].ended_by, t[1].success, t[1].reward, len(t[1].steps)) == (
            "lost",
            False,
            -0.1,
            1,
        )
        assert t[3].ended_by == "lost" and not t[3].success  # out of turns: shaped, lost
        # the signals compare the game's own action: the last \boxed{} of the response
        assert t[0].actions[0].startswith("\\boxed{") and t[1].actions == ["action: pass"]
        for x in r.trajs:  # replayed alone through the raw game, from the group's puzzle seed
            env = gem.make(game)
            env.reset(seed=r.spec.task.meta["seed"])
            for row in x.steps:
                obs, reward, term, trunc, _ = env.step(row["response"])
                assert (reward, bool(term or trunc)) == (row["reward"], row["done"])
            assert x.success == ("Congratulations!" in obs)


def test_textarena_guess_the_number_wins_and_loses_as_the_raw_game_does():
    ta = _need("textarena")
    from srollout.envs.libraries import textarena_env

    spec = textarena_env("GuessTheNumber-v0")
    player = Bisect("[{}]", re.compile(r"target number is (higher|lower)"))
    for r in _roll(spec, player):
        assert len(player.first_observations[r.group_id]) == 1
        t = {x.traj_idx: x for x in r.trajs}
        assert (t[0].ended_by, t[0].success, t[0].reward) == ("done", True, 1.0)
        # two answers without [n]: the first a warning, the second ends it, lost with
        # TextArena's completion share (0: no guess made)
        assert (t[1].ended_by, t[1].success, len(t[1].steps)) == ("lost", False, 2)
        assert "attempted an invalid move" in t[1].steps[0]["observation"]
        # an observation holds only the new text: never the echo of the player's own move
        assert all(s["observation"] != s["response"] for x in r.trajs for s in x.steps)
        for x in r.trajs:
            env = ta.make("GuessTheNumber-v0-raw")
            env.reset(num_players=1, seed=r.spec.task.meta["seed"])
            for row in x.steps:
                done, _ = env.step(row["response"])
                assert done == row["done"]
            if done:
                rewards, _ = env.close()
                assert rewards[0] == x.reward and x.success == (rewards[0] >= 1.0)


class Reveal:
    """Reveals the cells of a fixed walk; GEM places the mines at the first reveal."""

    name = "reveal"
    WALK = [(2, 2), (0, 0), (4, 4), (0, 4), (4, 0), (1, 3), (3, 1), (2, 0)]

    def act(self, requests):
        out = []
        for r in requests:
            row, col = self.WALK[(r.step - 1 + r.key.traj_idx) % len(self.WALK)]
            out.append(ActResponse(f"Action: \\boxed{{reveal {row} {col}}}", 4, 2))
        return out

    def finish(self, key):
        return None


def test_gem_minesweeper_plays_the_same_board_at_any_concurrency():
    gem = _need("gem")
    from srollout.envs.libraries import gem_env

    game = "game:Minesweeper-v0-easy"
    spec = gem_env(game)

    def outcomes(concurrency):
        records = _roll(spec, Reveal(), n_groups=3, T_max=8, concurrency=concurrency)
        return [
            [(x.reward, x.ended_by, [s["observation"] for s in x.steps]) for x in r.trajs]
            for r in records
        ], records

    narrow, records = outcomes(4)
    wide, _ = outcomes(12)
    assert narrow == wide
    for r in records:
        for x in r.trajs:  # and each is the raw game played alone
            env = gem.make(game)
            env.reset(seed=r.spec.task.meta["seed"])
            rewards = [env.step(row["response"])[1] for row in x.steps]
            assert rewards == [row["reward"] for row in x.steps]


@pytest.mark.parametrize("env", ["gem:game:GuessTheNumber-v0-easy", "textarena:GuessTheNumber-v0"])
def test_collect_plays_each_library_by_name(env, tmp_path):
    _need(env.split(":")[0])
    out = tmp_path / "run"
    proc = subprocess.run(
        [str(Path(sys.executable).with_name("srollout")), "collect", "--env", env, "--groups",
         "1", "--G", "2", "--T-max", "2", "--signal-K", "1", "--out", str(out)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    trajs = pl.read_parquet(out / "trajectories.parquet")
    assert trajs.height == 2 and set(trajs["ended_by"]) <= {"done", "lost", "max_steps"}
    assert (trajs["ended_by"] == "lost").sum() == (
        ~trajs["success"] & (trajs["ended_by"] != "max_steps")
    ).sum()
