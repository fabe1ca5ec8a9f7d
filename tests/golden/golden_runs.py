"""Golden runs: small, seeded runs of every stage whose Parquet artifacts must not change when the
code is reorganised: a redesign keeps behaviour (same seeds, same tables, bit for bit).

    # after a deliberate change of behaviour: new digests
    python tests/golden/golden_runs.py --write
    # compare against tests/golden/digests.json
    python tests/golden/golden_runs.py

Each table is reduced to a digest of its columns that do not measure time or memory (those
change from run to run): the sha256 of its dtypes and NDJSON text, so a changed value, row order,
column order or dtype all change it. Training metrics are compared under their recorded (old)
names: ``RENAMES`` (old name -> new name, per table) holds the documented renames of a redesign,
and the new table's columns are renamed back and put in the recorded order before digesting.
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
    "train-onpolicy": ["train-onpolicy", "--preset", "tiny", "--seeds", "7"],
}

# Columns that measure time or memory, or name the machine: dropped before digesting.
VOLATILE = re.compile(
    r"(_s$|_s_|^wall|time|_per_s|tok_s|per_sec|rss|memory|_mb$|_gb$|^date|host|machine|utc)"
)
# A redesign's documented column renames (old -> new), per table: the new table is digested under
# its old names, in the recorded order (docs/artifacts.md, "metrics.parquet: the names before").
# Two old names may map to one new column: on-policy's `step` was always equal to `iteration`.
_SHARED = {
    "loss": "train/loss",
    "grad_l2": "train/grad_l2",
    "zero_adv_frac": "train/zero_adv_frac",
    "n_traj": "train/trajectories",
    "n_tokens": "train/action_tokens",
    "mean_logp": "train/mean_logp",
    "stepped": "train/stepped",
    "denominator": "train/denominator",
    "rollout_s": "time/rollout_s",
    "update_s": "time/update_s",
    "sync_s": "time/sync_s",
}
RENAMES: dict[str, dict[str, str]] = {
    "train-onpolicy/metrics.parquet": {
        **_SHARED,
        "step": "iteration",
        "train_reward": "train/reward",
        "n_groups": "rollout/groups",
        "n_env_steps": "rollout/env_steps",
        "n_gen_tokens": "rollout/gen_tokens",
        "train_reward_all": "rollout/reward",
        "rollout_adapter_iteration": "rollout/adapter_iteration",
        "n_cut": "gate/cuts",
        "n_kept": "gate/kept",
        "n_zero_var_kept": "gate/zero_var_kept",
        "n_useful": "gate/useful",
        "n_skipped": "gate/skipped",
        "n_rounds": "gate/dapo_rounds",
        "dapo_hit_cap": "gate/dapo_hit_cap",
        "iter_s": "time/iter_s",
        "cum_s": "time/cum_s",
        "warmup_s": "time/warmup_s",
        "eval_s": "time/eval_s",
    },
    "train-offpolicy/metrics.parquet": {
        **_SHARED,
        "n_items": "train/items",
        "n_groups": "gate/kept",
        "n_cut": "gate/cuts",
        "n_zero_var": "gate/zero_var_kept",
        "cum_update_s": "time/cum_update_s",
        "cum_rollout_s": "time/cum_rollout_s",
    },
}


def _under_old_names(df, renames: dict[str, str], old_columns: list[str]):
    """``df`` with each recorded (old) column taken from the new column it was renamed to, in the
    recorded order; a new column that no old one maps to (and that is not volatile) is kept at the
    end under its own name, so the digest shows it."""
    import polars as pl

    new_of = {old: renames.get(old, old) for old in old_columns}
    covered = set(new_of.values()) | set(renames.values())
    extra = [c for c in df.columns if c not in covered and not VOLATILE.search(c)]
    renamed_back = [pl.col(new).alias(old) for old, new in new_of.items() if new in df.columns]
    return df.select(renamed_back + extra)


def table_digest(
    path: Path, renames: dict[str, str] | None = None, old_columns: list[str] | None = None
) -> dict:
    import polars as pl

    df = pl.read_parquet(path)
    if renames and old_columns is not None:
        df = _under_old_names(df, renames, old_columns)
    keep = [c for c in df.columns if not VOLATILE.search(c)]
    df = df.select(keep)
    text = json.dumps([str(t) for t in df.dtypes]) + df.write_ndjson()
    digest = hashlib.sha256(text.encode()).hexdigest()[:16]
    return {"rows": df.height, "columns": df.columns, "sha256": digest}


def run_all(root: Path, golden: dict[str, dict] | None = None) -> dict[str, dict]:
    """Run every golden run under ``root``; the digest of every Parquet table they wrote (a table
    with RENAMES under the old names and column order recorded in ``golden``, by default
    digests.json; ``{}`` digests every table under its own names, as ``--write`` records them)."""
    if golden is None:
        golden = json.loads(DIGESTS.read_text()) if DIGESTS.exists() else {}
    env = {**os.environ, "OMP_NUM_THREADS": "1", "CI": "true"}
    digests: dict[str, dict] = {}
    for name, args in RUNS.items():
        out = root / name
        cmd = [
            sys.executable,
            "-m",
            "srollout.cli.app",
            *[a.replace("{D}", str(root)) for a in args],
            "--out",
            str(out),
        ]
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900)
        if proc.returncode != 0:
            raise RuntimeError(
                f"golden run {name} failed "
                f"({proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}"
            )
        for table in sorted(out.rglob("*.parquet")):
            if "parts" in table.relative_to(out).parts:  # per-group pieces of the merged tables
                continue
            key = f"{name}/{table.relative_to(out)}"
            recorded = golden.get(key, {}).get("columns")
            digests[key] = table_digest(table, RENAMES.get(key), recorded)
    return digests


def main() -> None:
    import tempfile

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help="write tests/golden/digests.json")
    parser.add_argument("--keep", type=Path, help="run under this directory and keep it")
    args = parser.parse_args()
    root = args.keep or Path(tempfile.mkdtemp(prefix="srollout-golden-"))
    golden = {} if args.write else json.loads(DIGESTS.read_text())
    digests = run_all(root, golden)
    if args.write:
        DIGESTS.write_text(json.dumps(digests, indent=1, sort_keys=True) + "\n")
        print(f"wrote {len(digests)} digests to {DIGESTS}")
        return
    bad = [k for k in sorted(set(golden) | set(digests)) if golden.get(k) != digests.get(k)]
    for k in bad:
        print(f"{k}: golden {golden.get(k)} != now {digests.get(k)}")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
