"""End to end: `srollout collect` with the shipped default policy on the real ALFWorld engine, then
`srollout train-offpolicy` on that buffer (both arms), checked against hand-derived numbers."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest
import torch
from conftest import linked_docs

from srollout import schemas

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def real_model(default_model) -> Path:
    """The default policy the package ships."""
    return default_model


def _make_buffer(run_cli, real_model: Path, out: Path, K: int) -> tuple[float, set[str]]:
    """Collect 6 groups (G=4, T_max=4), choose d_L so the gate cuts about half of them at K, and
    rewrite the rewards so every uncut group is mixed (trajectory 0 wins) and every cut group is
    all-fail: the gate then cuts only zero-variance groups. Returns (d_L, cut group ids)."""
    res = run_cli(
        "collect",
        "--model",
        real_model,
        "--groups",
        "6",
        "--G",
        "4",
        "--T-max",
        "4",
        "--signal-K",
        str(K),
        "--out",
        out,
    )
    assert res.exit_code == 0, res.stderr[-2000:]
    sig = (
        pl.read_parquet(out / "signals.parquet")
        .filter(pl.col("K") == K)
        .sort("prefix_edit_distance_mean")
    )
    d = sig["prefix_edit_distance_mean"].to_list()
    split = next(i for i in (2, 3, 1, 4, 0) if d[i] < d[i + 1])
    d_L = (d[split] + d[split + 1]) / 2
    cut = set(sig["group_id"][: split + 1])
    trajs = pl.read_parquet(out / "trajectories.parquet")
    wins = (~pl.col("group_id").is_in(list(cut))) & (pl.col("traj_idx") == 0)
    trajs = trajs.with_columns(reward=pl.when(wins).then(1.0).otherwise(0.0), success=wins)
    schemas.write(trajs, out / "trajectories.parquet")
    steps = pl.read_parquet(out / "steps.parquet")
    last = (
        (~pl.col("group_id").is_in(list(cut))) & (pl.col("traj_idx") == 0) & (pl.col("step") == 4)
    )
    schemas.write(
        steps.with_columns(reward=pl.when(last).then(1.0).otherwise(0.0)), out / "steps.parquet"
    )
    return d_L, cut


def test_train_offpolicy_end_to_end(run_cli, real_model, tmp_path):
    K = 3
    d_L, cut = _make_buffer(run_cli, real_model, tmp_path / "buffer", K)
    out = tmp_path / "train"
    res = run_cli(
        "train-offpolicy",
        tmp_path / "buffer",
        "--steps",
        "2",
        "--groups-per-step",
        "6",
        "--K",
        str(K),
        "--d-L",
        f"{d_L:.10f}",
        "--lr",
        "1e-2",
        "--out",
        out,
    )
    assert res.exit_code == 0, res.stderr[-2000:]
    m = schemas.read(out / "metrics.parquet", schemas.METRICS)
    assert m.height == 4
    b = m.filter(pl.col("arm") == "baseline").sort("step")
    g = m.filter(pl.col("arm") == "gated").sort("step")
    n_cut = len(cut)
    # every step sees all 6 groups; the gated arm drops the cut ones entirely
    assert b["gate/cuts"].to_list() == [0, 0] and g["gate/cuts"].to_list() == [n_cut, n_cut]
    assert b["train/trajectories"].to_list() == [24, 24]
    assert g["train/trajectories"].to_list() == [24 - 4 * n_cut] * 2
    # k = min(8, 128 // (6 groups * G=4)) = 5 turns >= the 4 each trajectory has: all 4 are items
    assert b["train/items"].to_list() == [96, 96]
    assert g["train/items"].to_list() == [4 * (24 - 4 * n_cut)] * 2
    # the cut groups are the zero-variance ones: baseline z = 4*n_cut/24, gated z = 0
    assert b["train/zero_adv_frac"].to_list() == pytest.approx([4 * n_cut / 24] * 2)
    assert g["train/zero_adv_frac"].to_list() == [0.0, 0.0]
    # step 1 starts from the same weights: dropping zero-advantage trajectories rescales the
    # gradient of L = -1/N sum A_i log p by N_baseline / N_gated exactly (§5.4's dilution)
    assert b["train/grad_l2"][0] > 0
    dilution = 24 / (24 - 4 * n_cut)
    assert g["train/grad_l2"][0] / b["train/grad_l2"][0] == pytest.approx(dilution, rel=1e-4)
    assert g["train/loss"][0] == pytest.approx(b["train/loss"][0] * dilution, rel=1e-4)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["groups_cut"] == 2 * n_cut and summary["cut_zero_var"] == 2 * n_cut
    assert summary["rollout_s_saved"] > 0 and 0 < summary["rollout_saving"] < 1
    assert summary["dilution_prediction"] == pytest.approx(1 / (1 - 4 * n_cut / 24))
    assert (out / "offpolicy_trace.png").stat().st_size > 1000
    report = (out / "report.md").read_text()
    assert "gradient L2 mean" in report and "offpolicy_trace.png" in report
    assert "a cut group saves the generation + environment seconds" in linked_docs(report)
    assert "train-offpolicy: baseline vs gated" in res.stdout


def test_train_offpolicy_bad_input_is_one_line_and_exit_2(run_cli, tmp_path):
    res = run_cli("train-offpolicy", tmp_path / "nope")
    assert res.exit_code == 2 and "not a directory" in res.stderr and "Traceback" not in res.stderr
    (tmp_path / "empty").mkdir()
    res = run_cli("train-offpolicy", tmp_path / "empty")
    assert res.exit_code == 2 and "trajectories.parquet" in res.stderr
    res = run_cli("train-offpolicy", tmp_path / "empty", "--denominator", "median")
    assert res.exit_code == 2 and "--denominator" in res.stderr
