"""The Parquet contract between stages: every artifact's columns, and safe read/write helpers.

Each artifact has a set of *required* columns with their Polars dtypes. Writers may add columns
freely; readers check that every required column is present with a compatible dtype and raise
:class:`~srollout.errors.SchemaError` naming the file and the column otherwise. Writes are atomic
(temp file in the same directory, then ``os.replace``), so a crash never leaves half a file.
The documentation of each column is in docs/artifacts.md.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import polars as pl

from srollout.atomic import atomic_write_json, atomic_write_text
from srollout.errors import SchemaError, SrolloutError

SIGNAL_NAMES: tuple[str, ...] = (
    "prefix_edit_distance_mean",
    "action_bigram_jaccard_mean",
    "unique_prefix_ratio",
    "unique_action_ratio",
    "action_entropy",
    "obs_unique_ratio",
    "termination_fraction",
)

LABELS: tuple[str, ...] = ("all_fail", "mixed", "all_succeed")
ENDED_BY: tuple[str, ...] = ("done", "max_steps", "gate")

# dtype families a reader accepts for a declared dtype: an int column may hold any int width,
# a float column accepts ints too (a hand-made table with reward 0/1 stays valid).
_INTS = (pl.Int8, pl.Int16, pl.Int32, pl.Int64, pl.UInt8, pl.UInt16, pl.UInt32, pl.UInt64)
_FLOATS = (pl.Float32, pl.Float64)


@dataclass(frozen=True)
class Artifact:
    """One Parquet artifact: file name, required columns (name -> dtype), what a row is."""

    name: str
    row: str
    columns: Mapping[str, Any]

    @property
    def filename(self) -> str:
        return f"{self.name}.parquet"


STEPS = Artifact(
    "steps",
    "one (group_id, traj_idx, step)",
    {
        "group_id": pl.Utf8,
        "traj_idx": pl.Int64,
        "task_id": pl.Utf8,
        "task_type": pl.Utf8,
        "step": pl.Int64,
        "thought": pl.Utf8,
        "action": pl.Utf8,
        "response": pl.Utf8,
        "observation": pl.Utf8,
        "valid": pl.Boolean,
        "reward": pl.Float64,
        "done": pl.Boolean,
        "n_prompt_tokens": pl.Int64,
        "n_gen_tokens": pl.Int64,
        "gen_s": pl.Float64,
        "env_s": pl.Float64,
    },
)

TRAJECTORIES = Artifact(
    "trajectories",
    "one trajectory",
    {
        "group_id": pl.Utf8,
        "traj_idx": pl.Int64,
        "task_id": pl.Utf8,
        "task_type": pl.Utf8,
        "seed": pl.Int64,
        "reward": pl.Float64,
        "success": pl.Boolean,
        "n_steps": pl.Int64,
        "ended_by": pl.Utf8,
        "n_gen_tokens": pl.Int64,
    },
)

GROUPS = Artifact(
    "groups",
    "one group",
    {
        "group_id": pl.Utf8,
        "task_id": pl.Utf8,
        "task_type": pl.Utf8,
        "G": pl.Int64,
        "reward_mean": pl.Float64,
        "reward_var": pl.Float64,
        "label": pl.Utf8,
        "zero_var": pl.Boolean,
        "cut": pl.Boolean,
        "cut_step": pl.Int64,
        "arm": pl.Utf8,
    },
)

SIGNALS = Artifact(
    "signals",
    "one (group_id, K)",
    {
        "group_id": pl.Utf8,
        "task_type": pl.Utf8,
        "K": pl.Int64,
        **{name: pl.Float64 for name in SIGNAL_NAMES},
        "reward_var": pl.Float64,
        "label": pl.Utf8,
    },
)

CORRELATION = Artifact(
    "correlation",
    "one (K, metric)",
    {
        "K": pl.Int64,
        "metric": pl.Utf8,
        "n": pl.Int64,
        "spearman_rho": pl.Float64,
        "p_value": pl.Float64,
        "auroc": pl.Float64,
    },
)

SWEEP = Artifact(
    "sweep",
    "one (rule, K, d_L, t_high)",
    {
        "rule": pl.Utf8,
        "K": pl.Int64,
        "d_L": pl.Float64,
        "t_high": pl.Float64,
        "n_cut": pl.Int64,
        "tp": pl.Int64,
        "fp": pl.Int64,
        "precision": pl.Float64,
        "recall": pl.Float64,
        "safe_savings": pl.Float64,
        "raw_savings": pl.Float64,
    },
)

METRICS = Artifact(
    "metrics",
    "one (arm, seed, step) of training",
    {
        "arm": pl.Utf8,
        "seed": pl.Int64,
        "step": pl.Int64,
        "loss": pl.Float64,
        "grad_l2": pl.Float64,
        "zero_adv_frac": pl.Float64,
        "n_traj": pl.Int64,
        "n_tokens": pl.Int64,
    },
)

EVAL = Artifact(
    "eval",
    "one (arm, seed, iteration, task)",
    {
        "arm": pl.Utf8,
        "seed": pl.Int64,
        "iteration": pl.Int64,
        "task_id": pl.Utf8,
        "task_type": pl.Utf8,
        "success": pl.Boolean,
    },
)

ARTIFACTS: dict[str, Artifact] = {
    a.name: a for a in (STEPS, TRAJECTORIES, GROUPS, SIGNALS, CORRELATION, SWEEP, METRICS, EVAL)
}


def _compatible(expected: Any, actual: pl.DataType) -> bool:
    if expected in _INTS:
        return actual in _INTS
    if expected in _FLOATS:
        return actual in _FLOATS or actual in _INTS
    if expected == pl.Utf8:
        return actual in (pl.Utf8, pl.String, pl.Categorical) or isinstance(actual, pl.Enum)
    return actual == expected


def validate(df: pl.DataFrame, artifact: Artifact, source: str | Path, allow_empty: bool = False) -> pl.DataFrame:
    """Check ``df`` against ``artifact``; return it with declared dtypes cast (ints widened).

    Raises SchemaError with one line naming ``source`` and the first bad column.
    """
    for col, dtype in artifact.columns.items():
        if col not in df.columns:
            raise SchemaError(f"{source}: missing column '{col}' ({artifact.name} table, {artifact.row} per row)")
        actual = df.schema[col]
        if not _compatible(dtype, actual):
            raise SchemaError(f"{source}: column '{col}' has type {actual}, expected {dtype}")
    if df.height == 0 and not allow_empty:
        raise SchemaError(f"{source}: the {artifact.name} table is empty")
    casts = [pl.col(c).cast(t) for c, t in artifact.columns.items() if df.schema[c] != t]
    return df.with_columns(casts) if casts else df


def read(path: str | Path, artifact: Artifact, allow_empty: bool = False) -> pl.DataFrame:
    """Read and validate a Parquet artifact. Missing or unreadable files raise SrolloutError."""
    path = Path(path)
    if not path.exists():
        raise SrolloutError(f"{path}: no such file")
    try:
        df = pl.read_parquet(path)
    except Exception as err:  # polars raises several error types for a non-Parquet file
        raise SchemaError(f"{path}: not a readable Parquet file ({type(err).__name__})") from err
    return validate(df, artifact, path, allow_empty=allow_empty)


def scan(path: str | Path, artifact: Artifact, columns: Sequence[str] | None = None, allow_empty: bool = False) -> pl.LazyFrame:
    """A Parquet artifact read lazily: the file's schema is checked as :func:`read` checks it
    (missing file, not Parquet, missing or mistyped column, empty table), nothing else is read
    until the caller collects. columns: the columns to keep (default all), cast to the declared
    dtypes. For tables too large to hold whole (a steps.parquet of millions of rows): the query
    reads only the columns and row groups it needs."""
    path = Path(path)
    if not path.exists():
        raise SrolloutError(f"{path}: no such file")
    try:
        lazy = pl.scan_parquet(path)
        file_schema = lazy.collect_schema()
        n_rows = lazy.select(pl.len()).collect().item()  # from the Parquet footer
    except Exception as err:  # polars raises several error types for a non-Parquet file
        raise SchemaError(f"{path}: not a readable Parquet file ({type(err).__name__})") from err
    validate(pl.DataFrame(schema=file_schema), artifact, path, allow_empty=True)
    if n_rows == 0 and not allow_empty:
        raise SchemaError(f"{path}: the {artifact.name} table is empty")
    keep = list(file_schema) if columns is None else list(columns)
    return lazy.select([pl.col(c).cast(artifact.columns[c]) if c in artifact.columns else pl.col(c) for c in keep])


def write(df: pl.DataFrame, path: str | Path, artifact: Artifact | None = None) -> Path:
    """Write ``df`` to ``path`` atomically (temp file + rename); validate first if ``artifact``."""
    path = Path(path)
    if artifact is not None:
        validate(df, artifact, path, allow_empty=True)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        df.write_parquet(tmp)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def write_json(obj: Any, path: str | Path) -> Path:
    """Write JSON atomically (manifest.json, summaries); non-JSON values become strings."""
    return atomic_write_json(obj, path, default=str)


def write_text(text: str, path: str | Path) -> Path:
    """Write a text file (report.md) atomically."""
    return atomic_write_text(text, path)


# --- ab-rollout (Tier 1): appended -----------------------------------------------------------

AB = Artifact(
    "ab",
    "one (task, arm, repeat) of a matched-seed A/B",
    {
        "task_id": pl.Utf8,
        "task_type": pl.Utf8,
        "group_id": pl.Utf8,
        "arm": pl.Utf8,
        "repeat": pl.Int64,
        "cut": pl.Boolean,
        "n_steps": pl.Int64,
        "n_gen_tokens": pl.Int64,
        "n_prompt_tokens": pl.Int64,
        "wall_s": pl.Float64,
        "zero_var": pl.Boolean,
        "baseline_zero_var": pl.Boolean,
    },
)
ARTIFACTS[AB.name] = AB

AB_ARMS = Artifact(
    "arms",
    "one arm of an ab-rollout (totals over its repeats)",
    {
        "arm": pl.Utf8,
        "repeats": pl.Int64,
        "groups": pl.Int64,
        "wall_s": pl.Float64,
        "gen_tokens": pl.Int64,
        "useful_groups": pl.Int64,
        "useful_per_s": pl.Float64,
        "cuts": pl.Int64,
        "skipped": pl.Int64,
        "extra_rounds": pl.Int64,
        "cap_hits": pl.Int64,
    },
)
ARTIFACTS[AB_ARMS.name] = AB_ARMS
