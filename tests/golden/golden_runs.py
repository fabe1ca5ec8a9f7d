"""Golden runs: small, seeded runs of every stage whose Parquet artifacts must not change when the
code is reorganised: a redesign keeps behaviour (same seeds, same tables, bit for bit).

    python tests/golden/golden_runs.py --write    # after a deliberate change of behaviour: new digests
    python tests/golden/golden_runs.py        # compare against tests/golden/digests.json

Each table is reduced to a digest of its columns that do not measure time or memory (those
change from run to run): the sha256 of its dtypes and NDJSON text, so a changed value, row order,
column order or dtype all change it. Training metrics are compared after the column renames in
``RENAMES`` (old name -> new name), the documented renames of a redesign.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
DIGESTS = HERE / "digests.json"

# name -> srollout arguments; {D} is the runs directory. Order matters: later runs read earlier ones.
RUNS: dict[str, list[str]] = {
    "collect-lm": ["collect", "--groups", "4", "--G", "4", "--T-max", "6", "--seed", "3", "--signal-K", "2,4"],
    "collect-lm-gated": ["collect", "--groups", "4", "--G", "4", "--T-max", "6", "--seed", "3", "--signal-K", "2,4",
                         "--K", "3", "--d-L", "0.5"],
    "collect-expert": ["collect", "--policy", "noisy-expert", "--groups", "40", "--G", "8", "--T-max", "12",
                       "--seed", "5", "--signal-K", "5,10"],
    "analyze": ["analyze", "{D}/collect-expert", "--K", "5,10", "--gate-K", "5", "--no-figures"],
    "sweep": ["sweep", "{D}/collect-expert", "--K", "5", "--T-max", "12", "--n-boot", "200"],
    "ab-rollout": ["ab-rollout", "--policy", "noisy-expert", "--groups", "8", "--G", "4", "--T-max", "8", "--K", "3",
                   "--d-L", "0.3", "--repeats", "1", "--blocks", "2", "--no-warmup", "--no-figures", "--n-boot", "100"],
    "train-offpolicy": ["train-offpolicy", "{D}/collect-lm", "--steps", "2", "--groups-per-step", "2", "--K", "3",
                        "--d-L", "0.5", "--seed", "1"],
    "train-onpolicy": ["train-onpolicy", "--preset", "tiny", "--seeds", "7"],
}

# Columns that measure time or memory, or name the machine: dropped before digesting.
VOLATILE = re.compile(r"(_s$|_s_|^wall|time|_per_s|tok_s|per_sec|rss|memory|_mb$|_gb$|^date|host|machine|utc)")
# A redesign's documented column renames (old -> new), applied to the golden side's names.
RENAMES: dict[str, str] = {}


def table_digest(path: Path) -> dict:
    import polars as pl

    df = pl.read_parquet(path)
    keep = [c for c in df.columns if not VOLATILE.search(c)]
    df = df.select(keep).rename({old: new for old, new in RENAMES.items() if old in keep})
    text = json.dumps([str(t) for t in df.dtypes]) + df.write_ndjson()
    return {"rows": df.height, "columns": df.columns, "sha256": hashlib.sha256(text.encode()).hexdigest()[:16]}


def run_all(root: Path) -> dict[str, dict]:
    """Run every golden run under ``root``; the digest of every Parquet table they wrote."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "CI": "true"}
    digests: dict[str, dict] = {}
    for name, args in RUNS.items():
        out = root / name
        cmd = [sys.executable, "-m", "srollout.cli.app", *[a.replace("{D}", str(root)) for a in args], "--out", str(out)]
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900)
        if proc.returncode != 0:
            raise RuntimeError(f"golden run {name} failed ({proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
        for table in sorted(out.rglob("*.parquet")):
            if "parts" in table.relative_to(out).parts:  # per-group pieces of the merged tables
                continue
            digests[f"{name}/{table.relative_to(out)}"] = table_digest(table)
    return digests


def main() -> None:
    import tempfile

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help="write tests/golden/digests.json")
    parser.add_argument("--keep", type=Path, help="run under this directory and keep it")
    args = parser.parse_args()
    root = args.keep or Path(tempfile.mkdtemp(prefix="srollout-golden-"))
    digests = run_all(root)
    if args.write:
        DIGESTS.write_text(json.dumps(digests, indent=1, sort_keys=True) + "\n")
        print(f"wrote {len(digests)} digests to {DIGESTS}")
        return
    golden = json.loads(DIGESTS.read_text())
    bad = [k for k in sorted(set(golden) | set(digests)) if golden.get(k) != digests.get(k)]
    for k in bad:
        print(f"{k}: golden {golden.get(k)} != now {digests.get(k)}")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
