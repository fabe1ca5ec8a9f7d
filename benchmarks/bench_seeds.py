"""Benchmark `srollout train-onpolicy --workers`: the same seeds trained one after another in one
process against N at a time as Ray tasks; append to docs/bench/workers.md.

Each configuration is the CLI in a fresh process, as a user runs it (imports, Ray's start, the
final pass over all seeds and the report included). The two runs must write the same tables,
timing columns aside (checked). Where the ratio falls short of N, the seed tasks' own wall-clock
(the manifest's ``dist.trained``) splits the parallel run into start-up, seed training and the
final pass.

Usage::

    python benchmarks/bench_seeds.py --preset tiny --seeds 7,13,23,42 --workers 2
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def _run(out: Path, args: argparse.Namespace, workers: int) -> float:
    cmd = [
        sys.executable, "-m", "srollout.cli.app", "train-onpolicy", "--preset", args.preset,
        "--seeds", args.seeds, "--out", str(out), "--workers", str(workers), *args.extra,
    ]  # fmt: skip
    env = {**os.environ, "COLUMNS": "200"}
    env.pop("RAY_ADDRESS", None)
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed:\n{proc.stderr[-3000:]}")
    return wall


def _same(a: Path, b: Path) -> dict[str, bool]:
    import numpy as np
    import polars as pl

    out = {}
    for name in ("metrics", "eval"):
        x, y = pl.read_parquet(a / f"{name}.parquet"), pl.read_parquet(b / f"{name}.parquet")
        timing = [c for c in x.columns if c.endswith("_s") or "wall" in c or "per_s" in c]
        keys = [c for c in ("seed", "arm", "iteration", "task_id") if c in x.columns]
        x, y = x.drop(timing).sort(keys), y.drop(timing).sort(keys)
        # trained floats follow torch's kernels, which differ with the thread count (1 per Ray
        # worker, the machine's in process): within float noise; everything else exact
        floats = [c for c in x.columns if x.schema[c] in (pl.Float32, pl.Float64)]
        close = all(
            np.allclose(x[c].to_numpy(), y[c].to_numpy(), rtol=1e-4, atol=1e-6, equal_nan=True)
            for c in floats
        )
        out[name] = close and x.drop(floats).equals(y.drop(floats))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default="tiny")
    parser.add_argument("--seeds", default="7,13,23,42")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "bench" / "workers.md")
    parser.add_argument("extra", nargs="*", help="more train-onpolicy options (after --)")
    args = parser.parse_args()

    import torch

    load = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="bench-seeds-") as tmp:
        one = _run(Path(tmp) / "one", args, 1)
        par = _run(Path(tmp) / "par", args, args.workers)
        same = _same(Path(tmp) / "one", Path(tmp) / "par")
        dist = json.loads((Path(tmp) / "par" / "manifest.json").read_text())["dist"]
        seed_s = [t["wall_s"] for t in dist["trained"]]
        timings = json.loads((Path(tmp) / "one" / "manifest.json").read_text()).get("timings_s", {})
    load_after = os.getloadavg()
    n = len(args.seeds.split(","))
    stamp = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    text = (
        f"## {stamp} — `train-onpolicy` seeds: 1 process vs {args.workers} Ray workers — "
        f"{platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}, load "
        f"{load[0]:.1f} before / {load_after[0]:.1f} after\n\n"
        f"Command: `python benchmarks/bench_seeds.py {' '.join(sys.argv[1:])}` ({n} seeds, "
        f"preset {args.preset}; each configuration one `srollout train-onpolicy` process)\n\n"
        f"- 1 process (`--workers 1`, torch on the machine's threads): **{one:.1f} s** end to "
        f"end (stage timings: {timings}).\n"
        f"- {args.workers} Ray workers (1 CPU each): **{par:.1f} s** end to end; the seed "
        f"tasks took {', '.join(f'{s:.1f}' for s in seed_s)} s each (sum {sum(seed_s):.1f} s, "
        f"{sum(seed_s) / args.workers:.1f} s per worker if perfectly shared); the rest "
        f"(imports, Ray's start, the final pass over all seeds, the report) about "
        f"{par - sum(seed_s) / args.workers:.1f} s.\n"
        f"- **ratio 1 process / {args.workers} workers = {one / par:.2f}**; same tables "
        f"(timing aside): {same}.\n"
    )
    print(text)
    with args.out.open("a") as fh:
        fh.write(text + "\n")


if __name__ == "__main__":
    main()
