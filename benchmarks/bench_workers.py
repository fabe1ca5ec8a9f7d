"""Benchmark `srollout collect --workers`: wall-clock with 1 vs 2 workers; append to
docs/bench/workers.md.

The same groups and seeds (so the same content: the runs are checked equal, timing aside) through

- ``inproc``: ``--workers 1``, the engine in this process (torch on ``--threads`` threads);
- ``ray1``: one Ray rollout worker (torch on 1 thread): the price of Ray itself;
- ``ray2``: two Ray rollout workers (1 torch thread each), chunks of groups / 2.

Each Ray run starts its own local cluster, and its wall-clock includes that start and the
workers' policy builds (what a user waits for); the engine's per-group costs (generation, env
steps, resets, other) come from the runs' summaries and feed docs/scaling.md.

Usage::

    python benchmarks/bench_workers.py --groups 8 --T-max 10            # default policy
    python benchmarks/bench_workers.py --model /path/to/tiny --groups 16 # any HF model dir
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def _run(out: Path, workers: int, args: argparse.Namespace) -> tuple[object, float]:
    from srollout.config import CollectConfig, DistConfig
    from srollout.stages.collect import run_collect

    config = CollectConfig(
        out=out,
        policy="lm",
        model=args.model,
        groups=args.groups,
        G=args.G,
        T_max=args.T_max,
        concurrency=args.concurrency,
        seed=args.seed,
        signal_K=(min(5, args.T_max),),
    )
    t0 = time.perf_counter()
    result = run_collect(config, progress=False, dist=DistConfig(workers=workers))
    return result, time.perf_counter() - t0


def _same(a: Path, b: Path) -> bool:
    import numpy as np
    import polars as pl

    from srollout.rollout.records import TIMING_COLUMNS

    for name in ("steps", "trajectories", "groups", "signals"):
        x, y = pl.read_parquet(a / f"{name}.parquet"), pl.read_parquet(b / f"{name}.parquet")
        drop = [c for c in x.columns if c in TIMING_COLUMNS]
        x, y = x.drop(drop), y.drop(drop)
        # the policy's log-probs are floats of torch's kernels, which differ with the thread
        # count (1 per worker against 2 in process): compared within float noise, the rest exact
        floats = [c for c in x.columns if x.schema[c] in (pl.Float32, pl.Float64)]
        close = all(
            np.allclose(x[c].to_numpy(), y[c].to_numpy(), rtol=1e-4, atol=1e-6, equal_nan=True)
            for c in floats
        )
        if not (close and x.drop(floats).equals(y.drop(floats))):
            return False
    return True


def _shares(summary, workers: int) -> str:
    """Per-group costs in worker-seconds: generation / env steps / resets / other."""
    g = max(summary.groups, 1)
    busy = workers * summary.wall_s
    parts = {
        "generation": summary.gen_s,
        "env steps": summary.env_s,
        "resets": summary.reset_s,
        "other": summary.overhead_s,
    }
    return ", ".join(f"{k} {v / g:.2f} s/group ({v / busy:.0%})" for k, v in parts.items())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--model", default="default", help="default (the embedded default policy) or a HF model dir"
    )
    parser.add_argument("--groups", type=int, default=8)
    parser.add_argument("--G", type=int, default=8)
    parser.add_argument("--T-max", dest="T_max", type=int, default=10)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--threads",
        type=int,
        default=int(os.environ.get("OMP_NUM_THREADS", "0")) or (os.cpu_count() or 1),
    )
    parser.add_argument("--what", default="inproc,ray1,ray2")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "bench" / "workers.md")
    args = parser.parse_args()

    import torch

    from srollout.policy import resolve_model

    torch.set_num_threads(args.threads)
    args.model = resolve_model(args.model)  # built once, before any timing
    load = os.getloadavg()
    lines, results = [], {}
    with tempfile.TemporaryDirectory(prefix="bench-workers-") as tmp:
        for what in args.what.split(","):
            workers = {"inproc": 1, "ray1": 1, "ray2": 2}[what]
            if (
                what == "ray1"
            ):  # force the Ray path with one worker: run_groups_distributed directly
                result, wall = _ray_one(Path(tmp) / what, args)
            else:
                result, wall = _run(Path(tmp) / what, workers, args)
            results[what] = (result, wall)
            s = result.summary
            threads = args.threads if what == "inproc" else 1
            dist = json.loads((result.run_dir / "manifest.json").read_text()).get("dist")
            start = f", of which worker start-up {dist['worker_start_s']:.1f} s" if dist else ""
            lines.append(
                f"- `{what}` ({workers} worker(s), torch {threads} thread(s) each): **{wall:.1f} "
                f"s** end to end, rollout {s.wall_s:.1f} s{start}; {s.n_gen_tokens} generated "
                f"tokens, {s.rows} env steps, mean batch {s.mean_batch:.1f} rows; per group in "
                f"worker-seconds: {_shares(s, workers)}."
            )
        if "inproc" in results and "ray2" in results:
            base, two = results["inproc"][1], results["ray2"][1]
            same = _same(results["inproc"][0].run_dir, results["ray2"][0].run_dir)
            lines.append(
                f"- **ratio 1 worker / 2 workers = {base / two:.2f}** (end to end, in-process vs 2 "
                "Ray workers); rollout only "
                f"{results['inproc'][0].summary.wall_s / results['ray2'][0].summary.wall_s:.2f}; "
                f"same content (timing aside): {same}."
            )
        if "ray1" in results and "ray2" in results:
            lines.append(
                "- ratio Ray 1 worker / Ray 2 workers = "
                f"{results['ray1'][1] / results['ray2'][1]:.2f} (end to end)."
            )
    load_after = os.getloadavg()
    stamp = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    header = (
        f"## {stamp} — {platform.machine()}, {os.cpu_count()} cores visible, torch "
        f"{torch.__version__}, load average {load[0]:.1f} before / {load_after[0]:.1f} after\n\n"
        f"Command: `python benchmarks/bench_workers.py {' '.join(sys.argv[1:])}` — model "
        f"`{args.model}`, {args.groups} groups, G={args.G}, T_max={args.T_max}, concurrency "
        f"{args.concurrency} per worker.\n\n"
    )
    text = header + "\n".join(lines) + "\n"
    print(text)
    if not args.out.exists():
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(
            "# `srollout collect --workers` benchmarks\n\nAppended by "
            "`benchmarks/bench_workers.py`; newest last.\n\n"
        )
    with args.out.open("a") as fh:
        fh.write(text + "\n")


def _ray_one(out: Path, args: argparse.Namespace) -> tuple[object, float]:
    """One Ray worker through the stage (``--workers 1`` never starts Ray): run_collect with the
    rollout swapped for the distributed one on a 1-CPU local cluster."""
    import srollout.stages.collect as stage
    from srollout.config import CollectConfig, DistConfig

    config = CollectConfig(
        out=out,
        policy="lm",
        model=args.model,
        groups=args.groups,
        G=args.G,
        T_max=args.T_max,
        concurrency=args.concurrency,
        seed=args.seed,
        signal_K=(min(5, args.T_max),),
    )
    t0 = time.perf_counter()
    # DistConfig(workers=2) routes through Ray; the worker count the rollout uses is then 1
    original = stage._run_distributed

    def one_worker(todo, config, settings, dist, manifest, on_group, on_tick):
        return original(todo, config, settings, DistConfig(workers=1), manifest, on_group, on_tick)

    stage._run_distributed = one_worker
    try:
        result = stage.run_collect(config, progress=False, dist=DistConfig(workers=2))
    finally:
        stage._run_distributed = original
    return result, time.perf_counter() - t0


if __name__ == "__main__":
    main()
