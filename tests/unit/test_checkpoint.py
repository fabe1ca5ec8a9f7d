"""srollout.training.checkpoint: an arm's state survives a save and load exactly, a failed save
keeps the last good checkpoint, and the RNG states make a resumed run draw what the first did."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from srollout.errors import SrolloutError
from srollout.training.checkpoint import (
    STATE_FILE,
    ArmState,
    load_state,
    restore_rng,
    rng_states,
    save_state,
)


def _state(iteration: int) -> ArmState:
    weight = torch.arange(6, dtype=torch.float32).reshape(2, 3) * iteration
    return ArmState(
        iteration=iteration,
        adapter={"lora_A.weight": weight},
        optimizer={
            "state": {0: {"step": torch.tensor(float(iteration))}},
            "param_groups": [{"lr": 1e-4}],
        },
        rng=rng_states(),
        metrics=[{"iteration": i, "train/loss": 0.5 / i} for i in range(1, iteration + 1)],
        evals=[{"iteration": 0, "eval/success": 0.25}],
        complete=iteration == 3,
    )


def _draws() -> tuple[float, float, list[float]]:
    return random.random(), float(np.random.rand()), torch.rand(3).tolist()


def test_an_arm_without_a_checkpoint_has_none(tmp_path):
    assert load_state(tmp_path / "seed0-baseline") is None


def test_save_then_load_gives_the_same_state_and_the_next_save_replaces_it(tmp_path):
    arm = tmp_path / "checkpoints" / "seed0-gated"  # made by save_state
    path = save_state(arm, _state(2))
    assert path == arm / STATE_FILE
    got = load_state(arm)
    assert got.iteration == 2 and got.complete is False
    assert torch.equal(got.adapter["lora_A.weight"], torch.tensor([[0.0, 2, 4], [6, 8, 10]]))
    assert got.optimizer["state"][0]["step"].item() == 2.0
    assert got.optimizer["param_groups"] == [{"lr": 1e-4}]
    assert got.metrics == [
        {"iteration": 1, "train/loss": 0.5},
        {"iteration": 2, "train/loss": 0.25},
    ]
    assert got.evals == [{"iteration": 0, "eval/success": 0.25}]
    save_state(arm, _state(3))
    got = load_state(arm)
    assert (got.iteration, got.complete, len(got.metrics)) == (3, True, 3)
    assert sorted(p.name for p in arm.iterdir()) == [STATE_FILE]  # no temp file left


def test_a_save_that_fails_keeps_the_last_good_checkpoint(tmp_path):
    arm = tmp_path / "arm"
    save_state(arm, _state(1))
    broken = _state(2)
    broken.metrics.append({"callback": lambda: None})  # cannot be pickled
    with pytest.raises(Exception, match="lambda|pickle"):
        save_state(arm, broken)
    assert load_state(arm).iteration == 1
    assert sorted(p.name for p in arm.iterdir()) == [STATE_FILE]


def test_a_damaged_checkpoint_is_one_line_naming_the_file_and_the_fix(tmp_path):
    arm = tmp_path / "arm"
    save_state(arm, _state(1))
    path = arm / STATE_FILE
    path.write_bytes(path.read_bytes()[:100])  # a truncated file
    with pytest.raises(SrolloutError) as caught:
        load_state(arm)
    message = str(caught.value)
    assert message.startswith(f"{path}: unreadable checkpoint (")
    assert message.endswith("); rerun with --overwrite") and "\n" not in message


def test_restored_rng_states_repeat_the_python_numpy_and_torch_draws(tmp_path):
    random.seed(1)
    np.random.seed(1)
    torch.manual_seed(1)
    _draws()  # the states to save are mid-stream, not fresh seeds
    state = _state(1)
    first = _draws()
    save_state(tmp_path, state)
    _draws()  # the process moves on (or dies) ...
    restore_rng(load_state(tmp_path).rng)
    assert _draws() == first  # ... and a resumed one draws the same numbers again
