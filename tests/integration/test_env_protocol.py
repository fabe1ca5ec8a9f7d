"""The environment protocol with games written the way other libraries write them (games.py):
an episode lost before T_max ends there (``ended_by="lost"``, ``success`` false, its shaped reward
kept), labels come from the environment's outcome, a game that seeds and draws from the global
generators plays the same for the same seed at any concurrency (each trajectory replays alone
through the raw game), and every failure of a game mid-run or at import is one line, exit 2,
the finished groups kept and ``--resume`` continuing. Run as a user runs them: the installed
`srollout` from the directory that holds the module."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import polars as pl
import pytest
from games import outcome
from test_cli_env import srollout

HERE = Path(__file__).resolve().parent
RUN = ["--policy", "noisy-expert", "--eps", "0.3", "--G", "4", "--T-max", "10"]
RUN += ["--signal-K", "2", "--seed", "3"]
FULL = ["trajectory", "reward", "n_steps", "ended_by", "success"]


def collect(env: str, out: Path, *extra: str) -> object:
    return srollout("collect", "--env", env, *RUN, "--out", str(out), *extra, cwd=HERE)


def tables(out: Path) -> tuple[pl.DataFrame, pl.DataFrame, pl.DataFrame]:
    trajs = pl.read_parquet(out / "trajectories.parquet").sort("group_id", "traj_idx")
    steps = pl.read_parquet(out / "steps.parquet").sort("group_id", "traj_idx", "step")
    groups = pl.read_parquet(out / "groups.parquet").sort("group_id")
    return trajs, steps, groups


@pytest.fixture(scope="module")
def minefield(tmp_path_factory):
    out = tmp_path_factory.mktemp("mines") / "c32"
    proc = collect("games:MINEFIELD", out, "--groups", "8", "--concurrency", "32")
    assert proc.returncode == 0, proc.stderr[-2000:]
    return out


def test_a_lost_game_ends_at_its_loss_and_every_trajectory_replays_alone(minefield):
    trajs, steps, groups = tables(minefield)
    assert trajs.height == 32
    assert set(trajs["ended_by"]) <= {"done", "lost", "max_steps"}
    lost = trajs.filter(pl.col("ended_by") == "lost")
    assert lost.height > 0 and not lost["success"].any()
    # a loss keeps its shaped reward: 0.25 a cell crossed, never a success
    assert (lost["reward"] < 1.0).all() and (lost["reward"] > 0).any()
    won = trajs.filter(pl.col("ended_by") == "done")
    assert won["success"].all() and (won["reward"] == 1.0).all()
    # nothing is played after the end: the step that ended a game is its last, and only it
    # says done
    last = steps.group_by("group_id", "traj_idx", maintain_order=True).agg(
        pl.col("done").last(), pl.col("done").sum().alias("n_done")
    )
    ended = trajs["ended_by"] != "max_steps"
    assert last["done"].to_list() == ended.to_list() and (last["n_done"] <= 1).all()
    # each trajectory, replayed alone through the raw game from its env seed, earns the same
    # rewards step by step and ends the same way: its game drew from a stream of its own
    for row in trajs.iter_rows(named=True):
        mine = steps.filter(
            (pl.col("group_id") == row["group_id"]) & (pl.col("traj_idx") == row["traj_idx"])
        )
        rewards, dones, won_flag = outcome(row["env_seed"], mine["action"].to_list())
        assert rewards == mine["reward"].to_list() and dones == mine["done"].to_list()
        assert won_flag == {"done": True, "lost": False, "max_steps": None}[row["ended_by"]]
    # labels: mixed iff the rewards differ; else from the outcome
    for g in groups.iter_rows(named=True):
        members = trajs.filter(pl.col("group_id") == g["group_id"])
        differ = members["reward"].n_unique() > 1
        want = "mixed" if differ else ("all_succeed" if members["success"].all() else "all_fail")
        assert g["label"] == want, g


def test_the_same_seed_plays_the_same_games_at_any_concurrency(minefield, tmp_path):
    out = tmp_path / "c4"
    proc = collect("games:MINEFIELD", out, "--groups", "8", "--concurrency", "4")
    assert proc.returncode == 0, proc.stderr[-2000:]
    a, b = tables(minefield), tables(out)
    cols = ["group_id", "traj_idx", "reward", "n_steps", "ended_by", "success"]
    assert a[0].select(cols).equals(b[0].select(cols))
    cols = ["group_id", "traj_idx", "step", "action", "observation", "reward", "done"]
    assert a[1].select(cols).equals(b[1].select(cols))


def test_the_same_seed_plays_the_same_games_on_two_ray_workers(minefield, tmp_path):
    """Each worker is a process of its own whose global generators the game seeds and draws
    from: the per-trajectory isolation holds there too (same steps as one process)."""
    pytest.importorskip("ray", reason="the `dist` extra (ray) is not installed")
    out = tmp_path / "w2"
    proc = collect("games:MINEFIELD", out, "--groups", "8", "--concurrency", "4", "--workers", "2")
    assert proc.returncode == 0, proc.stderr[-2000:]
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["workers"] == 2 and len(set(manifest["dist"]["worker_processes"])) == 2
    a, b = tables(minefield), tables(out)
    cols = ["group_id", "traj_idx", "step", "action", "observation", "reward", "done"]
    assert a[1].select(cols).equals(b[1].select(cols))
    assert a[0].select(FULL[1:]).equals(b[0].select(FULL[1:]))


def test_a_game_failing_mid_run_is_one_line_keeps_what_finished_and_resumes(
    minefield, tmp_path, monkeypatch
):
    out = tmp_path / "run"
    monkeypatch.setenv("GAMES_FAULTS", "1")
    # one group at a time: groups 0-2 finish before group 3's game fails
    proc = collect("games:RAISES", out, "--groups", "8", "--concurrency", "4")
    assert proc.returncode == 2, proc.stderr[-2000:]
    line = proc.stderr.strip()
    assert len(line.splitlines()) == 1, proc.stderr
    assert (
        "environment Minefield: step('step') raised RuntimeError: the game server went away" in line
    )
    assert "(group g00003 (task eval/003), trajectory " in line and ", step " in line
    assert "the 3 groups finished before it are kept" in line
    assert f"srollout collect --resume --out {out}" in line
    parts = sorted(p.name for p in (out / "parts").iterdir())
    assert [p for p in parts if p.startswith("g0000")] and not any("g00003" in p for p in parts)
    assert json.loads((out / "manifest.json").read_text())["status"] != "complete"
    monkeypatch.delenv("GAMES_FAULTS")
    again = collect("games:RAISES", out, "--groups", "8", "--concurrency", "4", "--resume")
    assert again.returncode == 0, again.stderr[-2000:]
    # the same games as an unbroken run: same task ids and seeds, the fault switched off
    cols = ["group_id", "traj_idx", "reward", "n_steps", "ended_by", "success"]
    assert tables(out)[0].select(cols).equals(tables(minefield)[0].select(cols))


@pytest.mark.parametrize(
    ("env", "faults", "message"),
    [
        ("games:NAN_REWARD", True, "gave the reward nan at group g00003 (task eval/003)"),
        ("games:WON_NOT_DONE", True, "said won=True without done=True at group g00003"),
        ("games:GYM_STEP", True, "must give a srollout.envs.base.StepResult, got a tuple of 5"),
        ("games:LATER_MAKE_FAILS", True, "make_env() raised OSError: out of game licences"),
        ("games:GYM_ALWAYS", False, "step('look') must give a srollout.envs.base.StepResult"),
        ("games:AS_LIST", False, "tasks must be {split: [Task, ...]} or a function"),
        ("games:TASK_FN_RAISES", False, "its task function raised KeyError: 'train'"),
    ],
)
def test_what_a_game_does_wrong_is_one_line(env, faults, message, tmp_path, monkeypatch):
    if faults:
        monkeypatch.setenv("GAMES_FAULTS", "1")
    out = tmp_path / "run"
    extra = ["--tasks", "train"] if env == "games:TASK_FN_RAISES" else []
    proc = collect(env, out, "--groups", "6", "--concurrency", "4", *extra)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert message in proc.stderr, proc.stderr
    if not faults:  # refused before the run: nothing written
        assert not out.exists()


@pytest.mark.parametrize(
    ("source", "message"),
    [
        ("def broken(:\n", "importing 'brokenenv' raised SyntaxError (brokenenv.py, line 1)"),
        ("raise LookupError('no codec')\n", "importing 'brokenenv' raised LookupError: no codec"),
    ],
)
def test_an_env_module_that_fails_to_import_is_one_line(source, message, tmp_path):
    (tmp_path / "brokenenv.py").write_text(textwrap.dedent(source))
    out = tmp_path / "run"
    proc = srollout("collect", "--env", "brokenenv:SPEC", *RUN, "--out", str(out), cwd=tmp_path)
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert message in proc.stderr and not out.exists()
