"""The Parquet contract between stages: every artifact's required columns with their Polars dtypes,
its value rules (:class:`Rule`), and safe read/write helpers. Readers check both and raise
:class:`~srollout.errors.SchemaError` naming the file, the column and (for a rule) the first bad
row; writes are atomic (temp file, then ``os.replace``), so a crash or a full disk leaves the
previous file in place. Each column and rule is documented in docs/artifacts.md.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from collections import namedtuple
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import polars as pl

from srollout.atomic import atomic_file, atomic_write_json, atomic_write_text
from srollout.errors import SchemaError, SrolloutError
from srollout.signal_names import AGREEMENT_UNITS, SIGNAL_NAMES, STEP_SIGNAL_NAMES


def signal_names(columns: Sequence[str]) -> tuple[str, ...]:
    """The seven signals, then the step signals among ``columns`` (a table's columns)."""
    return SIGNAL_NAMES + tuple(n for n in STEP_SIGNAL_NAMES if n in columns)


LABELS: tuple[str, ...] = ("all_fail", "mixed", "all_succeed")
# max_tokens: a verl session that spent its token budget (the agent loop's response_length)
ENDED_BY: tuple[str, ...] = ("done", "max_steps", "gate", "stalled", "lost", "max_tokens")

# dtype families a reader accepts for a declared dtype: an int column may hold any int width,
# a float column accepts ints too (a hand-made table with reward 0/1 stays valid).
_INTS = (pl.Int8, pl.Int16, pl.Int32, pl.Int64, pl.UInt8, pl.UInt16, pl.UInt32, pl.UInt64)
_FLOATS = (pl.Float32, pl.Float64)


@dataclass(frozen=True)
class Rule:
    """A documented value rule of one column (docs/artifacts.md), checked when a table is read.

    lo/hi: the closed range the values lie in (None: unbounded); values: the allowed strings;
    missing: NaN and null may appear (the contract says so, e.g. ``obs_unique_ratio`` without
    observations); otherwise a NaN or null breaks the rule. what: the rule in words.
    """

    column: str
    what: str
    lo: float | None = None
    hi: float | None = None
    values: tuple[str, ...] | None = None
    missing: bool = False

    def broken(self, s: pl.Series) -> pl.Series:
        """Boolean mask of the rows that break the rule."""
        if self.values is not None:
            bad = ~s.cast(pl.Utf8).is_in(list(self.values)).fill_null(False)
            return bad & s.is_not_null() if self.missing else bad
        absent = s.is_null()
        if s.dtype in _FLOATS:
            absent = absent | s.is_nan().fill_null(False)
        bad = pl.Series([False] * s.len()) if self.missing else absent
        if s.dtype in _FLOATS:  # ±inf breaks every numeric rule, NaN allowed or not
            bad = bad | s.is_infinite().fill_null(False)
        # polars orders NaN above every number: compare only the values that are there
        if self.lo is not None:
            bad = bad | ((s < self.lo).fill_null(False) & ~absent)
        if self.hi is not None:
            bad = bad | ((s > self.hi).fill_null(False) & ~absent)
        return bad


def _unit(column: str, symbol: str, missing: bool = False) -> Rule:
    return Rule(
        column,
        f"{symbol} lies in [0, 1]" + (" (NaN allowed)" if missing else ", never NaN"),
        0.0,
        1.0,
        missing=missing,
    )


def _count(column: str, lo: int = 0, missing: bool = False) -> Rule:
    return Rule(column, f"a count >= {lo}", lo, missing=missing)


def _logprob(column: str) -> Rule:
    return Rule(column, "a log-probability <= 0 (NaN: the policy has none)", hi=0.0, missing=True)


# Optional for tables made before them: the policy's own log-probabilities of a step's response
# (srollout.policy.base.ActResponse, since 2026-11-27) and the trajectory's own signals after the
# step (srollout.core.trajectory_signals, since 2026-12-01).
STEP_LOGPROB_COLUMNS: tuple[str, ...] = ("logprob_mean", "logprob_min")
STEP_TRAJECTORY_COLUMNS: tuple[str, ...] = ("steps_since_new", "rejected_run")


def _seconds(column: str) -> Rule:
    return Rule(column, "seconds >= 0", 0.0, missing=True)


_FINITE_REWARD = Rule("reward", "a finite reward (not NaN or ±inf)")
_GROUP_OUTCOME = (
    Rule("reward_var", "a population variance >= 0, never NaN", 0.0),
    Rule("label", "one of " + ", ".join(LABELS), values=LABELS),
)


@dataclass(frozen=True)
class Artifact:
    """One Parquet artifact: file name, required columns (name -> dtype), what a row is, and the
    value rules of its columns (:class:`Rule`, checked by :func:`read`). optional: columns (name
    -> dtype) that later versions write and a reader takes when they are there: typed and
    rule-checked when present, never required (a table written before them still reads)."""

    name: str
    row: str
    columns: Mapping[str, Any]
    rules: tuple[Rule, ...] = ()
    optional: Mapping[str, Any] = field(default_factory=dict)

    def dtypes(self, df_columns: Sequence[str]) -> dict[str, Any]:
        """The declared dtype of every required column and of the optional ones in
        ``df_columns``."""
        present = {c: t for c, t in self.optional.items() if c in df_columns}
        return {**self.columns, **present}

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
    (
        _count("traj_idx"),
        Rule("step", "1-based: step >= 1", 1),
        _FINITE_REWARD,
        _count("n_prompt_tokens", missing=True),
        _count("n_gen_tokens", missing=True),
        _seconds("gen_s"),
        _seconds("env_s"),
        *(_logprob(c) for c in STEP_LOGPROB_COLUMNS),
        *(_count(c, missing=True) for c in STEP_TRAJECTORY_COLUMNS),
    ),
    optional={
        **{c: pl.Float64 for c in STEP_LOGPROB_COLUMNS},
        **{c: pl.Int64 for c in STEP_TRAJECTORY_COLUMNS},
    },
)

# A steps row: its group's and trajectory's keys (added by srollout.rollout.records) and the
# columns one step fills, StepRow, made from STEPS (the one declaration): the engine fills it by
# name, so a column it leaves out or one the contract does not declare is an error.
STEP_KEYS: tuple[str, ...] = ("group_id", "traj_idx", "task_id", "task_type")
StepRow = namedtuple(
    "StepRow", [c for c in (*STEPS.columns, *STEPS.optional) if c not in STEP_KEYS]
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
    (
        _count("traj_idx"),
        _FINITE_REWARD,
        _count("n_steps"),
        Rule("ended_by", "one of " + ", ".join(ENDED_BY), values=ENDED_BY),
        _count("n_gen_tokens", missing=True),
        Rule("shadow_stop_step", "a step >= 1 (null when not stopped)", 1, missing=True),
        Rule("audited_stop", "a step >= 1 (null when not an audited stop)", 1, missing=True),
    ),
    # written by collect --shadow / --audit only (docs/artifacts.md)
    optional={"shadow_stop_step": pl.Int64, "audited_stop": pl.Int64},
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
    (
        Rule("G", "G >= 2 trajectories per group", 2),
        Rule("reward_mean", "a finite mean reward"),
        *_GROUP_OUTCOME,
        Rule("cut_step", "K >= 1 (null when not cut)", 1, missing=True),
        Rule("shadow_cut_step", "K >= 1 (null when the gate would not cut)", 1, missing=True),
    ),
    # written by a run with --audit > 0 / collect --shadow only (docs/artifacts.md)
    optional={"audited": pl.Boolean, "shadow_cut_step": pl.Int64},
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
    (
        Rule("K", "K >= 1", 1),
        *(_unit(name, unit, missing) for name, (unit, missing) in AGREEMENT_UNITS.items()),
        *_GROUP_OUTCOME,
        Rule(
            "action_logprob_mean",
            "a mean log-probability <= 0 (NaN: the policy gave none)",
            hi=0.0,
            missing=True,
        ),
        _unit("invalid_action_rate", "a share of steps", missing=True),
    ),
    optional={name: pl.Float64 for name in STEP_SIGNAL_NAMES},
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
    (
        _count("n"),
        Rule("spearman_rho", "ρ lies in [-1, 1] (NaN allowed)", -1.0, 1.0, missing=True),
        _unit("p_value", "a p-value", missing=True),
        _unit("auroc", "an AUROC", missing=True),
    ),
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
    (
        Rule("K", "K >= 1", 1),
        _unit("d_L", "d_L"),
        _unit("t_high", "t_high", missing=True),
        *map(_count, ("n_cut", "tp", "fp")),
        _unit("precision", "a precision", missing=True),
        _unit("recall", "a recall", missing=True),
    ),
)

METRICS = Artifact(
    "metrics",
    "one (arm, seed, step) of train-offpolicy or (arm, seed, iteration) of train-onpolicy",
    {
        "arm": pl.Utf8,
        "seed": pl.Int64,
        "train/loss": pl.Float64,
        "train/grad_l2": pl.Float64,
        "train/zero_adv_frac": pl.Float64,
        "train/trajectories": pl.Int64,
        "train/action_tokens": pl.Int64,
    },
    (
        Rule("train/grad_l2", "an L2 norm >= 0 (NaN allowed)", 0.0, missing=True),
        _unit("train/zero_adv_frac", "a share of trajectories", missing=True),
        _count("train/trajectories"),
        _count("train/action_tokens"),
    ),
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
    (_count("iteration"),),
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


def validate(
    df: pl.DataFrame, artifact: Artifact, source: str | Path, allow_empty: bool = False
) -> pl.DataFrame:
    """Check ``df`` against ``artifact``; return it with declared dtypes cast (ints widened).

    Raises SchemaError with one line naming ``source`` and the first bad column.
    """
    for col, dtype in artifact.columns.items():
        if col not in df.columns:
            raise SchemaError(
                f"{source}: missing column '{col}' ({artifact.name} table, {artifact.row} per row)"
            )
        actual = df.schema[col]
        if not _compatible(dtype, actual):
            raise SchemaError(f"{source}: column '{col}' has type {actual}, expected {dtype}")
    for col, dtype in artifact.optional.items():
        actual = df.schema.get(col)
        if actual is not None and not _compatible(dtype, actual):
            raise SchemaError(f"{source}: column '{col}' has type {actual}, expected {dtype}")
    if df.height == 0 and not allow_empty:
        raise SchemaError(f"{source}: the {artifact.name} table is empty")
    declared = artifact.dtypes(df.columns)
    casts = [pl.col(c).cast(t) for c, t in declared.items() if df.schema[c] != t]
    return df.with_columns(casts) if casts else df


def check_rules(df: pl.DataFrame, artifact: Artifact, source: str | Path) -> pl.DataFrame:
    """Enforce ``artifact.rules`` on a validated table; return it unchanged.

    Raises SchemaError with one line naming ``source``, the column, the first bad row (counting
    from 0, in file order), its value and the rule.
    """
    for rule in artifact.rules:
        if rule.column not in df.columns:
            continue
        bad = rule.broken(df[rule.column])
        if bad.any():
            row = int(bad.arg_true()[0])
            value = df[rule.column][row]
            raise SchemaError(
                f"{source}: column '{rule.column}' row {row} is {value!r}: the contract says "
                f"{rule.what} ({int(bad.sum())} bad row(s); docs/artifacts.md)"
            )
    return df


def read(
    path: str | Path,
    artifact: Artifact,
    allow_empty: bool = False,
    columns: Sequence[str] | None = None,
) -> pl.DataFrame:
    """Read and validate a Parquet artifact: required columns and types (:func:`validate`), then
    every value rule of the contract (:func:`check_rules`). Missing or unreadable files raise
    SrolloutError; every failure is one line. columns: read only these (a reader that needs a
    few columns of a large or hand-made table); each must be there, and only they are checked."""
    path = Path(path)
    if not path.exists():
        raise SrolloutError(f"{path}: no such file")
    if path.is_dir():
        raise SrolloutError(f"{path}: is a directory, not a {artifact.filename}")
    if columns is None:
        with _parquet(path):
            df = pl.read_parquet(path)
    else:
        missing = [c for c in columns if c not in column_names(path)]
        if missing:
            raise SchemaError(
                f"{path}: missing column(s) {', '.join(missing)} ({artifact.name} table, "
                f"{artifact.row} per row)"
            )
        with _parquet(path):
            df = pl.read_parquet(path, columns=list(columns))
        kept = {c: t for c, t in artifact.columns.items() if c in columns}
        artifact = dataclasses.replace(artifact, columns=kept)
    return check_rules(validate(df, artifact, path, allow_empty=allow_empty), artifact, path)


@contextlib.contextmanager
def _parquet(path: str | Path) -> Iterator[None]:
    """Around opening a Parquet file: polars' failures (several types, or a panic) as one line."""
    try:
        yield
    except (Exception, pl.exceptions.PanicException) as err:
        raise SchemaError(f"{path}: not a readable Parquet file ({type(err).__name__})") from err


def column_names(path: str | Path) -> list[str]:
    """The columns of a Parquet file, from its footer; one line if it is not readable Parquet."""
    with _parquet(path):
        return list(pl.read_parquet_schema(path))


def scan(
    path: str | Path,
    artifact: Artifact,
    columns: Sequence[str] | None = None,
    allow_empty: bool = False,
) -> pl.LazyFrame:
    """A Parquet artifact read lazily: the file's schema is checked as :func:`read` checks it
    (missing file, not Parquet, missing or mistyped column, empty table), nothing else is read
    until the caller collects. columns: the columns to keep (default all), cast to the declared
    dtypes. For tables too large to hold whole (a steps.parquet of millions of rows): the query
    reads only the columns and row groups it needs."""
    path = Path(path)
    if not path.exists():
        raise SrolloutError(f"{path}: no such file")
    with _parquet(path):
        lazy = pl.scan_parquet(path)
        file_schema = lazy.collect_schema()
        n_rows = lazy.select(pl.len()).collect().item()  # from the Parquet footer
    validate(pl.DataFrame(schema=file_schema), artifact, path, allow_empty=True)
    if n_rows == 0 and not allow_empty:
        raise SchemaError(f"{path}: the {artifact.name} table is empty")
    keep = list(file_schema) if columns is None else list(columns)
    declared = artifact.dtypes(list(file_schema))
    return lazy.select([pl.col(c).cast(declared[c]) if c in declared else pl.col(c) for c in keep])


@contextlib.contextmanager
def reading(path: str | Path) -> Iterator[None]:
    """Around the ``collect()`` of a table read with :func:`scan`: polars reads the file's pages
    only then, so a file whose footer is sound but whose data is damaged fails there; that is
    one line naming the file, not a polars traceback."""
    try:
        yield
    except (pl.exceptions.PolarsError, pl.exceptions.PanicException) as err:
        # a damaged page can also make polars' reader panic (a BaseException, not an Exception)
        reason = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise SchemaError(
            f"{path}: reading it failed, the file looks damaged ({reason[:160]})"
        ) from err


def check_rules_lazy(lazy: pl.LazyFrame, artifact: Artifact, source: str | Path) -> pl.LazyFrame:
    """:func:`check_rules` for a table read with :func:`scan`: reads only the columns of
    ``lazy`` that have a rule (numbers, small next to a steps table's texts); returns ``lazy``."""
    names = set(lazy.collect_schema().names())
    ruled = sorted({r.column for r in artifact.rules if r.column in names})
    if ruled:
        with reading(source):
            table = lazy.select(ruled).collect()
        check_rules(table, artifact, source)
    return lazy


def write(df: pl.DataFrame, path: str | Path, artifact: Artifact | None = None) -> Path:
    """Write ``df`` to ``path`` atomically (temp file + rename); validate first if ``artifact``."""
    if artifact is not None:
        validate(df, artifact, Path(path), allow_empty=True)
    return atomic_file(path, lambda tmp: dump_parquet(df, tmp))


def dump_parquet(df: pl.DataFrame, path: str | Path) -> None:
    """Write ``df`` as Parquet to ``path`` (not atomic: callers write a temp file) and fsync it.

    The bytes are made in memory and written by Python, so a disk that fills raises OSError
    ENOSPC, which the CLI reports as such (polars' own writer reports it as a thrift transport
    error that says nothing about space).
    """
    import io

    buf = io.BytesIO()
    df.write_parquet(buf)
    with open(path, "wb") as fh:
        fh.write(buf.getbuffer())
        fh.flush()
        os.fsync(fh.fileno())


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
    (
        _count("repeat"),
        *(_count(c, missing=True) for c in ("n_steps", "n_gen_tokens", "n_prompt_tokens")),
        _seconds("wall_s"),
    ),
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

# --- collect --audit: appended -----------------------------------------------------------------

AUDIT = Artifact(
    "audit",
    "one chunk of groups of an audited collect (collect --audit F)",
    {
        "chunk": pl.Int64,
        "first_group": pl.Int64,
        "groups": pl.Int64,
        "gate/cuts": pl.Int64,
        "gate/audited": pl.Int64,
        "gate/audit_tp": pl.Int64,
        "gate/audit_fp": pl.Int64,
        "gate/precision_lb": pl.Float64,
        "gate/threshold": pl.Float64,
        "gate/audit_steps": pl.Int64,
        # the trajectory gate's audit (zeros, NaN bound and W 0 without the trajectory gate)
        "gate/stalled": pl.Int64,
        "gate/stop_audited": pl.Int64,
        "gate/stop_audit_tp": pl.Int64,
        "gate/stop_audit_fp": pl.Int64,
        "gate/stop_precision_lb": pl.Float64,
        "gate/stall_W": pl.Int64,
        "gate/stop_audit_steps": pl.Int64,
    },
    (
        Rule("chunk", "1-based: chunk >= 1", 1),
        _count("first_group"),
        _count("groups", 1),
        *map(_count, ("gate/cuts", "gate/audited", "gate/audit_tp", "gate/audit_fp")),
        _unit("gate/precision_lb", "a precision bound", missing=True),
        # NaN when the run audits only the trajectory gate
        _unit("gate/threshold", "the threshold (d_L, or a learned gate's t)", missing=True),
        *map(_count, ("gate/audit_steps", "gate/stalled", "gate/stop_audited")),
        *map(_count, ("gate/stop_audit_tp", "gate/stop_audit_fp")),
        _unit("gate/stop_precision_lb", "a precision bound", missing=True),
        _count("gate/stall_W"),
        _count("gate/stop_audit_steps"),
    ),
)
ARTIFACTS[AUDIT.name] = AUDIT
