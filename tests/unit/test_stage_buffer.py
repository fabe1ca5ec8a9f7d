"""srollout.stages.buffer: rebuilding trajectories/groups from steps, the step counts behind the
measured savings, signals tables made by others, G=8 sub-samples."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import polars as pl
import pytest

from srollout import schemas
from srollout.errors import SrolloutError
from srollout.stages.buffer import (
    INITIAL_OBSERVATION,
    load_buffer,
    subsample_trajectories,
    trajectories_from_steps,
)


def test_observations_acted_on_are_shifted_by_one_step(steps_table) -> None:
    steps = steps_table({"g": ("t", [(["a1", "a2", "a3"], 1.0), (["b1"], 0.0)])})
    trajs = trajectories_from_steps(steps, Path("steps.parquet"))
    first = trajs.row(0, named=True)
    # o_1 is the initial observation; o_t is the environment's answer to a_{t-1}
    assert first["observations"] == [INITIAL_OBSERVATION, "obs:a1", "obs:a2"]
    assert first["actions"] == ["a1", "a2", "a3"]
    assert (first["n_steps"], first["reward"]) == (3, 1.0)
    assert trajs.row(1, named=True)["observations"] == [INITIAL_OBSERVATION]


def test_trajectory_reward_is_the_sum_of_step_rewards(steps_table) -> None:
    steps = steps_table({"g": ("t", [(["a", "b"], 1.0), (["a", "b"], 0.0)])})
    steps = steps.with_columns(
        pl.when(pl.col("step") == 1).then(0.5).otherwise(pl.col("reward")).alias("reward")
    )
    trajs = trajectories_from_steps(steps, Path("s"))
    assert trajs["reward"].to_list() == [1.5, 0.5]


def test_hand_buffer_groups_and_remaining_steps(hand_buffer: Path) -> None:
    buffer = load_buffer(hand_buffer, [4], default_K=(10,))
    assert buffer.kind == "steps" and buffer.computed and buffer.Ks == (4,)
    at = buffer.at_K(4)
    assert at["group_id"].to_list() == ["a", "b", "c", "d"]
    assert at["G"].to_list() == [4, 4, 4, 4]
    assert at["reward_var"].to_list() == pytest.approx([0.0, 0.1875, 0.0, 0.25])
    assert at["label"].to_list() == ["all_succeed", "mixed", "all_fail", "mixed"]
    assert at["zero_var"].to_list() == [True, False, True, False]
    # Σ_i max(n_i − 4, 0): a ended at 3 (saves nothing), b 4×4, c 4×2, d 6+6+1+0
    assert at["remaining_steps"].to_list() == [0, 16, 8, 13]
    assert at["total_steps"].to_list() == [12, 32, 24, 29]
    assert at["prefix_edit_distance_mean"].to_list() == pytest.approx([0.0, 0.0, 0.125, 1.0])
    adv = buffer.advantages()
    assert np.allclose(adv[0], 0.0) and np.allclose(adv[2], 0.0)
    assert adv[1] == pytest.approx(
        [3 / np.sqrt(3), -1 / np.sqrt(3), -1 / np.sqrt(3), -1 / np.sqrt(3)], rel=1e-5
    )


def test_default_K_and_K_outside_the_data(hand_buffer: Path) -> None:
    assert load_buffer(hand_buffer, None, default_K=(2, 5)).Ks == (2, 5)
    assert load_buffer(hand_buffer, None, default_K=(5, 10, 15, 20)).Ks == (
        5,
        10,
    )  # longest: 10 steps
    with pytest.raises(SrolloutError, match="fewer than every default K"):
        load_buffer(hand_buffer, None, default_K=(15, 20))
    with pytest.raises(
        SrolloutError, match="--K 11 is outside the data: the longest trajectory .* has 10 steps"
    ):
        load_buffer(hand_buffer, [4, 11], default_K=(10,))


def test_a_table_mixing_arms_is_refused(hand_buffer: Path, tmp_path: Path) -> None:
    steps = pl.read_parquet(hand_buffer / "steps.parquet")
    steps = steps.with_columns(
        pl.when(pl.col("group_id") == "a")
        .then(pl.lit("gated"))
        .otherwise(pl.lit("baseline"))
        .alias("arm")
    )
    steps.write_parquet(tmp_path / "steps.parquet")
    with pytest.raises(SrolloutError, match=r"several arms \(baseline, gated\)"):
        load_buffer(tmp_path / "steps.parquet", [4], default_K=(4,))


def test_signals_table_with_trajectories_gets_rewards_and_step_counts(
    hand_buffer: Path, tmp_path: Path
) -> None:
    from_steps = load_buffer(hand_buffer, [4], default_K=(4,))
    run = tmp_path / "run"
    schemas.write(from_steps.signals, run / "signals.parquet", schemas.SIGNALS)
    trajs = from_steps.trajectories.select(
        "group_id",
        "traj_idx",
        pl.lit("t").alias("task_id"),
        "task_type",
        pl.lit(0).alias("seed"),
        "reward",
        (pl.col("reward") > 0).alias("success"),
        "n_steps",
        pl.lit("done").alias("ended_by"),
        pl.lit(0).alias("n_gen_tokens"),
    )
    schemas.write(trajs, run / "trajectories.parquet", schemas.TRAJECTORIES)
    buffer = load_buffer(run, None, default_K=(10,))
    assert buffer.kind == "signals" and not buffer.computed and buffer.Ks == (4,)
    assert buffer.has_step_counts and buffer.has_rewards
    assert buffer.at_K(4)["remaining_steps"].to_list() == [0, 16, 8, 13]

    schemas.write(
        trajs.with_columns(pl.lit(1.0).alias("reward")),
        run / "trajectories.parquet",
        schemas.TRAJECTORIES,
    )
    with pytest.raises(SrolloutError, match="rewards disagree with reward_var"):
        load_buffer(run, None, default_K=(10,))
    schemas.write(
        trajs.with_columns(pl.lit("gate").alias("ended_by")),
        run / "trajectories.parquet",
        schemas.TRAJECTORIES,
    )
    with pytest.raises(SrolloutError, match="ended_by 'gate'"):
        load_buffer(run, None, default_K=(10,))


def test_signals_only_buffer_has_no_step_counts(tmp_path: Path) -> None:
    table = pl.DataFrame(
        {
            "group_id": ["x", "y", "x", "y"],
            "task_type": ["t"] * 4,
            "K": [5, 5, 10, 10],
            **{n: [0.1, 0.2, 0.1, 0.3] for n in schemas.SIGNAL_NAMES},
            "reward_var": [0.0, 0.25, 0.0, 0.25],
            "label": ["all_fail", "mixed", "all_fail", "mixed"],
        }
    )
    table.write_parquet(tmp_path / "sig.parquet")
    buffer = load_buffer(tmp_path / "sig.parquet", None, default_K=(10,))
    assert buffer.Ks == (5, 10) and not buffer.has_step_counts and buffer.advantages() is None
    assert buffer.at_K(10)["prefix_edit_distance_mean"].to_list() == [0.1, 0.3]
    assert buffer.at_K(10)["remaining_steps"].null_count() == 2
    table.filter(~((pl.col("group_id") == "y") & (pl.col("K") == 10))).write_parquet(
        tmp_path / "sig.parquet"
    )
    with pytest.raises(SrolloutError, match="group y lacks a row at some K of 5, 10"):
        load_buffer(tmp_path / "sig.parquet", None, default_K=(10,))


def test_subsample_keeps_size_per_large_group_and_is_seeded(steps_table) -> None:
    steps = steps_table(
        {
            "big": ("t", [([f"a{i}"], float(i % 2)) for i in range(16)]),
            "small": ("t", [(["a"], 0.0)] * 4),
        }
    )
    trajs = trajectories_from_steps(steps, Path("s"))
    one = subsample_trajectories(trajs, 8, seed=1)
    assert one.group_by("group_id").len().sort("group_id")["len"].to_list() == [8, 4]
    assert one.equals(subsample_trajectories(trajs, 8, seed=1))
    picked = set(one.filter(pl.col("group_id") == "big")["traj_idx"].to_list())
    assert picked <= set(range(16)) and len(picked) == 8
    others = [
        set(
            subsample_trajectories(trajs, 8, seed=s)
            .filter(pl.col("group_id") == "big")["traj_idx"]
            .to_list()
        )
        for s in range(2, 6)
    ]
    assert any(o != picked for o in others)


def _synthetic_steps(n_groups: int) -> pl.DataFrame:
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    from synthetic_buffers import synthetic_steps

    return synthetic_steps(n_groups, seed=3)


def test_signals_in_worker_processes_equal_the_serial_table(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from srollout.stages import buffer as B

    schemas.write(_synthetic_steps(60), tmp_path / "steps.parquet", schemas.STEPS)
    serial = load_buffer(tmp_path, None, default_K=(5, 10, 20))
    assert serial.signals.height == 180
    monkeypatch.setattr(B, "PARALLEL_FROM", 0)
    monkeypatch.setattr(B, "SIGNALS_CHUNK", 7)  # 9 chunks over 2 workers, out of order or not
    seen = []

    def phase(name: str, **_: object):
        return lambda done, total, *_: seen.append((name, done, total))

    parallel = load_buffer(tmp_path, None, default_K=(5, 10, 20), progress=phase)
    assert parallel.signals.equals(serial.signals)
    assert seen[0] == ("signals", 0, 60) and seen[-1] == ("signals", 60, 60)
    assert [d for _, d, _ in seen] == sorted(d for _, d, _ in seen)


def test_the_lazy_read_keeps_only_what_the_signals_need(tmp_path: Path) -> None:
    steps = _synthetic_steps(30)
    schemas.write(steps, tmp_path / "steps.parquet", schemas.STEPS)
    buffer = load_buffer(tmp_path, [4, 10], default_K=(10,))
    # the whole trajectories, read eagerly: the same groups, step counts and signals
    full = trajectories_from_steps(steps, tmp_path / "steps.parquet")
    from srollout.stages.buffer import groups_from_trajectories, signals_from_trajectories

    groups = groups_from_trajectories(full, tmp_path)
    assert buffer.groups.equals(groups)
    assert buffer.signals.equals(signals_from_trajectories(full, groups, (4, 10)))
    row = buffer.trajectories.filter(pl.col("n_steps") > 12).row(0, named=True)
    assert len(row["actions"]) == row["n_steps"] and row["actions"][10:] == [None] * (
        row["n_steps"] - 10
    )
    kept = [i + 1 for i, o in enumerate(row["observations"]) if o != ""]
    assert kept == [1, 4, 10]  # o_1 (the initial observation) and o_K


def test_step_signals_come_from_the_steps_own_columns_and_analyze_ranks_them(
    steps_table, tmp_path: Path
) -> None:
    """Two groups of G = 2. Group g: trajectory 0 logs log-probs -0.1, -0.2, -0.3 and its step 2
    was rejected; trajectory 1 ends after one step at -1.0. At K = 2: action_logprob_mean
    (-0.1 - 0.2 - 1.0) / 3, invalid_action_rate 1/3. Group h: every step at -0.5, all valid."""
    steps = steps_table({
        "g": ("t", [(["a1", "a2", "a3"], 1.0), (["b1"], 0.0)]),
        "h": ("t", [(["c1", "c2"], 0.0), (["d1", "d2"], 0.0)]),
    })  # fmt: skip
    first = (pl.col("group_id") == "g") & (pl.col("traj_idx") == 0)
    logprob = (
        pl.when(first)
        .then(-pl.col("step") / 10)
        .when(pl.col("group_id") == "g")
        .then(-1.0)
        .otherwise(-0.5)
    )
    steps = steps.with_columns(
        logprob_mean=logprob, logprob_min=logprob - 1, valid=~(first & (pl.col("step") == 2))
    )
    run = tmp_path / "run"
    schemas.write(steps, run / "steps.parquet", schemas.STEPS)
    at = load_buffer(run, [2], default_K=(2,)).at_K(2).sort("group_id")
    assert at["action_logprob_mean"].to_list() == pytest.approx([-1.3 / 3, -0.5])
    assert at["invalid_action_rate"].to_list() == pytest.approx([1 / 3, 0.0])
    from srollout.stages.analyze import correlation_table

    metrics = correlation_table(at)["metric"].to_list()
    assert metrics[-2:] == ["action_logprob_mean", "invalid_action_rate"] and len(metrics) == 9


def test_a_steps_table_without_log_probs_gives_nan_for_them_and_reads(hand_buffer: Path) -> None:
    at = load_buffer(hand_buffer, [4], default_K=(10,)).at_K(4)
    assert at["action_logprob_mean"].is_nan().all()
    assert at["invalid_action_rate"].to_list() == [0.0, 0.0, 0.0, 0.0]  # every step was valid
