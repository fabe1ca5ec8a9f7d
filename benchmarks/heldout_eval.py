"""Greedy evaluation of a finished `srollout train-onpolicy` run on another task set.

    python benchmarks/heldout_eval.py RUN [--tasks heldout] [--n 100] [--threads 2]

train-onpolicy evaluates on one task set (`--eval-set`, `eval` by default: the paper's
valid_seen protocol). This plays the base model (iteration 0) and every final adapter the run
saved (`RUN/adapters/seed<S>-<arm>/`, iteration = the run's last) greedily on the first n tasks
of ``--tasks`` with the run's own T_max and response cap, exactly as the run's own evaluation does
(`srollout.training.evaluate.greedy_eval`, environment seed 0, so every policy plays the same
games). Writes, into ``RUN/eval-<tasks>/`` or ``--out``: ``eval.parquet`` (the eval.parquet
contract), ``tests.parquet`` (the run's paired tests: McNemar and a paired bootstrap over (seed,
task)) and ``report.md``.
"""

from __future__ import annotations

import argparse
import json
import re
import time
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run", type=Path, help="a finished train-onpolicy run directory")
    parser.add_argument("--tasks", default="heldout", help="task set (default heldout)")
    parser.add_argument("--n", type=int, default=100, help="tasks evaluated (default 100)")
    parser.add_argument("--threads", type=int, default=2, help="torch threads (default 2)")
    parser.add_argument("--out", type=Path, help="output directory (default RUN/eval-<tasks>)")
    parser.add_argument("--overwrite", action="store_true", help="replace --out if it exists")
    args = parser.parse_args()

    import polars as pl
    import torch

    from srollout import schemas
    from srollout.envs import load_task_set
    from srollout.envs.alfworld_env import AlfworldEnv
    from srollout.policy import make_policy, resolve_model
    from srollout.report.onpolicy import paired_test, tests_frame
    from srollout.rollout.react import ReactPrompter
    from srollout.training.evaluate import greedy_eval

    torch.set_num_threads(args.threads)
    config = json.loads((args.run / "manifest.json").read_text())["config"]
    model = config["model"] or "default"
    T_max, cap = config["T_max"], config["max_new_tokens"]
    last = int(config["iterations"])
    adapters = sorted(
        (int(m.group(1)), m.group(2), d)
        for d in (args.run / "adapters").iterdir()
        if (m := re.fullmatch(r"seed(\d+)-(.+)", d.name))
    )
    if not adapters:
        raise SystemExit(f"no adapters under {args.run / 'adapters'}: is the run finished?")
    out = args.out or args.run / f"eval-{args.tasks}"
    if out.exists() and any(out.iterdir()) and not args.overwrite:
        raise SystemExit(f"{out} exists: give another --out, or --overwrite to replace it")
    tasks = list(load_task_set(args.tasks, n=args.n))
    prompter = ReactPrompter.for_model(resolve_model(model))
    rows: list[dict] = []

    def play(adapter: Path | None) -> list:
        policy = make_policy(model=model, temperature=0.0, adapter=adapter, max_new_tokens=cap)
        t0 = time.perf_counter()
        out = greedy_eval(policy, AlfworldEnv, prompter, tasks, T_max)
        rate = sum(o.success for o in out) / len(out)
        name = adapter.name if adapter else "base"
        print(f"  {name}: {rate:.1%} in {time.perf_counter() - t0:.0f} s")
        return out

    print(f"{args.run}: greedy on {len(tasks)} {args.tasks} tasks, T_max {T_max}")
    base = play(None)
    arms = sorted({arm for _, arm, _ in adapters})
    for seed in sorted({s for s, _, _ in adapters}):
        for arm in arms:  # iteration 0 is the base model for every (seed, arm)
            rows += [{"arm": arm, "seed": seed, "iteration": 0, **o._asdict()} for o in base]
    for seed, arm, path in adapters:
        rows += [{"arm": arm, "seed": seed, "iteration": last, **o._asdict()} for o in play(path)]
    evals = pl.DataFrame(rows, infer_schema_length=None)
    out.mkdir(parents=True, exist_ok=True)
    schemas.write(evals, out / "eval.parquet", schemas.EVAL)
    tests = [
        paired_test(evals, ("baseline", last), (a, last), f"{a} - baseline at {last}")
        for a in arms
        if a != "baseline"
    ]
    tests += [paired_test(evals, (a, 0), (a, last), f"learning: {a} at {last} - 0") for a in arms]
    table = tests_frame(tests)
    schemas.write(table, out / "tests.parquet")
    success = (
        evals.group_by("arm", "seed", "iteration")
        .agg(pl.col("success").cast(pl.Float64).mean().alias("success"))
        .sort("arm", "seed", "iteration")
    )
    lines = [
        f"# Greedy success on {len(tasks)} `{args.tasks}` tasks: {args.run.name}",
        "",
        f"`python benchmarks/heldout_eval.py {args.run} --tasks {args.tasks} --n {args.n}`, "
        f"T_max {T_max}, iteration 0 = the base model, {last} = each final adapter.",
        "",
        "| arm | seed | iteration | success |",
        "|---|---|---|---|",
        *[
            f"| {r['arm']} | {r['seed']} | {r['iteration']} | {r['success']:.1%} |"
            for r in success.iter_rows(named=True)
        ],
        "",
        "| test | n | a | b | b − a [95 % CI] | bootstrap p | b only / a only | McNemar p |",
        "|---|---|---|---|---|---|---|---|",
        *[
            f"| {t['what']} | {t['n']} | {t['rate_a']:.1%} | {t['rate_b']:.1%} | "
            f"{t['diff'] * 100:+.1f} pp [{t['ci_low'] * 100:+.1f}, {t['ci_high'] * 100:+.1f}] | "
            f"{t['p_bootstrap']:.3g} | {t['b01']} / {t['b10']} | {t['p_mcnemar']:.3g} |"
            for t in table.iter_rows(named=True)
        ],
    ]
    (out / "report.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
