"""The one definition of a complete run (`srollout.rundir.require_complete`) on hand-made tables:
two groups of two trajectories; a run passes only when no gate acted on any trajectory, and the
refusal is one line with the counts and the ungated alternative."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest

from srollout import schemas
from srollout.errors import SrolloutError
from srollout.rundir import require_complete


def _run(tmp_path: Path, ended_by, cut=(False, False), audited=None, **traj_columns) -> Path:
    trajs = pl.DataFrame(
        {
            "group_id": ["g0", "g0", "g1", "g1"],
            "traj_idx": [0, 1, 0, 1],
            "task_id": ["t0", "t0", "t1", "t1"],
            "task_type": ["x"] * 4,
            "seed": [0, 1, 2, 3],
            "reward": [1.0, 0.0, 0.0, 0.0],
            "success": [True, False, False, False],
            "n_steps": [3, 5, 2, 5],
            "ended_by": list(ended_by),
            "n_gen_tokens": [30, 50, 20, 50],
            **traj_columns,
        }
    )
    groups = pl.DataFrame(
        {
            "group_id": ["g0", "g1"],
            "task_id": ["t0", "t1"],
            "task_type": ["x", "x"],
            "G": [2, 2],
            "reward_mean": [0.5, 0.0],
            "reward_var": [0.25, 0.0],
            "label": ["mixed", "all_fail"],
            "zero_var": [False, True],
            "cut": list(cut),
            "cut_step": [3 if c else None for c in cut],
            "arm": ["baseline", "baseline"],
            **({"audited": audited} if audited is not None else {}),
        },
        schema_overrides={"cut_step": pl.Int64},
    )
    schemas.write(trajs, tmp_path / "trajectories.parquet", schemas.TRAJECTORIES)
    schemas.write(groups, tmp_path / "groups.parquet", schemas.GROUPS)
    return tmp_path


def _refusal(run: Path) -> str:
    with pytest.raises(SrolloutError) as err:
        require_complete(run)
    line = str(err.value)
    assert "\n" not in line
    assert "rerun collect without --stall / --gate / --audit" in line and "baseline arm" in line
    return line


def test_an_ungated_run_and_a_shadow_run_are_complete(tmp_path):
    require_complete(_run(tmp_path, ["done", "max_steps", "lost", "max_steps"]))
    # a shadow run records where a gate would have stopped a trajectory; nothing was stopped
    shadow = tmp_path / "shadow"
    shadow.mkdir()
    require_complete(
        _run(
            shadow,
            ["done", "max_steps", "max_steps", "max_steps"],
            shadow_stop_step=[None, 3, 2, None],
        )
    )
    require_complete(tmp_path / "empty")  # no tables: nothing to refuse (the reader names them)


def test_stalled_trajectories_are_counted(tmp_path):
    line = _refusal(_run(tmp_path, ["done", "stalled", "stalled", "max_steps"]))
    assert "a gate stopped or cut 2 of its 4 trajectories (ended_by 'stalled': 2)" in line


def test_every_trajectory_of_a_cut_group_counts_audited_or_not(tmp_path):
    # g1 cut at K=3: its trajectory 0 had ended at step 2 (done), trajectory 1 was cut (gate)
    line = _refusal(_run(tmp_path, ["done", "max_steps", "done", "gate"], cut=(False, True)))
    assert "2 of its 4 trajectories (ended_by 'gate': 1; 1 group(s) cut by a gate)" in line
    # an audited cut ran on to its end, but the run was gated: still refused
    audited = tmp_path / "audited"
    audited.mkdir()
    run = _run(audited, ["done", "max_steps", "done", "max_steps"], (False, True), [False, True])
    assert "2 of its 4 trajectories (1 group(s) cut by a gate, 1 audited)" in _refusal(run)


def test_an_audited_stop_counts(tmp_path):
    run = _run(
        tmp_path, ["done", "max_steps", "done", "max_steps"], audited_stop=[None, 4, None, None]
    )
    assert "1 of its 4 trajectories (audited stops: 1)" in _refusal(run)


def test_a_run_with_groups_only_is_judged_by_its_groups(tmp_path):
    run = _run(tmp_path, ["done", "max_steps", "done", "gate"], cut=(True, False))
    (run / "trajectories.parquet").unlink()
    assert "1 of its 2 groups (1 group(s) cut by a gate)" in _refusal(run)


def _verl_log(out: Path, stalled: bool) -> Path:
    """A verl trainer log as the agent loop writes it: one part per session (group u0 and u1, two
    sessions each, two steps each), merged by merge_log into the four tables. u0's session 0
    wins; u1's session 1 spends its token budget (max_tokens); with ``stalled`` the stall rule
    stops u0's session 1."""
    from srollout.rollout.trainer_log import merge_log, write_session

    for gid in ("u0", "u1"):
        for idx in (0, 1):
            keys = {"group_id": gid, "traj_idx": idx, "task_id": f"t-{gid}", "task_type": "x"}
            won = gid == "u0" and idx == 0
            ended_by = "done" if won else "stalled" if stalled and gid == "u0" else "max_steps"
            ended_by = "max_tokens" if (gid, idx) == ("u1", 1) else ended_by
            steps = pl.DataFrame(
                [
                    {**keys, "step": t, "thought": "", "action": "look", "response": "look",
                     "observation": "room", "valid": True, "reward": float(won and t == 2),
                     "done": won and t == 2, "n_prompt_tokens": 10, "n_gen_tokens": 3,
                     "gen_s": 0.0, "env_s": 0.0, "trainer_step": 1}
                    for t in (1, 2)
                ]
            )  # fmt: skip
            trajs = pl.DataFrame(
                [{**keys, "seed": 0, "reward": float(won), "success": won, "n_steps": 2,
                  "ended_by": ended_by, "n_gen_tokens": 6, "initial_observation": "room",
                  "arm": "gated", "cut": False, "cut_step": None, "shadow_cut_step": None,
                  "trainer_step": 1}],
                schema_overrides={"cut_step": pl.Int64, "shadow_cut_step": pl.Int64},
            )  # fmt: skip
            tables = {"steps": steps, "trajectories": trajs}
            write_session(out, {"stall": 2}, 1, "p1", tables)
    merge_log(out)
    return out


def test_a_trainer_log_is_judged_by_the_same_definition(tmp_path):
    # verl's agent loop with the stall rule on (not in shadow): session 1 of group u0 stopped
    line = _refusal(_verl_log(tmp_path / "stopped", stalled=True))
    assert "a gate stopped or cut 1 of its 4 trajectories (ended_by 'stalled': 1)" in line
    # a session that spent its token budget ended as one cut by T_max does: no gate acted
    require_complete(_verl_log(tmp_path / "ungated", stalled=False))
