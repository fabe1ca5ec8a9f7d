"""srollout.schemas: every artifact's required columns, validation messages, atomic writes."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest

from srollout import schemas
from srollout.errors import SchemaError, SrolloutError


def _minimal(artifact: schemas.Artifact, rows: int = 2) -> pl.DataFrame:
    """A table with every required column of ``artifact`` and ``rows`` rows of plausible values."""
    values = {pl.Utf8: "x", pl.Int64: 1, pl.Float64: 0.5, pl.Boolean: True}
    return pl.DataFrame(
        {c: [values[t]] * rows for c, t in artifact.columns.items()}, schema=dict(artifact.columns)
    )


def test_every_artifact_of_the_design_is_declared() -> None:
    assert set(schemas.ARTIFACTS) == {
        "steps",
        "trajectories",
        "groups",
        "signals",
        "correlation",
        "sweep",
        "metrics",
        "eval",
        "ab",
        "arms",
        "audit",
    }
    for name, artifact in schemas.ARTIFACTS.items():
        assert artifact.filename == f"{name}.parquet"
        validated = schemas.validate(_minimal(artifact), artifact, "t")
        assert {c: validated.schema[c] for c in artifact.columns} == dict(artifact.columns)


def test_a_step_row_is_the_contracts_steps_columns_declared_once() -> None:
    # the engine fills StepRow, made from STEPS: keys + row fields are exactly the contract's
    # columns, and a row that leaves one out (or names one the contract lacks) is an error
    fields = schemas.StepRow._fields
    declared = [*schemas.STEPS.columns, *schemas.STEPS.optional]
    assert [*schemas.STEP_KEYS, *fields] == [c for c in declared if c in schemas.STEP_KEYS] + [
        c for c in declared if c not in schemas.STEP_KEYS
    ]
    assert set(schemas.STEP_KEYS) | set(fields) == set(declared)
    row = dict.fromkeys(fields, 0)
    assert schemas.StepRow(**row)._asdict() == row
    with pytest.raises(TypeError):
        schemas.StepRow(**{k: v for k, v in row.items() if k != "rejected_run"})
    with pytest.raises(TypeError):
        schemas.StepRow(**row, arm="gated")


def test_signals_table_carries_the_seven_paper_signals() -> None:
    assert schemas.SIGNAL_NAMES == (
        "prefix_edit_distance_mean",
        "action_bigram_jaccard_mean",
        "unique_prefix_ratio",
        "unique_action_ratio",
        "action_entropy",
        "obs_unique_ratio",
        "termination_fraction",
    )
    for name in schemas.SIGNAL_NAMES:
        assert schemas.SIGNALS.columns[name] == pl.Float64


def test_missing_column_is_named_with_the_file() -> None:
    df = _minimal(schemas.SIGNALS).drop("reward_var")
    with pytest.raises(
        SchemaError, match=r"^run/signals.parquet: missing column 'reward_var' \(signals table"
    ):
        schemas.validate(df, schemas.SIGNALS, "run/signals.parquet")


def test_mistyped_column_is_named_with_its_type() -> None:
    df = _minimal(schemas.SWEEP).with_columns(pl.col("tp").cast(pl.Utf8))
    with pytest.raises(
        SchemaError, match=r"sweep.parquet: column 'tp' has type String, expected Int64"
    ):
        schemas.validate(df, schemas.SWEEP, "sweep.parquet")


def test_empty_table_is_an_error_unless_allowed() -> None:
    df = _minimal(schemas.GROUPS, rows=0)
    with pytest.raises(SchemaError, match="the groups table is empty"):
        schemas.validate(df, schemas.GROUPS, "groups.parquet")
    assert schemas.validate(df, schemas.GROUPS, "groups.parquet", allow_empty=True).height == 0


def test_narrow_ints_widen_and_ints_pass_as_floats() -> None:
    df = _minimal(schemas.CORRELATION).with_columns(
        pl.col("K").cast(pl.Int8), pl.col("auroc").cast(pl.Int32)
    )
    out = schemas.validate(df, schemas.CORRELATION, "c")
    assert out.schema["K"] == pl.Int64 and out.schema["auroc"] == pl.Float64
    # but a float where an int is declared is refused
    with pytest.raises(SchemaError, match="column 'K'"):
        schemas.validate(df.with_columns(pl.col("K").cast(pl.Float64)), schemas.CORRELATION, "c")


def test_extra_columns_are_kept() -> None:
    df = _minimal(schemas.SWEEP).with_columns(pl.lit(0.3).alias("measured_step_savings"))
    assert "measured_step_savings" in schemas.validate(df, schemas.SWEEP, "s").columns


def test_read_missing_and_non_parquet(tmp_path: Path) -> None:
    with pytest.raises(SrolloutError, match="no such file"):
        schemas.read(tmp_path / "steps.parquet", schemas.STEPS)
    junk = tmp_path / "steps.parquet"
    junk.write_bytes(b"PAR1 but not really")
    with pytest.raises(SchemaError, match="not a readable Parquet file"):
        schemas.read(junk, schemas.STEPS)


def test_write_is_atomic_and_validates_first(tmp_path: Path) -> None:
    good = _minimal(schemas.EVAL)
    path = schemas.write(good, tmp_path / "eval.parquet", schemas.EVAL)
    assert schemas.read(path, schemas.EVAL).equals(good)
    before = path.read_bytes()
    with pytest.raises(SchemaError, match="missing column 'success'"):
        schemas.write(good.drop("success"), path, schemas.EVAL)
    assert path.read_bytes() == before  # a refused write leaves the old file untouched
    assert [p.name for p in tmp_path.iterdir()] == ["eval.parquet"]  # no temp files left behind


def test_write_json_and_text_are_atomic(tmp_path: Path) -> None:
    schemas.write_json({"b": 1, "a": Path("x")}, tmp_path / "gate.json")
    assert json.loads((tmp_path / "gate.json").read_text()) == {"a": "x", "b": 1}
    schemas.write_text("# report\n", tmp_path / "report.md")
    assert (tmp_path / "report.md").read_text() == "# report\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["gate.json", "report.md"]


def test_scan_checks_the_schema_and_reads_lazily(tmp_path: Path) -> None:
    df = pl.DataFrame(
        {
            "group_id": ["a", "b"],
            "task_type": ["t", "t"],
            "K": [10, 10],
            **{n: [0.1, 0.2] for n in schemas.SIGNAL_NAMES},
            "reward_var": [0.0, 0.25],
            "label": ["all_fail", "mixed"],
        },
        schema_overrides={"K": pl.Int32},
    )
    path = tmp_path / "signals.parquet"
    df.write_parquet(path)
    lazy = schemas.scan(path, schemas.SIGNALS, columns=["group_id", "K"])
    assert isinstance(lazy, pl.LazyFrame)
    got = lazy.collect()
    assert (
        got.columns == ["group_id", "K"] and got.schema["K"] == pl.Int64
    )  # cast to the declared type
    df.drop("label").write_parquet(tmp_path / "bad.parquet")
    with pytest.raises(SchemaError, match="missing column 'label'"):
        schemas.scan(tmp_path / "bad.parquet", schemas.SIGNALS)
    df.head(0).write_parquet(tmp_path / "empty.parquet")
    with pytest.raises(SchemaError, match="empty"):
        schemas.scan(tmp_path / "empty.parquet", schemas.SIGNALS)
    (tmp_path / "junk.parquet").write_text("not parquet")
    with pytest.raises(SchemaError, match="not a readable Parquet"):
        schemas.scan(tmp_path / "junk.parquet", schemas.SIGNALS)
    with pytest.raises(SrolloutError, match="no such file"):
        schemas.scan(tmp_path / "none.parquet", schemas.SIGNALS)


def test_artifacts_get_the_mode_a_plain_open_gives_not_mkstemps_0600(tmp_path):
    import os

    from srollout.atomic import atomic_write_json

    old = os.umask(0o022)
    try:
        parquet = schemas.write(pl.DataFrame({"a": [1]}), tmp_path / "t.parquet")
        js = atomic_write_json({"a": 1}, tmp_path / "t.json")
        os.umask(0o077)
        private = atomic_write_json({"a": 1}, tmp_path / "p.json")
    finally:
        os.umask(old)
    assert parquet.stat().st_mode & 0o777 == 0o644
    assert js.stat().st_mode & 0o777 == 0o644
    assert private.stat().st_mode & 0o777 == 0o600


def test_metrics_are_namespaced_and_an_old_flat_table_names_its_missing_column(tmp_path):
    assert all(c in ("arm", "seed") or c.startswith("train/") for c in schemas.METRICS.columns)
    path = tmp_path / "metrics.parquet"
    old = pl.DataFrame(
        {
            "arm": ["baseline"],
            "seed": [7],
            "step": [1],
            "loss": [0.5],
            "grad_l2": [0.1],
            "zero_adv_frac": [0.25],
            "n_traj": [8],
            "n_tokens": [40],
        }
    )
    old.write_parquet(path)
    with pytest.raises(SchemaError, match=r"missing column 'train/loss' \(metrics table"):
        schemas.read(path, schemas.METRICS)
    new = old.rename(
        {
            "loss": "train/loss",
            "grad_l2": "train/grad_l2",
            "zero_adv_frac": "train/zero_adv_frac",
            "n_traj": "train/trajectories",
            "n_tokens": "train/action_tokens",
        }
    )
    new.write_parquet(path)
    assert schemas.read(path, schemas.METRICS)["train/trajectories"].to_list() == [8]
    new.with_columns(pl.lit(-1).alias("train/trajectories")).write_parquet(path)
    with pytest.raises(SchemaError, match=r"'train/trajectories' row 0 is -1: the contract says"):
        schemas.read(path, schemas.METRICS)


def test_a_polars_panic_on_a_damaged_page_is_one_line_naming_the_file(tmp_path):
    # a damaged page can make polars' reader panic ("Thrift out of range", found by the CLI
    # fuzz test): PanicException is a BaseException, and it must still be one line
    from srollout.schemas import reading

    path = tmp_path / "steps.parquet"
    with pytest.raises(SchemaError, match=r"steps.parquet: reading it failed, the file looks dam"):
        with reading(path):
            raise pl.exceptions.PanicException("called `Result::unwrap()`: Thrift out of range")
