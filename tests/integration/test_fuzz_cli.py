"""Fuzz (hypothesis) of the CLI's numeric and path options and of corrupted Parquet tables.

Every case must end in success (exit 0, a run directory whose manifest says ``complete``) or in
exit 2 with exactly one line on stderr and no run directory left behind (an ``--out`` that
existed before is left as it was). A traceback is an exception escaping ``main()``: the test
fails with it. The CLI runs in this process through its entry point (``run_cli``), so the
examples are cheap; bounded ``max_examples`` keep the default suite to a few tens of seconds,
the ``slow`` variant runs more.
"""

from __future__ import annotations

import json
import math
import shutil
import tempfile
from pathlib import Path

import polars as pl
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from srollout import schemas
from tests.conftest import HAND_BUFFER, build_steps

FAST = settings(
    max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
MORE = settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> dict[str, Path]:
    """A valid steps run, a valid signals file (from analyze), and some things that are not."""
    root = tmp_path_factory.mktemp("fuzz-inputs")
    run = root / "buffer"
    schemas.write(build_steps(HAND_BUFFER), run / "steps.parquet", schemas.STEPS)
    from srollout.config import AnalyzeConfig
    from srollout.stages.analyze import run_analyze

    run_analyze(AnalyzeConfig(input=run, K=(2, 4, 10), figures=False, out=root / "analyzed"))
    (root / "empty").mkdir()
    (root / "text.parquet").write_text("not parquet\n")
    shutil.copy(root / "analyzed" / "correlation.parquet", root / "other.parquet")
    (root / "a-file").write_text("x")
    return {
        "steps-run": run,
        "steps-file": run / "steps.parquet",
        "signals-file": root / "analyzed" / "signals.parquet",
        "missing": root / "missing",
        "empty-dir": root / "empty",
        "text": root / "text.parquet",
        "other-artifact": root / "other.parquet",
        "a-file": root / "a-file",
    }


def _check(res, out: Path, out_existed_as: set[str] | None) -> None:
    """Success with a complete run, or exit 2 with one line and nothing left behind."""
    lines = [line for line in res.stderr.splitlines() if line.strip()]
    event(f"exit {res.exit_code}")  # --hypothesis-show-statistics: how many cases succeeded
    if res.exit_code == 0:
        manifest = json.loads((out / "manifest.json").read_text())
        assert manifest["status"] == "complete"
        return
    assert res.exit_code == 2, (res.exit_code, res.stderr[-2000:])
    assert len(lines) == 1 and lines[0].startswith("error: "), res.stderr
    if out_existed_as is None:
        assert not out.exists(), f"exit 2 left {out}"
    elif out_existed_as == {"<a file>"}:
        assert out.is_file() and out.read_text() == "x"
    else:
        assert {p.name for p in out.iterdir()} == out_existed_as


def _out_dir(kind: str, scratch: Path, inputs: dict[str, Path]) -> tuple[Path, set[str] | None]:
    if kind == "new":
        return scratch / "out", None
    if kind == "nested-new":
        return scratch / "a" / "b" / "out", None
    if kind == "existing-full":
        out = scratch / "full"
        out.mkdir()
        (out / "keep.txt").write_text("user data")
        return out, {"keep.txt"}
    if kind == "under-a-file":
        return inputs["a-file"] / "out", None
    return inputs["a-file"], {"<a file>"}  # the --out is a file


NUMBERS = st.one_of(
    st.integers(-5, 60).map(str),
    st.integers(1, 30).map(str),
    st.sampled_from(["0", "-0", "1e9", "nan", "inf", "-inf", "x", "", "3.5", "1,2"]),
)
FLOATS = st.one_of(
    st.floats(-2, 3, allow_nan=False).map(lambda v: f"{v:.3g}"),
    st.floats(0, 1).map(lambda v: f"{v:.3g}"),
    st.sampled_from(["nan", "inf", "-inf", "-1e-9", "1.0000001", "x", ""]),
)
GRIDS = st.one_of(
    st.tuples(FLOATS, FLOATS, FLOATS).map(":".join),
    st.lists(FLOATS, min_size=1, max_size=4).map(",".join),
    st.sampled_from(["0:1:0", "1:0:0.1", "0:1:-0.1", "0.05:0.3:0.05", "0.1", "::", ""]),
)
K_LISTS = st.one_of(
    st.lists(st.integers(-2, 12), min_size=1, max_size=3).map(lambda ks: ",".join(map(str, ks))),
    st.sampled_from(["", ",", "2,,4", "a", "2.5", "99999999999999999999"]),
)
INPUTS = st.sampled_from(
    [
        "steps-run",
        "steps-file",
        "signals-file",
        "steps-run",
        "steps-file",
        "signals-file",
        "missing",
        "empty-dir",
        "text",
        "other-artifact",
    ]
)
OUTS = st.sampled_from(
    ["new", "new", "new", "nested-new", "existing-full", "under-a-file", "a-file"]
)


def _some(draw, options: tuple) -> dict[str, str]:
    """At most two of ``options`` (name, strategy), drawn: the others keep their valid defaults,
    so that a fair share of the cases succeed and reach the writing code too."""
    chosen = draw(st.lists(st.sampled_from(options), max_size=2, unique_by=lambda o: o[0]))
    return {key: draw(strategy) for key, strategy in chosen}


def _sweep_args(draw_opts: dict[str, str]) -> list[str]:
    return [item for key, value in draw_opts.items() for item in (key, value)]


@st.composite
def sweep_cases(draw):
    opts = _some(
        draw,
        (
            ("--K", K_LISTS),
            ("--d-L-grid", GRIDS),
            ("--t-high-grid", GRIDS),
            ("--T-max", NUMBERS),
            ("--precision-floor", FLOATS),
            ("--n-boot", st.integers(-3, 120).map(str)),
            ("--n-random", st.integers(-2, 6).map(str)),
            ("--seed", NUMBERS),
            ("--rule", st.sampled_from(["r1", "r3", "both", "r2", ""])),
        ),
    )
    opts.setdefault("--n-boot", "50")
    return draw(INPUTS), draw(OUTS), opts


@st.composite
def analyze_cases(draw):
    opts = _some(
        draw, (("--K", K_LISTS), ("--gate-K", NUMBERS), ("--d-L", FLOATS), ("--seed", NUMBERS))
    )
    return draw(INPUTS), draw(OUTS), opts


def _run_case(run_cli, inputs, command: str, case) -> None:
    source, out_kind, opts = case
    scratch = Path(tempfile.mkdtemp(prefix="fuzz-"))
    try:
        out, existed = _out_dir(out_kind, scratch, inputs)
        extra = ["--no-figures"] if command == "analyze" else []
        res = run_cli(command, inputs[source], *_sweep_args(opts), *extra, "--out", out)
        _check(res, out, existed)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


@FAST
@given(case=sweep_cases())
def test_sweep_options_and_paths(run_cli, inputs, case):
    _run_case(run_cli, inputs, "sweep", case)


@FAST
@given(case=analyze_cases())
def test_analyze_options_and_paths(run_cli, inputs, case):
    _run_case(run_cli, inputs, "analyze", case)


# --- corrupted Parquet tables ------------------------------------------------------------------

CELLS = st.sampled_from([math.nan, math.inf, -math.inf, -1.0, 1.5, 1e300, None, 0.0, 1.0])


@st.composite
def corruptions(draw):
    """(table, how) where how corrupts the bytes or the values of a valid table."""
    table = draw(st.sampled_from(["signals", "steps"]))
    how = draw(
        st.sampled_from(
            ["truncate", "flip", "drop-column", "retype", "cell", "duplicate", "empty", "shuffle"]
        )
    )
    return table, how, draw(st.integers(0, 10**6)), draw(st.integers(0, 255)), draw(CELLS)


def _corrupt(path: Path, how: str, where: int, byte: int, cell: object) -> None:
    if how in ("truncate", "flip"):
        data = bytearray(path.read_bytes())
        i = where % len(data)
        if how == "truncate":
            path.write_bytes(bytes(data[:i]))
        else:
            data[i] = byte
            path.write_bytes(bytes(data))
        return
    df = pl.read_parquet(path)
    col = df.columns[where % df.width]
    if how == "drop-column":
        df = df.drop(col)
    elif how == "retype":
        df = df.with_columns(pl.col(col).cast(pl.Utf8))
    elif how == "cell":
        numeric = [c for c, t in df.schema.items() if t in (pl.Float64, pl.Int64)]
        col = numeric[where % len(numeric)]
        row = where % df.height
        values = df[col].to_list()
        if (
            cell is not None and df.schema[col] == pl.Int64
        ):  # an int column: the nearest int64, or null
            cell = int(max(min(cell, 2**62), -(2**62))) if math.isfinite(cell) else None
        values[row] = cell
        df = df.with_columns(pl.Series(col, values, dtype=df.schema[col]))
    elif how == "duplicate":
        df = pl.concat([df, df.slice(where % df.height, 1)])
    elif how == "empty":
        df = df.clear()
    else:
        df = df.sample(fraction=1.0, shuffle=True, seed=where)
    df.write_parquet(path)


def _run_corrupted(run_cli, inputs, case) -> None:
    table, how, where, byte, cell = case
    scratch = Path(tempfile.mkdtemp(prefix="fuzz-"))
    try:
        path = scratch / f"{table}.parquet"
        shutil.copy(inputs["signals-file" if table == "signals" else "steps-file"], path)
        _corrupt(path, how, where, byte, cell)
        for command, opts in (
            ("sweep", ["--K", "4", "--n-boot", "50"]),
            ("analyze", ["--no-figures"]),
        ):
            out = scratch / f"out-{command}"
            _check(run_cli(command, path, *opts, "--out", out), out, None)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


@FAST
@given(case=corruptions())
def test_corrupted_tables(run_cli, inputs, case):
    _run_corrupted(run_cli, inputs, case)


# --- collect's numeric options (the noisy expert: no model, seconds per run) ----------------------


@st.composite
def collect_cases(draw):
    opts = {
        "--policy": "noisy-expert",
        "--groups": draw(st.sampled_from(["1", "2", "1", "0", "-1", "x"])),
        "--G": draw(st.sampled_from(["2", "3", "2", "1", "0", "-1"])),
        "--T-max": draw(st.sampled_from(["3", "5", "3", "1", "0", "-1"])),
    }
    opts.update(
        _some(
            draw,
            (
                ("--K", NUMBERS),
                ("--d-L", FLOATS),
                ("--eps", FLOATS),
                ("--temperature", FLOATS),
                ("--top-p", FLOATS),
                ("--concurrency", NUMBERS),
                ("--signal-K", K_LISTS),
                ("--seed", NUMBERS),
            ),
        )
    )
    return opts, draw(st.sampled_from(["new", "new", "new", "existing-full", "a-file"]))


@settings(
    max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(case=collect_cases())
def test_collect_numeric_options(run_cli, inputs, case):
    opts, out_kind = case
    scratch = Path(tempfile.mkdtemp(prefix="fuzz-"))
    try:
        out, existed = _out_dir(out_kind, scratch, inputs)
        _check(run_cli("collect", *_sweep_args(opts), "--out", out), out, existed)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


@pytest.mark.slow
@MORE
@given(
    case=st.one_of(
        sweep_cases().map(lambda c: ("sweep", c)),
        analyze_cases().map(lambda c: ("analyze", c)),
        corruptions().map(lambda c: ("corrupt", c)),
    )
)
def test_many_more_cases(run_cli, inputs, case):
    kind, body = case
    if kind == "corrupt":
        _run_corrupted(run_cli, inputs, body)
    else:
        _run_case(run_cli, inputs, kind, body)
