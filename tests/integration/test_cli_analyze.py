"""End to end: `srollout analyze` on hand-built buffers; numbers checked against hand work
(the HAND_BUFFER table in tests/conftest.py)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest
from conftest import linked_docs

from srollout import schemas

D_K = "prefix_edit_distance_mean"


def _row(df: pl.DataFrame, **where) -> dict:
    part = df
    for key, value in where.items():
        part = part.filter(pl.col(key) == value)
    assert part.height == 1, where
    return part.row(0, named=True)


def test_analyze_hand_buffer_numbers(hand_buffer: Path, tmp_path: Path, run_cli) -> None:
    out = tmp_path / "run"
    result = run_cli("analyze", hand_buffer, "--K", "2,4", "--gate-K", "4", "--out", out)
    assert result.exit_code == 0, result.stderr

    signals = schemas.read(out / "signals.parquet", schemas.SIGNALS)
    at4 = {r["group_id"]: r for r in signals.filter(pl.col("K") == 4).iter_rows(named=True)}
    assert [at4[g][D_K] for g in "abcd"] == pytest.approx([0.0, 0.0, 0.125, 1.0])
    assert [at4[g]["termination_fraction"] for g in "abcd"] == [1.0, 0.0, 0.0, 0.0]
    assert [at4[g]["reward_var"] for g in "abcd"] == pytest.approx([0.0, 0.1875, 0.0, 0.25])
    assert [at4[g]["label"] for g in "abcd"] == ["all_succeed", "mixed", "all_fail", "mixed"]
    # obs_unique_ratio at K=4 uses o_4 = the answer to a_3: c's trajectories all did "go to sink 1"
    assert at4["c"]["obs_unique_ratio"] == pytest.approx(0.25)
    assert at4["a"]["obs_unique_ratio"] == pytest.approx(0.25)  # all ended: o_4 = END for each

    corr = schemas.read(out / "correlation.parquet", schemas.CORRELATION)
    # the seven and invalid_action_rate at K = 4 and 10; the hand steps table has no log-probs,
    # so action_logprob_mean (all NaN) is not ranked
    assert corr.height == 2 * 8
    assert "action_logprob_mean" not in corr["metric"].to_list()
    assert "invalid_action_rate" in corr["metric"].to_list()
    d4 = _row(corr, K=4, metric=D_K)
    # ranks d: a,b tie 1.5, c 3, d 4; ranks σ²: a,c tie 1.5, b 3, d 4 -> ρ = 2.25 / 4.5
    assert d4["n"] == 4
    assert d4["spearman_rho"] == pytest.approx(0.5)
    # positives (mixed) b=0, d=1; negatives a=0, c=0.125: (0.5 + 0 + 1 + 1) / 4
    assert d4["auroc"] == pytest.approx(0.625)
    # τ_4: positives b=0, d=0; negatives a=1, c=0 -> (0 + .5 + 0 + .5) / 4, kept raw (not flipped)
    assert _row(corr, K=4, metric="termination_fraction")["auroc"] == pytest.approx(0.25)

    per_type = pl.read_parquet(out / "per_task_type.parquet")
    simple = _row(per_type, task_type="pick_and_place_simple", K=4, metric=D_K)
    clean = _row(per_type, task_type="pick_clean_then_place", K=4, metric=D_K)
    assert (simple["n"], simple["n_zv"], simple["auroc"]) == (2, 1, 0.5)  # b (0) vs a (0): a tie
    assert (clean["n"], clean["n_zv"], clean["auroc"]) == (2, 1, 1.0)  # d (1) vs c (0.125)

    strat = pl.read_parquet(out / "stratification.parquet")
    mixed = _row(strat, K=4, metric=D_K, label="mixed")
    assert (mixed["n"], mixed["median"], mixed["q25"], mixed["q75"]) == (2, 0.5, 0.25, 0.75)
    assert _row(strat, K=4, metric=D_K, label="all_fail")["median"] == pytest.approx(0.125)

    # default gate at K=4, d_L=0.12 cuts a (TP) and b (FP); c's 0.125 is not below 0.12
    fps = pl.read_parquet(out / "false_positives.parquet")
    assert fps["group_id"].to_list() == ["b"]
    assert (
        fps["first_actions"][0] == "open drawer 1 → close drawer 1 → open drawer 2 → close drawer 2"
    )
    assert fps["n_sharing"][0] == "4/4"

    for name in (
        "heatmap.png",
        "d_K_by_label.png",
        "d_K_vs_reward_var.png",
        "report.md",
        "manifest.json",
    ):
        assert (out / name).stat().st_size > 0, name
    report = (out / "report.md").read_text()
    assert "](heatmap.png)" in report and "False positives" in report
    assert "for τ_K (U-shaped against the label)" in linked_docs(report)
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["status"] == "complete" and manifest["stage"] == "analyze"
    assert "correlation.parquet" in manifest["outputs"]
    assert set(manifest["timings_s"]) == {"load", "compute", "total"}
    assert manifest["config"]["K"] == [2, 4] and manifest["input_kind"] == "steps"
    assert "Spearman" in result.stdout


def test_analyze_accepts_a_signals_table_made_by_anyone(tmp_path: Path, run_cli) -> None:
    signals = pl.DataFrame(
        {
            "group_id": ["g1", "g2", "g3", "g4", "g5"],
            "task_type": ["x"] * 5,
            "K": [7] * 5,
            **{name: [0.0, 0.1, 0.2, 0.5, 0.9] for name in schemas.SIGNAL_NAMES},
            "reward_var": [0.0, 0.0, 0.25, 0.0, 0.1875],
            "label": ["all_fail", "all_succeed", "mixed", "all_fail", "mixed"],
        }
    )
    path = tmp_path / "someone_elses.parquet"
    signals.write_parquet(path)
    out = tmp_path / "run"
    result = run_cli("analyze", path, "--out", out, "--no-figures")
    assert result.exit_code == 0, result.stderr
    assert not (out / "signals.parquet").exists()  # nothing computed, nothing re-written
    corr = pl.read_parquet(out / "correlation.parquet")
    assert corr["K"].unique().to_list() == [7]  # the K values present are used
    # negatives 0, 0.1, 0.5; positives 0.2 (beats 2 of 3), 0.9 (beats 3) -> 5/6
    assert _row(corr, metric=D_K)["auroc"] == pytest.approx(5 / 6)
    assert not (out / "false_positives.parquet").exists()  # K=10 is not in the table
    assert "Not computed" in (out / "report.md").read_text()


def test_analyze_g16_panel_on_g8_subsamples(tmp_path: Path, steps_table, run_cli) -> None:
    import random

    rng = random.Random(3)
    groups = {}
    for g in range(8):
        # half the groups agree (identical trajectories), half branch at random
        same = g % 2 == 0
        trajs = []
        for i in range(16):
            acts = [f"act{t}" if same else f"act{t}-{rng.randint(0, 2)}" for t in range(12)]
            reward = float(g % 4 == 0) if same else float(i % 2)
            trajs.append((acts, reward))
        groups[f"g{g}"] = ("pick_two_obj_and_place", trajs)
    run = tmp_path / "g16"
    schemas.write(steps_table(groups), run / "steps.parquet")

    out1, out2 = tmp_path / "a1", tmp_path / "a2"
    assert (
        run_cli(
            "analyze", run, "--K", "5,10", "--out", out1, "--no-figures", "--seed", "7"
        ).exit_code
        == 0
    )
    assert (
        run_cli(
            "analyze", run, "--K", "5,10", "--out", out2, "--no-figures", "--seed", "7"
        ).exit_code
        == 0
    )
    g8 = schemas.read(out1 / "correlation_g8.parquet", schemas.CORRELATION)
    # the seven and invalid_action_rate (no log-probs in this steps table) at K = 5 and 10
    assert g8.height == 2 * 8 and set(g8["n"].to_list()) == {8}
    assert g8.equals(pl.read_parquet(out2 / "correlation_g8.parquet"))  # same seed, same table
    # identical trajectories stay identical in any subset: their d_K is 0 at G=16 and at G=8;
    # the branching groups have i % 2 rewards, mixed at G=16 and (almost surely) at G=8
    full = schemas.read(out1 / "signals.parquet", schemas.SIGNALS)
    assert full.filter(pl.col("group_id").is_in(["g0", "g2", "g4", "g6"]))[D_K].max() == 0.0
    report = (out1 / "report.md").read_text()
    assert "G=8 sub-samples of the G=16 groups" in report


def test_analyze_and_sweep_do_not_import_torch(hand_buffer: Path, tmp_path: Path) -> None:
    code = (
        "import sys\n"
        "from srollout.cli.app import main\n"
        "for argv in (['srollout', 'analyze', '--help'], ['srollout', 'sweep', '--help'],\n"
        f"             ['srollout', 'analyze', {str(hand_buffer)!r}, '--K', '4', '--out', "
        f"{str(tmp_path / 'a')!r}],\n"
        f"             ['srollout', 'sweep', {str(hand_buffer)!r}, '--K', '4', '--T-max', '10', "
        f"'--n-boot', '50', '--out', {str(tmp_path / 's')!r}]):\n"
        "    sys.argv = argv\n"
        "    try:\n"
        "        main()\n"
        "    except SystemExit as done:\n"
        "        assert not done.code, (argv, done.code)\n"
        "    heavy = sorted(m for m in ('torch', 'transformers', 'alfworld', 'vllm', 'ray') if m "
        "in sys.modules)\n"
        "    print(argv[1], argv[2], heavy)\n"
        "    assert not heavy, heavy\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert done.stdout.count("[]") == 4, done.stdout[-2000:]


# --- bad input: one clear line, exit code 2, nothing written -------------------------------------


def _assert_one_line_error(result, *fragments: str) -> None:
    assert result.exit_code == 2, (result.exit_code, result.stdout[-500:], result.stderr)
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:"), result.stderr
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])


def _steps(hand_buffer: Path) -> pl.DataFrame:
    return pl.read_parquet(hand_buffer / "steps.parquet")


@pytest.mark.parametrize(
    ("edit", "fragments"),
    [
        (lambda df: df.drop("action"), ("steps.parquet", "missing column 'action'")),
        (
            lambda df: df.with_columns(pl.col("reward").cast(pl.Utf8)),
            ("steps.parquet", "column 'reward' has type"),
        ),
        (lambda df: df.head(0), ("steps.parquet", "empty")),
        (
            lambda df: df.filter((pl.col("group_id") != "c") | (pl.col("traj_idx") == 0)),
            ("group c has 1 trajectory",),
        ),
        (
            lambda df: df.filter((pl.col("group_id") != "b") | (pl.col("step") != 2)),
            ("group b trajectory 0", "without gaps"),
        ),
        (
            lambda df: pl.concat([df, df.head(1)]),
            ("duplicate row for group a trajectory 0 step 1",),
        ),
    ],
    ids=[
        "missing-column",
        "mistyped-column",
        "empty",
        "group-of-one",
        "step-gap",
        "duplicate-step",
    ],
)
def test_analyze_bad_steps_file(
    hand_buffer: Path, tmp_path: Path, run_cli, edit, fragments
) -> None:
    bad = tmp_path / "bad" / "steps.parquet"
    bad.parent.mkdir()
    edit(_steps(hand_buffer)).write_parquet(bad)
    out = tmp_path / "never"
    _assert_one_line_error(run_cli("analyze", bad, "--K", "4", "--out", out), *fragments)
    assert not out.exists()


@pytest.mark.parametrize(
    ("args", "fragments"),
    [
        (("--K", "50"), ("--K 50 is outside the data", "10 steps")),
        (("--K", "5,x"), ("--K", "integers")),
        (("--K", "0"), ("--K", ">= 1")),
        (("--d-L", "1.5"), ("--d-L", "[0, 1]")),
    ],
    ids=["K-outside", "K-malformed", "K-zero", "d_L-outside"],
)
def test_analyze_bad_options(hand_buffer: Path, tmp_path: Path, run_cli, args, fragments) -> None:
    out = tmp_path / "never"
    _assert_one_line_error(run_cli("analyze", hand_buffer, *args, "--out", out), *fragments)
    assert not out.exists()


def test_analyze_missing_and_unreadable_input(tmp_path: Path, run_cli) -> None:
    _assert_one_line_error(
        run_cli("analyze", tmp_path / "nope.parquet"), "nope.parquet", "no such file"
    )
    (tmp_path / "empty_dir").mkdir()
    _assert_one_line_error(
        run_cli("analyze", tmp_path / "empty_dir"), "no steps.parquet or signals.parquet"
    )
    (tmp_path / "junk.parquet").write_text("not parquet")
    _assert_one_line_error(
        run_cli("analyze", tmp_path / "junk.parquet"), "junk.parquet", "not a readable Parquet file"
    )


def test_analyze_signals_K_outside_and_bad_label(tmp_path: Path, run_cli) -> None:
    table = pl.DataFrame(
        {
            "group_id": ["g1", "g2"],
            "task_type": ["x", "x"],
            "K": [7, 7],
            **{name: [0.0, 0.5] for name in schemas.SIGNAL_NAMES},
            "reward_var": [0.0, 0.25],
            "label": ["all_fail", "mixed"],
        }
    )
    path = tmp_path / "signals.parquet"
    table.write_parquet(path)
    _assert_one_line_error(
        run_cli("analyze", path, "--K", "10"), "--K 10 is outside the data", "K = 7"
    )
    table.with_columns(pl.lit("mixed").alias("label")).write_parquet(path)
    _assert_one_line_error(run_cli("analyze", path), "group g1 has label 'mixed' but reward_var 0")
    table.with_columns(pl.lit("won").alias("label")).write_parquet(path)
    _assert_one_line_error(run_cli("analyze", path), "column 'label'", "'won'")


def test_analyze_refuses_existing_run_dir_and_gated_buffers(
    hand_buffer: Path, tmp_path: Path, run_cli
) -> None:
    out = tmp_path / "run"
    assert run_cli("analyze", hand_buffer, "--K", "4", "--out", out, "--no-figures").exit_code == 0
    before = (out / "correlation.parquet").read_bytes()
    _assert_one_line_error(
        run_cli("analyze", hand_buffer, "--K", "4", "--out", out), "already exists", "--overwrite"
    )
    assert (out / "correlation.parquet").read_bytes() == before
    assert (
        run_cli(
            "analyze", hand_buffer, "--K", "4", "--out", out, "--overwrite", "--no-figures"
        ).exit_code
        == 0
    )

    groups = pl.DataFrame(
        {
            "group_id": ["a"],
            "task_id": ["t"],
            "task_type": ["x"],
            "G": [4],
            "reward_mean": [1.0],
            "reward_var": [0.0],
            "label": ["all_succeed"],
            "zero_var": [True],
            "cut": [True],
            "cut_step": [10],
            "arm": ["gated"],
        }
    )
    schemas.write(groups, hand_buffer / "groups.parquet", schemas.GROUPS)
    _assert_one_line_error(
        run_cli("analyze", hand_buffer, "--K", "4"), "cut by a gate", "baseline arm"
    )


@pytest.mark.slow
def test_analyze_recomputes_exactly_the_signals_collect_wrote(tmp_path: Path, run_cli) -> None:
    """Contract with `srollout collect` on the real engine: signals rebuilt from its steps.parquet
    (observations shifted to o_t, END padding, rewards summed) equal the ones the engine computed
    live; sweep then runs on the same run directory with real step counts."""
    pytest.importorskip("alfworld")
    import os

    root = Path(__file__).resolve().parents[2]
    run = tmp_path / "collect"
    env = {**os.environ, "PYTHONPATH": str(root), "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "srollout.cli.app",
            "collect",
            "--policy",
            "noisy-expert",
            "--quick",
            "--G",
            "4",
            "--out",
            str(run),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
        cwd=root,
    )
    assert done.returncode == 0, done.stderr[-2000:]

    out = tmp_path / "analyze"
    assert run_cli("analyze", run, "--out", out, "--no-figures").exit_code == 0
    mine = schemas.read(out / "signals.parquet", schemas.SIGNALS)
    theirs = schemas.read(run / "signals.parquet", schemas.SIGNALS)
    joined = mine.join(theirs, on=["group_id", "K"], suffix="_collect")
    assert joined.height == theirs.height == mine.height > 0
    for column in (*schemas.SIGNAL_NAMES, "reward_var"):
        assert (joined[column] - joined[f"{column}_collect"]).abs().max() < 1e-12, column
    assert (joined["label"] == joined["label_collect"]).all()

    sweep = tmp_path / "sweep"
    assert (
        run_cli(
            "sweep", run, "--K", "5", "--T-max", "15", "--n-boot", "200", "--out", sweep
        ).exit_code
        == 0
    )
    table = schemas.read(sweep / "sweep.parquet", schemas.SWEEP)
    assert (
        table["measured_step_savings"].is_not_nan().all()
        and table["adv_l2_kept"].is_not_nan().all()
    )
