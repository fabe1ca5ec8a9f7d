"""`sweep --stall`'s reader on hand-made tables: every step's reward, tokens and novelty land in
place (not the trajectory's totals repeated), with or without the recorded steps_since_new; its
grids checked against T_max."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest

from srollout.config import StallFitConfig
from srollout.errors import ArgumentError
from srollout.stages.sweep_stall import _grids, load_trajectories


def _write(tmp_path, since_new: bool):
    obs = ["at desk", "at desk", "at shelf", "won"]
    steps = pl.DataFrame(
        {
            "group_id": ["g1", "g1", "g1", "g0", "g0"],
            "traj_idx": [0, 0, 0, 0, 1],
            "task_id": ["t"] * 5,
            "task_type": ["x"] * 5,
            "step": [1, 2, 3, 1, 1],
            "observation": obs[:3] + ["room", "won"],
            "valid": [True] * 5,
            "reward": [0.0, 0.0, 1.0, 0.0, 1.0],
            "done": [False, False, True, False, True],
            "n_gen_tokens": [5, 7, 11, 13, 17],
        }
    )
    if since_new:
        steps = steps.with_columns(steps_since_new=pl.Series([0, 1, 0, 1, 0]))
    trajs = pl.DataFrame(
        {
            "group_id": ["g0", "g0", "g1"],
            "traj_idx": [0, 1, 0],
            "success": [False, True, True],
            "reward": [0.0, 1.0, 1.0],
            "n_steps": [1, 1, 3],
            "ended_by": ["max_steps", "done", "done"],
            "n_gen_tokens": [13, 17, 23],
            "initial_observation": ["room", "room", "room"],
        }
    )
    steps.write_parquet(tmp_path / "steps.parquet")
    trajs.write_parquet(tmp_path / "trajectories.parquet")


def test_each_step_lands_in_place(tmp_path):
    for recorded in (True, False):
        _write(tmp_path, recorded)
        t = load_trajectories(tmp_path)
        assert t.group.tolist() == [0, 0, 1] and t.n_steps.tolist() == [1, 1, 3]
        assert t.success.tolist() == [False, True, True]
        assert t.step_reward.tolist() == [[0, 0, 0], [1, 0, 0], [0, 0, 1]]
        assert t.step_tokens.tolist() == [[13, 0, 0], [17, 0, 0], [5, 7, 11]]
        # g0/0 went back to the room it started in: 1 step without news; g1/0: desk, desk, shelf
        assert np.array_equal(t.since_new, [[1, -1, -1], [0, -1, -1], [0, 1, 0]])


def test_the_grids_are_checked_against_T_max():
    # the default grids: k0 beyond T_max dropped, W kept (a W beyond it only never fires)
    Ws, froms = _grids(StallFitConfig(stall=True), 6)
    assert Ws == StallFitConfig().stall_W_grid and froms == (1, 5)
    with pytest.raises(ArgumentError, match=r"^stall_W_grid=13 is larger than T_max=12: "):
        _grids(StallFitConfig(stall=True, stall_W_grid=(4, 13)), 12)
    with pytest.raises(ArgumentError, match=r"^stall_from_grid=13 is larger than T_max=12: "):
        _grids(StallFitConfig(stall=True, stall_from_grid=(5, 13)), 12)
    assert _grids(StallFitConfig(stall=True, stall_W_grid=(2, 12)), 12)[0] == (2, 12)
