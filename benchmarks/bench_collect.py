"""Benchmark `srollout collect` and the gate's wall-clock saving; append results to
docs/bench/collect.md.

Three measurements (each on the real ALFWorld engine, one process, torch on one thread per core
given by --threads):

- ``default``: the paper-default collect (100 groups, G=8, T_max=30, temperature 0.7, gate off)
  with the chosen policy; target <= 15 min on 2 CPU cores with the default LM policy.
- ``quick``: ``collect --quick`` (8 groups, T_max 15); target <= 90 s.
- ``gate``: the same groups and seeds twice through the same batched engine, gate off then gate on
  (K, d_L), arms alternating ``--repeats`` times; reports wall-clock saving / generated-token saving
  (target >= 0.9: cut groups free their slots at once and the batch refills).

Usage::

    python benchmarks/bench_collect.py --what quick,gate --policy lm --groups 24
    python benchmarks/bench_collect.py --what default
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


_MODEL: dict[str, str] = {}


def _collect(out: Path, **kw):
    from srollout.config import CollectConfig
    from srollout.stages.collect import run_collect

    if _MODEL and kw.get("policy") == "lm":
        kw["model"] = Path(_MODEL["path"])
    t0 = time.perf_counter()
    result = run_collect(CollectConfig(out=out, **kw), progress=False)
    return result, time.perf_counter() - t0


def bench_default(policy: str, groups: int, tmp: Path) -> list[str]:
    result, wall = _collect(tmp / "default", policy=policy, groups=groups)
    s, r = result.stats, result.summary
    return [
        f"- default collect ({groups} groups, G=8, T_max=30, policy `{policy}`): **{wall:.1f} s** "
        f"end to end ({wall / 60:.1f} min; target <= 15 min at 100 groups with the LM policy); "
        f"rollout {r.wall_s:.1f} s = generation {r.gen_s:.1f} + env steps {r.env_s:.1f} + resets "
        f"{r.reset_s:.1f} + other {r.overhead_s:.1f}; {r.n_gen_tokens} generated tokens "
        f"({s.gen_tok_per_s:.0f} tok/s), mean batch {r.mean_batch:.1f} rows; success "
        f"{s.success_rate:.1%}, labels {s.label_counts}, valid actions {s.valid_rate:.1%}."
    ]


def bench_quick(policy: str, tmp: Path) -> list[str]:
    result, wall = _collect(tmp / "quick", policy=policy, groups=8, T_max=15, quick=True)
    r = result.summary
    return [
        f"- `collect --quick` (8 groups, G=8, T_max=15, policy `{policy}`): **{wall:.1f} s** end "
        f"to end (target <= 90 s); rollout {r.wall_s:.1f} s, {r.n_gen_tokens} generated tokens, "
        f"success {result.stats.success_rate:.1%}."
    ]


def warm_games(groups: int) -> float:
    """Reset environments on every task the runs will play, 64 of them at once (the default
    concurrency), so that neither arm pays the per-process game parse and planner-library copies
    (shared and pooled by AlfworldEnv) that the first arm would otherwise pay alone."""
    from srollout.envs.alfworld_env import AlfworldEnv
    from srollout.envs.registry import resolve_env

    t0 = time.perf_counter()
    tasks = resolve_env("alfworld").task_set("eval")
    envs = [AlfworldEnv(expert_plan=False) for _ in range(64)]
    for i, env in enumerate(envs):
        env.reset(tasks[i % min(groups, len(tasks))], 0)
    for i in range(64, min(groups, len(tasks))):
        envs[0].reset(tasks[i], 0)
    for env in envs:
        env.close()
    return time.perf_counter() - t0


def _median_d(result, K: int) -> float:
    """A d_L that cuts about half the groups: just above the median d_K of the baseline arm."""
    import polars as pl

    d = pl.read_parquet(result.paths["signals"]).filter(pl.col("K") == K)[
        "prefix_edit_distance_mean"
    ]
    return float(d.median()) + 1e-9


def bench_gate(
    policy: str, groups: int, K: int, d_L: float | None, repeats: int, tmp: Path, T_max: int
) -> list[str]:
    """d_L None: set from the first baseline run (median d_K), so about half the groups are cut
    whatever the policy (the measured ratio is about the engine, not the operating point)."""
    runs: dict[str, list] = {"baseline": [], "gated": []}
    warm_s = warm_games(groups)
    for rep in range(repeats):
        order = ("baseline", "gated") if rep % 2 == 0 else ("gated", "baseline")
        for arm in order:
            if arm == "gated" and d_L is None:
                d_L = round(_median_d(runs["baseline"][0], K), 6)
            gate = {"K": K, "d_L": d_L} if arm == "gated" else {}
            # the gate's K must be among the recorded signal K values for the median rule
            signal_K = tuple(sorted({K, 5, 10, 15, 20}))
            result, _ = _collect(
                tmp / f"{arm}-{rep}",
                policy=policy,
                groups=groups,
                T_max=T_max,
                signal_K=signal_K,
                **gate,
            )
            runs[arm].append(result)
    lines = []
    base_wall = sum(r.summary.wall_s for r in runs["baseline"])
    gate_wall = sum(r.summary.wall_s for r in runs["gated"])
    base_tok = sum(r.summary.n_gen_tokens for r in runs["baseline"])
    gate_tok = sum(r.summary.n_gen_tokens for r in runs["gated"])
    base_rows = sum(r.summary.rows for r in runs["baseline"])
    gate_rows = sum(r.summary.rows for r in runs["gated"])
    n_cut = runs["gated"][0].summary.n_cut
    wall_saving = 1 - gate_wall / base_wall
    tok_saving = 1 - gate_tok / base_tok if base_tok else float("nan")
    step_saving = 1 - gate_rows / base_rows
    ratio = (
        wall_saving / tok_saving
        if tok_saving and tok_saving == tok_saving and tok_saving > 0
        else float("nan")
    )
    step_ratio = wall_saving / step_saving if step_saving > 0 else float("nan")
    lines.append(
        f"- gate A/B ({groups} groups, G=8, T_max={T_max}, policy `{policy}`, K={K}, d_L={d_L}, "
        f"{repeats} repeat(s), arms alternating, games pre-loaded in {warm_s:.1f} s): {n_cut} "
        f"groups cut; rollout wall-clock baseline {base_wall:.1f} s vs gated {gate_wall:.1f} s = "
        f"**{wall_saving:.1%} saved**; generated tokens {base_tok} vs {gate_tok} = "
        f"{tok_saving:.1%} saved; env steps {base_rows} vs {gate_rows} = {step_saving:.1%} saved; "
        f"**wall-clock saving / token saving = {ratio:.2f}** (target >= 0.9); wall-clock saving / "
        f"env-step saving = {step_ratio:.2f}; mean batch baseline "
        f"{runs['baseline'][0].summary.mean_batch:.1f} vs gated "
        f"{runs['gated'][0].summary.mean_batch:.1f} rows."
    )
    for arm in ("baseline", "gated"):
        r = runs[arm][0].summary
        lines.append(
            f"  - {arm}: generation {r.gen_s:.1f} s, env steps {r.env_s:.1f} s, resets "
            f"{r.reset_s:.1f} s, other {r.overhead_s:.1f} s, {r.ticks} ticks"
        )
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--what", default="quick,gate", help="comma list of default, quick, gate")
    ap.add_argument("--policy", default="lm", choices=("lm", "expert", "noisy-expert"))
    ap.add_argument("--groups", type=int, default=100, help="groups of the default and gate runs")
    ap.add_argument("--T-max", type=int, default=30, dest="T_max")
    ap.add_argument("--K", type=int, default=10)
    ap.add_argument(
        "--d-L",
        default="0.12",
        dest="d_L",
        help="a threshold, or 'median' (median d_K of the baseline arm)",
    )
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument(
        "--model", default=None, help="local model directory (default: the default policy)"
    )
    ap.add_argument("--threads", type=int, default=int(os.environ.get("SROLLOUT_THREADS", "2")))
    ap.add_argument("--out", type=Path, default=ROOT / "docs" / "bench" / "collect.md")
    args = ap.parse_args()

    import torch

    torch.set_num_threads(args.threads)
    if args.model:
        _MODEL["path"] = args.model
    stamp = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    machine = (
        f"{platform.machine()}, {os.cpu_count()} cores visible, torch {torch.__version__} on "
        f"{args.threads} thread(s)"
    )
    lines = [
        f"\n## {stamp} — {machine}\n",
        f"Command: `python benchmarks/bench_collect.py {' '.join(sys.argv[1:])}`\n",
    ]
    with tempfile.TemporaryDirectory(prefix="bench-collect-") as tmp:
        tmp_path = Path(tmp)
        for what in args.what.split(","):
            if what == "default":
                lines += bench_default(args.policy, args.groups, tmp_path)
            elif what == "quick":
                lines += bench_quick(args.policy, tmp_path)
            elif what == "gate":
                d_L = None if args.d_L == "median" else float(args.d_L)
                lines += bench_gate(
                    args.policy, args.groups, args.K, d_L, args.repeats, tmp_path, args.T_max
                )
            else:
                raise SystemExit(f"unknown --what {what!r}")
            print("\n".join(lines[-3:]), flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    if not args.out.exists():
        args.out.write_text(
            "# `srollout collect` benchmarks\n\nAppended by "
            "`benchmarks/bench_collect.py`; newest last.\n"
        )
    with args.out.open("a") as fh:
        fh.write("\n".join(lines) + "\n")
    print(f"appended to {args.out}")


if __name__ == "__main__":
    main()
