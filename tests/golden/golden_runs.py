"""Golden runs: small, seeded runs of every stage whose Parquet artifacts must not change when the
code is reorganised: a redesign keeps behaviour (same seeds, same tables).

    # after a deliberate change of behaviour: record the tables again
    python tests/golden/golden_runs.py --write
    # compare against tests/golden/golden.json (exit 1 and one line per difference)
    python tests/golden/golden_runs.py

What is recorded, per table (columns that measure time or memory are dropped first):
- its row count and its columns with their dtypes, in order;
- every column that is not a float (integers, strings, booleans, lists of them: cuts, tokens,
  actions, labels, counts) as a digest of its values, compared exactly;
- every float column's values themselves, compared within a tolerance of the column's kind
  (``float_kind``): log-probabilities absolutely (``LOGPROB_ATOL``), every other float relatively
  (``FLOAT_RTOL`` / ``FLOAT_ATOL``).

Why a tolerance: floats computed by the policy or in training (log-probs, losses, gradient norms)
come from the CPU's own kernels (SIMD width, oneDNN, MKL), and float sums are not associative, so
they differ in their last bits from one processor to another. Each tolerance is set from a
measurement (``benchmarks/golden_noise.py``, docs/reliability.md, "What is reproducible where"):
the largest difference seen between kernel choices, times a wide margin, and far below what a
real change does (``tests/golden/test_golden_mutations.py`` shows an off-by-one in the advantage
or the loss denominator, and log-probs taken after the temperature, still fail;
``test_golden_noise.py`` reruns the collects with the logits perturbed by another CPU's noise and
they still pass).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import NamedTuple

HERE = Path(__file__).resolve().parent
GOLDEN = HERE / "golden.json"

# Floats agree when |now - recorded| <= FLOAT_ATOL + FLOAT_RTOL * |recorded|. Measured
# (benchmarks/golden_noise.py, docs/bench/golden_noise.md, 2026-11-26): the largest relative
# difference of any training float between kernel choices on one machine (ATen default/AVX2,
# oneDNN SSE4.1/AVX2, MKL COMPATIBLE, 1 or 2 threads) is 1.8e-6; the smallest real change tried,
# the advantage's eps 1e-6 -> 1e-4, moves the loss by 2.3e-4 (test_golden_mutations.py). 2e-5 sits
# 11x above that noise and 11x below that change.
FLOAT_RTOL = 2e-5
FLOAT_ATOL = 1e-7

# Log-probabilities agree when |now - recorded| <= LOGPROB_ATOL, whatever their size. A log-prob is
# a logit minus the log-sum-exp of all logits, so its error across CPUs is the logits' absolute
# error (at most twice it), not a share of its own value; the policy's log-probs sit near zero
# (-3e-4 for a confident token), where rtol 2e-5 + atol 1e-7 allow 1.1e-7 and fail on noise.
# Measured (benchmarks/golden_noise.py --logits, docs/bench/golden_noise.md, 2026-12-01, Intel Xeon
# AVX-512): between kernel choices the shipped policy's logits move by at most 1.4e-5 and any
# log-prob by at most 2.2e-5; the golden log-prob columns recorded on an AMD EPYC differ on that
# Intel machine by at most 4.7e-6. 2e-4 sits 9x above the log-probs' noise, and a real change
# (log-probs after the temperature instead of before, test_golden_mutations.py) still fails it.
# The columns: steps' logprob_mean / logprob_min, signals' action_logprob_mean, training's
# train/mean_logp (``float_kind``).
LOGPROB_ATOL = 2e-4
LOGPROB_COLUMN = re.compile(r"logprob|logp\b|logp_")


def float_kind(column: str) -> str:
    """``"logprob"`` for a column that holds log-probabilities (or a mean or minimum of them),
    ``"float"`` for every other float column: the kind picks the tolerance."""
    return "logprob" if LOGPROB_COLUMN.search(column) else "float"


# name -> srollout arguments; {D} is the runs directory. Order matters: later runs read earlier
# ones.
RUNS: dict[str, list[str]] = {
    "collect-lm": [
        "collect",
        "--groups",
        "4",
        "--G",
        "4",
        "--T-max",
        "6",
        "--seed",
        "3",
        "--signal-K",
        "2,4",
    ],
    "collect-lm-gated": [
        "collect",
        "--groups",
        "4",
        "--G",
        "4",
        "--T-max",
        "6",
        "--seed",
        "3",
        "--signal-K",
        "2,4",
        "--K",
        "3",
        "--d-L",
        "0.5",
    ],
    "collect-expert": [
        "collect",
        "--policy",
        "noisy-expert",
        "--groups",
        "40",
        "--G",
        "8",
        "--T-max",
        "12",
        "--seed",
        "5",
        "--signal-K",
        "5,10",
    ],
    "analyze": ["analyze", "{D}/collect-expert", "--K", "5,10", "--gate-K", "5", "--no-figures"],
    "sweep": ["sweep", "{D}/collect-expert", "--K", "5", "--T-max", "12", "--n-boot", "200"],
    "ab-rollout": [
        "ab-rollout",
        "--policy",
        "noisy-expert",
        "--groups",
        "8",
        "--G",
        "4",
        "--T-max",
        "8",
        "--K",
        "3",
        "--d-L",
        "0.3",
        "--repeats",
        "1",
        "--blocks",
        "2",
        "--no-warmup",
        "--no-figures",
        "--n-boot",
        "100",
    ],
    "train-offpolicy": [
        "train-offpolicy",
        "{D}/collect-lm",
        "--steps",
        "2",
        "--groups-per-step",
        "2",
        "--K",
        "3",
        "--d-L",
        "0.5",
        "--seed",
        "1",
    ],
    # T_max 12, not tiny's 4: the baseline then trains on mixed groups (non-zero loss and
    # gradient at iterations 2 and 3, and iteration 3 rolls out with trained weights)
    "train-onpolicy": ["train-onpolicy", "--preset", "tiny", "--seeds", "7", "--T-max", "12"],
}

# Columns that measure time or memory, or name the machine: dropped before recording.
VOLATILE = re.compile(
    r"(_s$|_s_|^wall|time|_per_s|tok_s|per_sec|rss|memory|_mb$|_gb$|^date|host|machine|utc)"
)


def _is_float(dtype) -> bool:
    import polars as pl

    inner = dtype.inner if isinstance(dtype, (pl.List, pl.Array)) else dtype
    return inner.is_float()


def table_record(path: Path) -> dict:
    """What golden.json keeps of one Parquet table: rows, columns with dtypes, a digest per exact
    column, the values of every float column."""
    import polars as pl

    df = pl.read_parquet(path)
    df = df.select([c for c in df.columns if not VOLATILE.search(c)])
    exact, floats = {}, {}
    for name, dtype in zip(df.columns, df.dtypes, strict=True):
        column = df.select(name)
        if _is_float(dtype):
            floats[name] = column.to_series().to_list()
        else:
            text = str(dtype) + column.write_ndjson()
            exact[name] = hashlib.sha256(text.encode()).hexdigest()[:16]
    return {
        "rows": df.height,
        "columns": {n: str(t) for n, t in zip(df.columns, df.dtypes, strict=True)},
        "exact": exact,
        "floats": floats,
    }


class Difference(NamedTuple):
    """One way a table differs from its recording; ``str()`` is the line a failure prints."""

    table: str
    column: str | None
    row: int | None
    recorded: object
    now: object

    def __str__(self) -> str:
        where = self.table + (f" column {self.column!r}" if self.column else "")
        where += f" row {self.row}" if self.row is not None else ""
        return f"{where}: recorded {self.recorded!r} now {self.now!r}"


def floats_agree(recorded: float | None, now: float | None, kind: str = "float") -> bool:
    """Equal within the tolerance of ``kind`` (``float_kind``): LOGPROB_ATOL absolutely for a
    log-prob, FLOAT_RTOL / FLOAT_ATOL for any other float; NaN equals NaN, nulls and infinities
    exactly."""
    if recorded is None or now is None:
        return recorded is now
    if math.isnan(recorded) or math.isnan(now):
        return math.isnan(recorded) and math.isnan(now)
    if math.isinf(recorded) or math.isinf(now):
        return recorded == now
    if kind == "logprob":
        return abs(now - recorded) <= LOGPROB_ATOL
    return abs(now - recorded) <= FLOAT_ATOL + FLOAT_RTOL * abs(recorded)


def flat_cells(values: list) -> list:
    """A float column's cells, a list column's lists flattened in order (None kept)."""
    out = []
    for v in values:
        out.extend(v if isinstance(v, list) else [v])
    return out


def compare_table(table: str, recorded: dict | None, now: dict | None) -> list[Difference]:
    """Every difference between a table's recording and its record now: a missing table, the
    rows, the columns and dtypes, each exact column, and each float cell out of its kind's
    tolerance (at most 5 per column, naming the row)."""
    if recorded is None or now is None:
        return [Difference(table, None, None, "present" if recorded else "absent",
                           "present" if now else "absent")]  # fmt: skip
    out = []
    if recorded["rows"] != now["rows"]:
        out.append(Difference(table, None, None, f"{recorded['rows']} rows", f"{now['rows']} rows"))
    if recorded["columns"] != now["columns"]:
        out.append(Difference(table, None, None, recorded["columns"], now["columns"]))
    if out:
        return out
    for name, digest in recorded["exact"].items():
        if now["exact"][name] != digest:
            out.append(Difference(table, name, None, f"digest {digest}", now["exact"][name]))
    for name, values in recorded["floats"].items():
        was, got = flat_cells(values), flat_cells(now["floats"][name])
        if len(was) != len(got):
            out.append(Difference(table, name, None, f"{len(was)} values", f"{len(got)} values"))
            continue
        kind = float_kind(name)
        pairs = enumerate(zip(was, got, strict=True))
        bad = [i for i, (a, b) in pairs if not floats_agree(a, b, kind)]
        out.extend(Difference(table, name, i, was[i], got[i]) for i in bad[:5])
    return out


def compare(recorded: dict[str, dict], now: dict[str, dict]) -> list[Difference]:
    """Every difference between two sets of table records (keys: run/table path)."""
    found = []
    for table in sorted(set(recorded) | set(now)):
        found.extend(compare_table(table, recorded.get(table), now.get(table)))
    return found


# Python run before a golden run's CLI (``run_all(prelude=...)``): every forward of the
# transformers policy adds seeded uniform noise in [-amplitude, amplitude] to its logits, the size
# of another CPU's kernel noise, so one machine can check what another CPU would compute.
LOGIT_NOISE_PRELUDE = """
import torch
from srollout.policy import transformers_backend as _tb
_noise = torch.Generator().manual_seed({seed})
_init = _tb.TransformersPolicy.__init__
def _perturb(module, args, out):
    noise = torch.rand(out.logits.shape, generator=_noise, dtype=torch.float32)
    out.logits.add_((noise * 2 - 1).mul_({amplitude!r}).to(out.logits.dtype))
    return out
def _noisy_init(self, *a, **k):
    _init(self, *a, **k)
    self.model.register_forward_hook(_perturb)
_tb.TransformersPolicy.__init__ = _noisy_init
"""


def logit_noise(amplitude: float, seed: int = 0) -> str:
    """The prelude that perturbs the policy's logits by seeded noise of ``amplitude``."""
    return LOGIT_NOISE_PRELUDE.format(amplitude=float(amplitude), seed=int(seed))


def run_all(
    root: Path, only: list[str] | None = None, env: dict[str, str] | None = None, prelude: str = ""
) -> dict[str, dict]:
    """Run the golden runs (all, or the names in ``only`` with what they read already under
    ``root``) and return the record of every Parquet table they wrote.

    env: extra environment for the runs (kernel choices, say). prelude: Python run in each run's
    process before the CLI starts (the mutation test patches a formula with it)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "CI": "true", **(env or {})}
    records: dict[str, dict] = {}
    for name, args in RUNS.items():
        if only is not None and name not in only:
            continue
        out = root / name
        cli = [a.replace("{D}", str(root)) for a in args] + ["--out", str(out)]
        start = (
            f"import runpy\n{prelude}\nrunpy.run_module('srollout.cli.app', run_name='__main__')"
        )
        cmd = [sys.executable, "-c", start, *cli]
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900)
        if proc.returncode != 0:
            raise RuntimeError(
                f"golden run {name} failed "
                f"({proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}"
            )
        for table in sorted(out.rglob("*.parquet")):
            if "parts" in table.relative_to(out).parts:  # per-group pieces of the merged tables
                continue
            records[f"{name}/{table.relative_to(out)}"] = table_record(table)
    return records


def dumps(records: dict[str, dict]) -> str:
    """golden.json's text: one table a block, one line per float column (diffs stay readable)."""
    lines = ["{"]
    for i, (key, rec) in enumerate(sorted(records.items())):
        floats = ",\n".join(
            f"   {json.dumps(name)}: {json.dumps(vals)}" for name, vals in rec["floats"].items()
        )
        lines += [
            f" {json.dumps(key)}: {{",
            f'  "rows": {rec["rows"]},',
            f'  "columns": {json.dumps(rec["columns"])},',
            f'  "exact": {json.dumps(rec["exact"])},',
            '  "floats": {' + ("\n" + floats + "\n  }" if floats else "}"),
            " }" + ("," if i < len(records) - 1 else ""),
        ]
    return "\n".join(lines + ["}"]) + "\n"


def add_columns(recorded: dict[str, dict], now: dict[str, dict]) -> tuple[dict, list]:
    """golden.json with the columns a change added to its tables, every recorded value kept:
    (the merged records, the differences of the recorded columns, which must be none)."""
    merged, problems = {}, []
    for table in sorted(set(recorded) | set(now)):
        old, new = recorded.get(table), now.get(table)
        if old is None or new is None:
            problems.extend(compare_table(table, old, new))
            continue
        kept = {
            "rows": new["rows"],
            "columns": {c: t for c, t in new["columns"].items() if c in old["columns"]},
            "exact": {c: v for c, v in new["exact"].items() if c in old["exact"]},
            "floats": {c: v for c, v in new["floats"].items() if c in old["floats"]},
        }
        problems.extend(compare_table(table, old, kept))
        merged[table] = {
            "rows": old["rows"],
            "columns": new["columns"],
            "exact": {c: old["exact"].get(c, v) for c, v in new["exact"].items()},
            "floats": {c: old["floats"].get(c, v) for c, v in new["floats"].items()},
        }
    return merged, problems


def load_golden() -> dict[str, dict]:
    return json.loads(GOLDEN.read_text())


def main() -> None:
    import tempfile

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help="write tests/golden/golden.json")
    parser.add_argument(
        "--add-columns",
        action="store_true",
        help="record only the columns added since golden.json, if every recorded one still agrees",
    )
    parser.add_argument("--keep", type=Path, help="run under this directory and keep it")
    args = parser.parse_args()
    root = args.keep or Path(tempfile.mkdtemp(prefix="srollout-golden-"))
    records = run_all(root)
    if args.write:
        GOLDEN.write_text(dumps(records))
        print(f"recorded {len(records)} tables in {GOLDEN}")
        return
    if args.add_columns:
        merged, problems = add_columns(load_golden(), records)
        for d in problems:
            print(d)
        if not problems:
            GOLDEN.write_text(dumps(merged))
            print(f"added columns to {GOLDEN}; every recorded value kept")
        sys.exit(1 if problems else 0)
    differences = compare(load_golden(), records)
    for d in differences:
        print(d)
    sys.exit(1 if differences else 0)


if __name__ == "__main__":
    main()
