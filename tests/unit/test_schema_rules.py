"""The value rules of the contract (docs/artifacts.md, "Value rules"): enforced when a table is
read, one line naming the column, the first bad row and the rule; NaN only where allowed."""

from __future__ import annotations

import math
import re
from pathlib import Path

import polars as pl
import pytest

from srollout import schemas
from srollout.errors import SchemaError

DOC = Path(__file__).resolve().parents[2] / "docs" / "artifacts.md"

# 4 groups at K=2, values worked by hand; group c has no observations (obs_unique_ratio NaN).
SIGNALS_ROWS = {
    "group_id": ["a", "b", "c", "d"],
    "task_type": ["pick_and_place_simple"] * 4,
    "K": [2, 2, 2, 2],
    "prefix_edit_distance_mean": [0.0, 0.25, 0.5, 1.0],
    "action_bigram_jaccard_mean": [0.0, 0.5, 0.5, 1.0],
    "unique_prefix_ratio": [0.25, 0.5, 0.75, 1.0],
    "unique_action_ratio": [0.25, 0.5, 0.5, 1.0],
    "action_entropy": [0.0, 0.5, 0.75, 1.0],
    "obs_unique_ratio": [0.25, 0.5, math.nan, 1.0],
    "termination_fraction": [1.0, 0.0, 0.25, 0.0],
    "reward_var": [0.0, 0.1875, 0.0, 0.25],
    "label": ["all_succeed", "mixed", "all_fail", "mixed"],
}


def _signals(**changes: list) -> pl.DataFrame:
    return pl.DataFrame({**SIGNALS_ROWS, **changes}, schema=dict(schemas.SIGNALS.columns))


def _write(df: pl.DataFrame, tmp_path: Path) -> Path:
    path = tmp_path / "signals.parquet"
    df.write_parquet(path)  # a foreign tool's file: no validation on the way in
    return path


def test_a_valid_foreign_table_passes_with_nan_where_the_contract_allows_it(tmp_path):
    df = schemas.read(_write(_signals(), tmp_path), schemas.SIGNALS)
    assert df.height == 4 and math.isnan(df["obs_unique_ratio"][2])


@pytest.mark.parametrize("column", [c for c in schemas.SIGNAL_NAMES if c != "obs_unique_ratio"])
@pytest.mark.parametrize("bad", [math.nan, None, 1.7, -0.1, math.inf])
def test_each_signal_outside_0_1_or_missing_is_refused_naming_column_and_row(column, bad, tmp_path):
    values = list(SIGNALS_ROWS[column])
    values[2] = bad
    path = _write(_signals(**{column: values}), tmp_path)
    with pytest.raises(SchemaError) as err:
        schemas.read(path, schemas.SIGNALS)
    message = str(err.value)
    assert "\n" not in message
    assert message.startswith(f"{path}: column '{column}' row 2 is ")
    assert "lies in [0, 1], never NaN" in message and "docs/artifacts.md" in message


def test_obs_unique_ratio_may_be_nan_but_not_out_of_range(tmp_path):
    ok = _signals(obs_unique_ratio=[math.nan, None, math.nan, 0.5])
    assert schemas.read(_write(ok, tmp_path), schemas.SIGNALS).height == 4
    with pytest.raises(
        SchemaError,
        match=r"column 'obs_unique_ratio' row 3 is 8\.0: the contract says a share of G lies in "
        r"\[0, 1\] \(NaN allowed\)",
    ):
        schemas.read(
            _write(_signals(obs_unique_ratio=[0.5, 0.5, math.nan, 8.0]), tmp_path), schemas.SIGNALS
        )


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"K": [2, 2, 0, 2]}, r"column 'K' row 2 is 0: the contract says K >= 1"),
        (
            {"reward_var": [0.0, -0.5, 0.0, 0.25]},
            r"column 'reward_var' row 1 is -0\.5: the contract says a population variance >= 0",
        ),
        ({"reward_var": [0.0, 0.1875, 0.0, math.nan]}, r"column 'reward_var' row 3 is nan"),
        (
            {"label": ["all_succeed", "mixed", "maybe", "mixed"]},
            r"column 'label' row 2 is 'maybe': the contract "
            r"says one of all_fail, mixed, all_succeed",
        ),
    ],
)
def test_other_signal_table_rules(change, message, tmp_path):
    with pytest.raises(SchemaError, match=message):
        schemas.read(_write(_signals(**change), tmp_path), schemas.SIGNALS)


def test_the_count_of_bad_rows_and_the_first_one_are_given(tmp_path):
    path = _write(
        _signals(prefix_edit_distance_mean=[0.0, 3.0, 5.0, 2.0]), tmp_path
    )  # raw, unnormalised distances
    with pytest.raises(
        SchemaError, match=r"row 1 is 3\.0: .* \(3 bad row\(s\); docs/artifacts.md\)"
    ):
        schemas.read(path, schemas.SIGNALS)


def test_steps_and_trajectories_rules(tmp_path, steps_table):
    steps = steps_table(
        {"g": ("pick_and_place_simple", [(["look", "go to desk 1"], 1.0), (["look"], 0.0)])}
    )
    path = tmp_path / "steps.parquet"
    steps.with_columns(step=pl.Series([1, 2, 0])).write_parquet(path)
    with pytest.raises(
        SchemaError, match=r"column 'step' row 2 is 0: the contract says 1-based: step >= 1"
    ):
        schemas.read(path, schemas.STEPS)
    steps.with_columns(reward=pl.Series([0.0, math.nan, 0.0])).write_parquet(path)
    with pytest.raises(
        SchemaError, match=r"column 'reward' row 1 is nan: the contract says a finite reward"
    ):
        schemas.read(path, schemas.STEPS)
    trajs = pl.DataFrame(
        {
            "group_id": ["g"],
            "traj_idx": [0],
            "task_id": ["t"],
            "task_type": ["x"],
            "seed": [1],
            "reward": [1.0],
            "success": [True],
            "n_steps": [3],
            "ended_by": ["timeout"],
            "n_gen_tokens": [5],
        }
    )
    trajs.write_parquet(tmp_path / "trajectories.parquet")
    with pytest.raises(
        SchemaError,
        match=r"column 'ended_by' row 0 is 'timeout': the "
        r"contract says one of done, max_steps, gate",
    ):
        schemas.read(tmp_path / "trajectories.parquet", schemas.TRAJECTORIES)


def test_every_rule_names_a_required_column_and_is_in_the_docs():
    doc = DOC.read_text()
    section = doc[doc.index("## Value rules") :]
    for artifact in schemas.ARTIFACTS.values():
        for rule in artifact.rules:
            declared = {**artifact.columns, **artifact.optional}
            assert rule.column in declared, (artifact.name, rule.column)
            row = re.search(
                rf"^\| `{artifact.filename}` \| `{rule.column}` \| (.+?) \|", section, re.M
            )
            assert row is not None and row.group(1) == rule.what, (artifact.name, rule.column)


# --- through the CLI: the cases ----------------------------------------------------------


@pytest.mark.parametrize(
    ("column", "values", "words"),
    [
        (
            "prefix_edit_distance_mean",
            [0.0, 0.25, math.nan, 1.0],
            "column 'prefix_edit_distance_mean' row 2 is nan",
        ),
        (
            "termination_fraction",
            [1.0, math.nan, 0.25, 0.0],
            "column 'termination_fraction' row 1 is nan",
        ),
        (
            "prefix_edit_distance_mean",
            [0.0, 3.0, 5.0, 2.0],
            "column 'prefix_edit_distance_mean' row 1 is 3.0",
        ),
    ],
)
@pytest.mark.parametrize("command", ["sweep", "analyze"])
def test_sweep_and_analyze_refuse_a_foreign_table_that_breaks_the_contract(
    command, column, values, words, run_cli, tmp_path
):
    path = _write(_signals(**{column: values}), tmp_path)
    out = tmp_path / "out"
    res = (
        run_cli(command, path, "--K", "2", "--out", out)
        if command == "sweep"
        else run_cli(command, path, "--out", out, "--no-figures")
    )
    assert res.exit_code == 2
    lines = [line for line in res.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and words in lines[0], res.stderr
    assert not out.exists() and not (tmp_path / "gate.json").exists()


def test_nan_obs_unique_ratio_is_handled_as_documented(run_cli, tmp_path):
    """analyze counts, per signal, the groups with a finite value (n); sweep does not use it."""
    path = _write(_signals(), tmp_path)
    res = run_cli("analyze", path, "--out", tmp_path / "an", "--no-figures")
    assert res.exit_code == 0, res.stderr
    corr = pl.read_parquet(tmp_path / "an" / "correlation.parquet")
    n = dict(zip(corr["metric"].to_list(), corr["n"].to_list(), strict=True))
    assert n["obs_unique_ratio"] == 3 and n["prefix_edit_distance_mean"] == 4
    assert run_cli("sweep", path, "--K", "2", "--out", tmp_path / "sw").exit_code == 0


def test_a_steps_table_read_lazily_is_held_to_the_same_rules(tmp_path, steps_table, run_cli):
    """analyze and sweep read steps.parquet with schemas.scan (lazily, for tables of millions of
    rows): the rules of the columns they read still hold, and the error names the first bad row."""
    steps = steps_table(
        {"g": ("pick_and_place_simple", [(["look", "go to desk 1"], 1.0), (["look"], 0.0)])}
    )
    path = tmp_path / "steps.parquet"
    steps.with_columns(reward=pl.Series([0.0, math.inf, 0.0])).write_parquet(path)
    with pytest.raises(
        SchemaError, match=r"column 'reward' row 1 is inf: the contract says a finite reward"
    ):
        schemas.check_rules_lazy(schemas.scan(path, schemas.STEPS), schemas.STEPS, path)
    steps.with_columns(step=pl.Series([1, 2, 0])).write_parquet(path)
    for command in ("analyze", "sweep"):
        out = tmp_path / f"out-{command}"
        res = run_cli(command, path, "--K", "1", "--out", out)
        assert res.exit_code == 2, res.stderr
        assert "column 'step' row 2 is 0: the contract says 1-based: step >= 1" in res.stderr
        assert not out.exists()


def test_a_steps_table_damaged_past_its_footer_is_one_line(tmp_path, steps_table, run_cli):
    """The lazy reader checks the footer and schema first; a file damaged in its data pages fails
    only when read (polars: 'Invalid thrift'), which must still be one line and exit 2."""
    steps = steps_table(
        {"g": ("pick_and_place_simple", [(["look", "go to desk 1"], 1.0), (["look"], 0.0)])}
    )
    path = tmp_path / "steps.parquet"
    steps.write_parquet(path)
    data = bytearray(path.read_bytes())
    data[4] = 0  # the first page header, just after the magic bytes
    path.write_bytes(bytes(data))
    for command in ("sweep", "analyze"):
        out = tmp_path / f"out-{command}"
        res = run_cli(command, path, "--K", "1", "--out", out)
        assert res.exit_code == 2, res.stderr
        lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
        assert len(lines) == 1 and "reading it failed, the file looks damaged" in lines[0], (
            res.stderr
        )
        assert not out.exists()
