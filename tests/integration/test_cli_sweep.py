"""End to end: `srollout sweep` on the hand-worked buffer of tests/conftest.py (G=4, K=4,
T_max=10: each cut group saves (T_max − K)/T_max = 0.6 of its N·T_max share; N = 4)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import polars as pl
import pytest
from conftest import linked_docs

from srollout import schemas

TOTAL_STEPS = 12 + 32 + 24 + 29  # real steps of groups a, b, c, d
L2_KEPT_WITHOUT_B = math.sqrt(0.5)  # b and d are the non-zero-variance groups, ||A||² = G each


def _row(df: pl.DataFrame, **where) -> dict:
    part = df
    for key, value in where.items():
        part = part.filter(pl.col(key).is_null() if value is None else pl.col(key) == value)
    assert part.height == 1, where
    return part.row(0, named=True)


def test_sweep_r1_hand_numbers_and_gate_json(hand_buffer: Path, tmp_path: Path, run_cli) -> None:
    out = tmp_path / "sweep"
    result = run_cli(
        "sweep",
        hand_buffer,
        "--K",
        "4",
        "--T-max",
        "10",
        "--d-L-grid",
        "0.05,0.13,0.5",
        "--precision-floor",
        "0.6",
        "--n-boot",
        "2000",
        "--out",
        out,
    )
    assert result.exit_code == 0, result.stderr
    sweep = schemas.read(out / "sweep.parquet", schemas.SWEEP)
    assert (
        sweep.height == 3
        and sweep["rule"].to_list() == ["r1"] * 3
        and sweep["t_high"].null_count() == 3
    )

    low = _row(sweep, d_L=0.05)  # cuts a (d=0, zero-var: TP) and b (d=0, mixed: FP)
    assert (low["n_cut"], low["tp"], low["fp"]) == (2, 1, 1)
    assert low["precision"] == pytest.approx(0.5) and low["recall"] == pytest.approx(0.5)
    assert low["safe_savings"] == pytest.approx(1 * 6 / 40) and low["raw_savings"] == pytest.approx(
        2 * 6 / 40
    )
    assert low["measured_step_savings"] == pytest.approx(
        (0 + 16) / TOTAL_STEPS
    )  # a had ended: saves 0
    assert low["adv_l2_kept"] == pytest.approx(L2_KEPT_WITHOUT_B, rel=1e-4)

    mid = _row(sweep, d_L=0.13)  # adds c (d=0.125, all-fail: TP)
    assert (mid["n_cut"], mid["tp"], mid["fp"]) == (3, 2, 1)
    assert mid["precision"] == pytest.approx(2 / 3) and mid["recall"] == pytest.approx(1.0)
    assert mid["safe_savings"] == pytest.approx(2 * 6 / 40) and mid["raw_savings"] == pytest.approx(
        3 * 6 / 40
    )
    assert mid["measured_step_savings"] == pytest.approx((0 + 16 + 8) / TOTAL_STEPS)

    # oracle cuts a and c; random cuts 2 of 4 groups: E[TP] = 1, E[saved steps] = (0+16+8+13)/2
    assert (mid["oracle_n_cut"], mid["oracle_safe_savings"]) == (2, pytest.approx(0.3))
    assert mid["oracle_measured_step_savings"] == pytest.approx(8 / TOTAL_STEPS)
    assert low["random_tp"] == pytest.approx(1.0, abs=0.1)
    assert low["random_measured_step_savings"] == pytest.approx(18.5 / TOTAL_STEPS, abs=0.02)

    # 0.13 and 0.5 tie on safe savings and precision: the smaller d_L is chosen
    assert sweep["chosen"].to_list() == [False, True, False]
    chosen = _row(sweep, chosen=True)
    assert chosen["safe_savings_ci_low"] <= 0.3 <= chosen["safe_savings_ci_high"]
    assert 0.0 <= chosen["safe_savings_ci_low"] < chosen["safe_savings_ci_high"] <= 0.6
    gate = json.loads((out / "gate.json").read_text())
    assert (gate["rule"], gate["K"], gate["d_L"]) == ("r1", 4, 0.13)
    from srollout.core.gate import load_gate

    rule = load_gate(out / "gate.json")
    assert (rule.rule, rule.K, rule.d_L) == ("r1", 4, 0.13)
    assert (out / "pareto.png").stat().st_size > 0
    report = (out / "report.md").read_text()
    assert "**r1**" in report and "Operating point" in report and "](pareto.png)" in report
    assert "its expectation in closed form (hypergeometric" in linked_docs(report)
    assert "chosen: r1 K=4 d_L=0.13" in result.stdout


def test_sweep_without_a_point_above_the_floor_warns_and_writes_no_gate(
    hand_buffer: Path, tmp_path: Path, run_cli
) -> None:
    out = tmp_path / "sweep"
    result = run_cli(
        "sweep",
        hand_buffer,
        "--K",
        "4",
        "--T-max",
        "10",
        "--d-L-grid",
        "0.05,0.13",
        "--n-boot",
        "100",
        "--out",
        out,
    )
    assert result.exit_code == 0, result.stderr
    assert "no operating point" in result.stdout and "0.8" in result.stdout
    assert not (out / "gate.json").exists()
    sweep = schemas.read(out / "sweep.parquet", schemas.SWEEP)
    assert not sweep["chosen"].any()
    assert "No operating point clears the precision floor 0.8" in (out / "report.md").read_text()
    assert json.loads((out / "manifest.json").read_text())["chosen"] is None


def test_sweep_r3_backup_clause_cuts_ended_groups_for_no_real_saving(
    hand_buffer: Path, tmp_path: Path, run_cli
) -> None:
    out = tmp_path / "sweep"
    result = run_cli(
        "sweep",
        hand_buffer,
        "--K",
        "4",
        "--T-max",
        "10",
        "--rule",
        "both",
        "--d-L-grid",
        "0,0.13",
        "--t-high-grid",
        "0.9",
        "--n-boot",
        "200",
        "--out",
        out,
    )
    assert result.exit_code == 0, result.stderr
    sweep = schemas.read(out / "sweep.parquet", schemas.SWEEP)
    assert sweep.height == 4  # r1 × 2 d_L + r3 × 2 d_L × 1 t_high
    never = _row(sweep, rule="r1", d_L=0.0)
    assert (
        never["n_cut"] == 0
        and math.isnan(never["precision"])
        and never["adv_l2_kept"] == pytest.approx(1.0)
    )
    backup = _row(sweep, rule="r3", d_L=0.0)  # only τ_4 = 1 fires: group a, all ended at step 3
    assert (backup["n_cut"], backup["tp"], backup["precision"]) == (1, 1, 1.0)
    assert backup["safe_savings"] == pytest.approx(
        0.15
    )  # the formula credits (T_max - K) steps ...
    assert backup["measured_step_savings"] == 0.0  # ... that never happen (App. OR-rule)
    assert backup["chosen"]
    gate = json.loads((out / "gate.json").read_text())
    assert (gate["rule"], gate["K"], gate["d_L"], gate["t_high"]) == ("r3", 4, 0.0, 0.9)


def test_sweep_from_signals_only_has_formula_savings_but_no_measured(
    tmp_path: Path, run_cli
) -> None:
    signals = pl.DataFrame(
        {
            "group_id": [f"g{i}" for i in range(6)],
            "task_type": ["x"] * 6,
            "K": [10] * 6,
            **{name: [0.0, 0.02, 0.04, 0.3, 0.5, 0.6] for name in schemas.SIGNAL_NAMES},
            "reward_var": [0.0, 0.0, 0.0, 0.25, 0.0, 0.25],
            "label": ["all_fail", "all_succeed", "all_fail", "mixed", "all_fail", "mixed"],
        }
    )
    path = tmp_path / "signals.parquet"
    signals.write_parquet(path)
    out = tmp_path / "sweep"
    result = run_cli("sweep", path, "--d-L-grid", "0.05:0.35:0.3", "--n-boot", "300", "--out", out)
    assert result.exit_code == 0, result.stderr
    sweep = schemas.read(out / "sweep.parquet", schemas.SWEEP)
    assert sweep["d_L"].to_list() == [0.05, 0.35]
    first = _row(sweep, d_L=0.05)
    assert (first["n_cut"], first["tp"], first["precision"]) == (3, 3, 1.0)
    assert first["safe_savings"] == pytest.approx(3 * 20 / (6 * 30))
    assert first["recall"] == pytest.approx(3 / 4)
    assert math.isnan(first["measured_step_savings"])
    assert first["chosen"]


def test_sweep_same_seed_same_table(hand_buffer: Path, tmp_path: Path, run_cli) -> None:
    args = (
        "sweep",
        hand_buffer,
        "--K",
        "2,4",
        "--T-max",
        "10",
        "--precision-floor",
        "0.5",
        "--n-boot",
        "500",
        "--seed",
        "3",
    )
    assert run_cli(*args, "--out", tmp_path / "one").exit_code == 0
    assert run_cli(*args, "--out", tmp_path / "two").exit_code == 0
    one, two = (
        pl.read_parquet(tmp_path / "one" / "sweep.parquet"),
        pl.read_parquet(tmp_path / "two" / "sweep.parquet"),
    )
    assert one.equals(two) and one.height == 2 * 14
    assert (tmp_path / "one" / "gate.json").read_text() == (
        tmp_path / "two" / "gate.json"
    ).read_text()


# --- bad input: one clear line, exit code 2, nothing written -------------------------------------


def _assert_one_line_error(result, *fragments: str) -> None:
    assert result.exit_code == 2, (result.exit_code, result.stdout[-500:], result.stderr)
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:"), result.stderr
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])


@pytest.mark.parametrize(
    ("args", "fragments"),
    [
        (("--d-L-grid", "0.05:1.5:0.5"), ("--d-L-grid", "[0, 1]", "1.05")),
        (("--d-L-grid", "-0.1,0.1"), ("--d-L-grid", "[0, 1]")),
        (("--d-L-grid", "0.05:0.18"), ("--d-L-grid", "malformed grid '0.05:0.18'")),
        (("--d-L-grid", "0.18:0.05:0.01"), ("malformed grid",)),
        (("--d-L-grid", "0.05:0.18:0"), ("malformed grid",)),
        (("--d-L-grid", "a,b"), ("malformed grid 'a,b'",)),
        (("--rule", "r3", "--t-high-grid", "0.8:1.0"), ("--t-high-grid", "malformed grid")),
        (("--rule", "r2"), ("--rule", "r1, r3, both", "'r2'")),
        (("--K", "40"), ("--K 40 is larger than --T-max 30",)),
        (("--K", "12"), ("--K 12 is outside the data", "10 steps")),
        (("--K", "4", "--T-max", "8"), ("up to 10 steps, more than --T-max 8",)),
        (("--precision-floor", "1.2"), ("--precision-floor", "[0, 1]")),
        (("--seed", "-1"), ("--seed must be an integer >= 0, got -1",)),  # found by the fuzz test
    ],
    ids=[
        "d_L-above-1",
        "d_L-negative",
        "grid-two-parts",
        "grid-reversed",
        "grid-zero-step",
        "grid-words",
        "t_high-grid",
        "rule",
        "K-above-T_max",
        "K-outside-data",
        "T_max-below-data",
        "floor",
        "negative-seed",
    ],
)
def test_sweep_bad_options(hand_buffer: Path, tmp_path: Path, run_cli, args, fragments) -> None:
    out = tmp_path / "never"
    _assert_one_line_error(run_cli("sweep", hand_buffer, *args, "--out", out), *fragments)
    assert not out.exists()


@pytest.mark.parametrize(
    ("column", "value", "says"),
    [
        ("invalid_action_rate", 1.5, "invalid_action_rate"),
        ("action_logprob_mean", 0.7, "a mean log-probability <= 0"),
    ],
)
def test_a_signals_table_whose_step_signals_are_out_of_range_is_one_line(
    tmp_path: Path, run_cli, column: str, value: float, says: str
) -> None:
    signals = pl.DataFrame(
        {
            "group_id": [f"g{i}" for i in range(4)],
            "task_type": ["x"] * 4,
            "K": [10] * 4,
            **{name: [0.0, 0.1, 0.3, 0.5] for name in schemas.SIGNAL_NAMES},
            "reward_var": [0.0, 0.0, 0.25, 0.25],
            "label": ["all_fail", "all_succeed", "mixed", "mixed"],
            "action_logprob_mean": [-0.1, -0.2, -0.9, -1.2],
            "invalid_action_rate": [0.0, 0.1, 0.5, 1.0],
        }
    ).with_columns(
        pl.when(pl.col("group_id") == "g2").then(value).otherwise(pl.col(column)).alias(column)
    )
    path = tmp_path / "signals.parquet"
    signals.write_parquet(path)
    for args in (("sweep", path, "--features", "all", "--learned"), ("analyze", path)):
        out = tmp_path / f"never-{args[0]}"
        _assert_one_line_error(run_cli(*args, "--out", out), "signals.parquet", says)
        assert not out.exists()


def test_sweep_bad_files(hand_buffer: Path, tmp_path: Path, run_cli) -> None:
    _assert_one_line_error(
        run_cli("sweep", tmp_path / "missing.parquet"), "missing.parquet", "no such file"
    )
    bad = tmp_path / "signals.parquet"
    pl.DataFrame({"group_id": ["g"], "K": [10]}).write_parquet(bad)
    _assert_one_line_error(run_cli("sweep", bad), "signals.parquet", "missing column 'task_type'")
    empty = pl.DataFrame(schema={**schemas.SIGNALS.columns})
    empty.write_parquet(bad)
    _assert_one_line_error(run_cli("sweep", bad), "signals.parquet", "empty")
    steps = pl.read_parquet(hand_buffer / "steps.parquet").filter(
        (pl.col("group_id") != "d") | (pl.col("traj_idx") == 2)
    )
    steps.write_parquet(hand_buffer / "steps.parquet")
    _assert_one_line_error(
        run_cli("sweep", hand_buffer, "--K", "4", "--T-max", "10"), "group d has 1 trajectory"
    )
