"""End to end: `srollout sweep --learned --adaptive` (and --eval-buffer) on a constructed buffer.

30 groups of G=4, T_max=12 (every trajectory runs 12 steps): 12 zero-variance groups whose four
trajectories act identically (d_K = 0), 3 zero-variance groups that diverge (d_K = 1), 14 mixed
groups that diverge, and 1 mixed group that acts identically (a false positive no gate on these
signals can avoid). Cutting exactly the d_K = 0 groups gives TP = 12, FP = 1, precision 12/13.
"""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest

from srollout import schemas
from tests.conftest import build_steps

T = 12


def _group(i: int) -> tuple[str, list[tuple[list[str], float]]]:
    converged = i < 12 or i == 29
    zero_var = i < 15
    rewards = [1.0] * 4 if (zero_var and i % 2) else [0.0] * 4 if zero_var else [1.0, 0.0, 0.0, 0.0]
    trajs = []
    for j, r in enumerate(rewards):
        who = "all" if converged else f"t{j}"
        trajs.append(([f"{who}-g{i}-a{t}" for t in range(1, T + 1)], r))
    return "pick_and_place_simple", trajs


@pytest.fixture
def built_buffer(tmp_path: Path) -> Path:
    run = tmp_path / "built"
    schemas.write(
        build_steps({f"g{i:02d}": _group(i) for i in range(30)}),
        run / "steps.parquet",
        schemas.STEPS,
    )
    return run


ARGS = (
    "--K",
    "4",
    "--T-max",
    str(T),
    "--d-L-grid",
    "0.05,0.5",
    "--check-K",
    "2,4,6",
    "--n-folds",
    "3",
    "--n-boot",
    "300",
)


def test_sweep_learned_and_adaptive_rows_are_held_out(
    built_buffer: Path, tmp_path: Path, run_cli
) -> None:
    out = tmp_path / "sweep"
    result = run_cli("sweep", built_buffer, *ARGS, "--learned", "--adaptive", "--out", out)
    assert result.exit_code == 0, result.stderr
    table = pl.read_parquet(out / "gates.parquet")
    assert table.select("gate", "selection").rows() == [
        ("r1", "in-sample"),
        ("r1", "cross-fitted"),
        ("learned", "cross-fitted"),
        ("adaptive", "cross-fitted"),
        ("oracle", "labels"),
    ]
    rows = {(r["gate"], r["selection"]): r for r in table.to_dicts()}
    oracle = rows[("oracle", "labels")]
    assert (oracle["n_cut"], oracle["tp"], oracle["precision"]) == (15, 15, 1.0) and oracle[
        "share_of_oracle"
    ] == pytest.approx(1.0)
    assert oracle["safe_savings"] == pytest.approx(15 * (T - 4) / (30 * T))
    in_sample = rows[("r1", "in-sample")]  # d_L 0.05 cuts the 13 d_K = 0 groups
    assert (in_sample["n_cut"], in_sample["tp"], in_sample["fp"]) == (13, 12, 1)
    assert in_sample["share_of_oracle"] == pytest.approx(12 / 15)
    for gate in ("learned", "adaptive"):
        row = rows[(gate, "cross-fitted")]
        assert row["n_groups"] == 30 and row["tp"] + row["fp"] == row["n_cut"]
        assert row["safe_savings_ci_low"] <= row["safe_savings"] <= row["safe_savings_ci_high"]
    learned = rows[("learned", "cross-fitted")]
    assert (learned["n_cut"], learned["tp"], learned["fp"]) == (
        13,
        12,
        1,
    )  # the d_K = 0 groups, held out
    adaptive = rows[("adaptive", "cross-fitted")]
    # the d_K = 0 groups are already identical at step 2: cut there, (12 − 2)/12 of their steps
    # saved
    assert adaptive["tp"] == 12 and adaptive["safe_savings"] == pytest.approx(
        12 * (T - 2) / (30 * T)
    )
    assert adaptive["measured_step_savings"] == pytest.approx(13 * 4 * (T - 2) / (30 * 4 * T))
    assert adaptive["share_of_oracle"] == pytest.approx(
        12 * 10 / (15 * 8)
    )  # beyond 1: earlier than the oracle's K

    from srollout.core.adaptive_gate import AdaptiveGate
    from srollout.core.gate import load_gate
    from srollout.core.learned_gate import LearnedGate

    learned_gate = load_gate(out / "gate-learned.json")
    adaptive_gate = load_gate(out / "gate-adaptive.json")
    assert isinstance(learned_gate, LearnedGate) and learned_gate.K == 4
    assert isinstance(adaptive_gate, AdaptiveGate) and adaptive_gate.check_K == (2, 4, 6)
    assert (
        json.loads((out / "gate.json").read_text())["kind"] == "threshold"
    )  # the plain sweep's gate stays
    report = (out / "report.md").read_text()
    assert (
        "## Learned and adaptive gates" in report
        and "cross-fitting" in report
        and "coef (standardised)" in report
    )
    assert "Gates judged on held-out groups" in result.stdout


def test_without_the_flags_the_outputs_are_the_plain_sweep(
    built_buffer: Path, tmp_path: Path, run_cli
) -> None:
    out = tmp_path / "sweep"
    assert run_cli("sweep", built_buffer, *ARGS, "--out", out).exit_code == 0
    assert sorted(p.name for p in out.iterdir() if not p.name.startswith(".")) == [
        "gate.json",
        "manifest.json",
        "pareto.png",
        "report.md",
        "sweep.parquet",
    ]


def test_eval_buffer_fits_on_input_and_judges_on_the_other_run(
    built_buffer: Path, tmp_path: Path, run_cli
) -> None:
    other = tmp_path / "other"
    # the second run: the same groups with labels of groups 0..1 flipped to mixed, so the
    # learned gate (fit on INPUT) now cuts 2 more false positives there
    groups = {f"g{i:02d}": _group(i) for i in range(30)}
    for gid in ("g00", "g01"):
        task, trajs = groups[gid]
        groups[gid] = (task, [(a, float(j == 0)) for j, (a, _) in enumerate(trajs)])
    schemas.write(build_steps(groups), other / "steps.parquet", schemas.STEPS)
    out = tmp_path / "sweep"
    result = run_cli(
        "sweep", built_buffer, *ARGS, "--learned", "--eval-buffer", other, "--out", out
    )
    assert result.exit_code == 0, result.stderr
    table = pl.read_parquet(out / "gates.parquet")
    learned = table.filter(pl.col("gate") == "learned").row(0, named=True)
    assert learned["selection"] == "eval buffer"
    assert (learned["n_cut"], learned["tp"], learned["fp"]) == (13, 10, 3)
    assert table.filter(pl.col("gate") == "oracle")["n_cut"].item() == 13


def test_eval_buffer_alone_is_refused(built_buffer: Path, tmp_path: Path, run_cli) -> None:
    result = run_cli(
        "sweep", built_buffer, *ARGS, "--eval-buffer", built_buffer, "--out", tmp_path / "never"
    )
    assert result.exit_code == 2 and "--learned/--adaptive" in result.stderr
    assert not (tmp_path / "never").exists()


def test_more_folds_than_groups_is_one_line(built_buffer: Path, tmp_path: Path, run_cli) -> None:
    args = [*ARGS[:-4], "--n-folds", "31", "--learned", "--out", tmp_path / "never"]
    result = run_cli("sweep", built_buffer, *args)
    assert result.exit_code == 2, result.stderr
    assert "--n-folds 31 is more than the 30 groups of" in result.stderr
    assert "give --n-folds 30 or fewer" in result.stderr
    assert not (tmp_path / "never").exists()


def test_too_few_groups_of_a_class_is_one_clear_line(
    hand_buffer: Path, tmp_path: Path, run_cli
) -> None:
    # the hand buffer has 2 zero-variance and 2 mixed groups: too few for nested cross-fitting
    result = run_cli(
        "sweep",
        hand_buffer,
        "--K",
        "4",
        "--T-max",
        "10",
        "--check-K",
        "2,4",
        "--learned",
        "--out",
        tmp_path / "never",
    )
    assert (
        result.exit_code == 2
        and "2 zero-variance and 2 other groups" in result.stderr
        and "at least 3" in result.stderr
    )
    assert not (tmp_path / "never").exists()
    result = run_cli(
        "sweep", hand_buffer, "--K", "4", "--T-max", "10", "--adaptive", "--out", tmp_path / "never"
    )
    assert result.exit_code == 2 and "--check-K 15 is larger than --T-max 10" in result.stderr
    result = run_cli(
        "sweep", hand_buffer, "--K", "4", "--T-max", "20", "--adaptive", "--out", tmp_path / "never"
    )
    assert result.exit_code == 2 and "--K/--check-K 15 is outside the data" in result.stderr
