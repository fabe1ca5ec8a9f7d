"""Does the gate save wall-clock in proportion to the tokens it saves? Append to
docs/bench/engine_saving.md.

The same groups and seeds go twice through the batched engine (``run_groups``) on the real
ALFWorld engine with a transformers policy: once with no gate, once with a gate at step K,
either ``always`` (``FixedGate(cut=True, K)``: every group cut, a large known token saving) or
``median`` (R1 with d_L at the baseline's median d_K: about half the groups cut, so cut and uncut
groups share the batch and the pool must refill). Arms alternate ``--repeats`` times. Reported:

- wall-clock saving / generated-token saving of the whole rollout (DESIGN target >= 0.9);
- the same for generation time alone (the backend's share of the ratio);
- env-step and env-reset time per arm (resets are per group: the gate cannot save them).

Usage::

    python benchmarks/bench_engine_saving.py                       # default policy
    python benchmarks/bench_engine_saving.py --model /tmp/tiny --gates median --groups 24 --T-max 5
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))


def run_arm(policy, specs, settings):
    """One pass of ``specs`` through ``run_groups`` on the real ALFWorld engine; returns
    (RolloutSummary, records)."""
    from srollout.envs.alfworld_env import AlfworldEnv
    from srollout.rollout.engine import run_groups
    from srollout.rollout.react import ReactPrompter

    records = []
    # the model's own prompt (srollout.json: system prompt and user template), as collect sends it
    prompter = ReactPrompter.for_model(policy.model_path)
    summary = run_groups(
        specs,
        policy,
        lambda: AlfworldEnv(expert_plan=False),
        prompter,
        settings,
        on_group=records.append,
    )
    return summary, records


def measure(
    policy, specs, *, gate: str, G: int, concurrency: int, T_max: int, K: int, repeats: int
) -> dict:
    """Baseline (no gate) vs gated arm on the same specs and seeds, arms alternating.

    gate: ``always`` (FixedGate cutting every group at K) or ``median`` (R1 at K with d_L just
    above the baseline's median d_K: about half the groups are cut, so cut and uncut groups
    share the batch). Returns totals per arm {arm: {field: sum}} and the number of cut groups.
    """
    from statistics import median

    from srollout.core.gate import FixedGate, GateRule
    from srollout.rollout.engine import RolloutSettings

    common = dict(G=G, T_max=T_max, seed=0, concurrency=concurrency, signal_K=(K,))
    base = RolloutSettings(**common, arm="baseline")
    runs: dict[str, list] = {"baseline": [], "gated": []}
    gated = None
    for rep in range(repeats):
        for arm in ("baseline", "gated") if rep % 2 == 0 else ("gated", "baseline"):
            if arm == "gated" and gated is None:
                if gate == "always":
                    rule = FixedGate(cut=True, K=K)
                else:
                    d = median(
                        r.signals[K].prefix_edit_distance_mean
                        for r in runs["baseline"][0][1]
                        if K in r.signals
                    )
                    rule = GateRule(rule="r1", K=K, d_L=min(1.0, d + 1e-9))
                gated = RolloutSettings(**common, gate=rule, gate_K=K, arm="gated")
            runs[arm].append(run_arm(policy, specs, base if arm == "baseline" else gated))
            done = runs[arm][-1][0]
            print(
                f"  {gate} gate, repeat {rep + 1}/{repeats}, {arm}: {done.wall_s:.1f} s, "
                f"{done.n_gen_tokens} generated tokens",
                flush=True,
            )  # a killed run still leaves its numbers
    fields = ("wall_s", "gen_s", "env_s", "reset_s", "overhead_s", "ticks", "rows", "n_gen_tokens")
    totals = {arm: {f: sum(getattr(s, f) for s, _ in runs[arm]) for f in fields} for arm in runs}
    totals["n_cut"] = runs["gated"][0][0].n_cut
    # one wall-clock per timed run, paired by repeat (same groups and seeds), for the run-pair CI
    totals["wall_runs"] = {arm: [s.wall_s for s, _ in runs[arm]] for arm in runs}
    return totals


def report_lines(totals: dict, label: str) -> list[str]:
    """Markdown bullets for one measurement."""
    b, g = totals["baseline"], totals["gated"]

    def saving(f: str) -> float:
        return 1 - g[f] / b[f]

    tok = saving("n_gen_tokens")
    lines = [
        f"- {label}: {totals['n_cut']} groups cut; generated tokens {b['n_gen_tokens']:.0f} vs "
        f"{g['n_gen_tokens']:.0f} = {tok:.1%} saved; env steps {b['rows']:.0f} vs {g['rows']:.0f} "
        f"= {saving('rows'):.1%} saved; rollout wall-clock {b['wall_s']:.1f} s vs "
        f"{g['wall_s']:.1f} s = {saving('wall_s'):.1%} saved: **wall-clock saving / token saving = "
        f"{saving('wall_s') / tok:.2f}**; generation time {b['gen_s']:.1f} s vs {g['gen_s']:.1f} "
        f"s: generation saving / token saving = {saving('gen_s') / tok:.2f}."
    ]
    runs = totals.get("wall_runs")
    if runs and len(runs["baseline"]) >= 2:
        from srollout.core.stats import run_pair_saving_ci

        ci = run_pair_saving_ci(runs["baseline"], runs["gated"])
        pairs = ", ".join(
            f"{1 - a / c:.1%}" for c, a in zip(runs["baseline"], runs["gated"], strict=True)
        )
        lines.append(
            f"  - wall-clock saving over {ci.n_pairs} run pairs: {ci.estimate:.1%} [{ci.low:.1%}, "
            f"{ci.high:.1%}] (95 % t interval on the log ratio of paired runs); per pair {pairs}; "
            f"**wall / token {ci.estimate / tok:.2f} [{ci.low / tok:.2f}, {ci.high / tok:.2f}]** "
            "(the token saving is fixed by the seeds)."
        )
    for arm, t in (("baseline", b), ("gated", g)):
        lines.append(
            f"  - {arm}: generation {t['gen_s']:.1f} s, env steps {t['env_s']:.1f} s, resets "
            f"{t['reset_s']:.1f} s, other {t['overhead_s']:.1f} s; {t['ticks']:.0f} ticks, mean "
            f"batch {t['rows'] / max(t['ticks'], 1):.1f} rows, "
            f"{t['n_gen_tokens'] / max(t['gen_s'], 1e-9):.0f} generated tok/s."
        )
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="default", help="local HF model directory, or `default`")
    ap.add_argument("--gates", default="always,median", help="comma list of always, median")
    ap.add_argument("--groups", type=int, default=24)
    ap.add_argument("--G", type=int, default=8)
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--T-max", type=int, default=8, dest="T_max")
    ap.add_argument("--K", type=int, default=3)
    ap.add_argument("--max-new-tokens", type=int, default=64, dest="max_new_tokens")
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", type=Path, default=ROOT / "docs" / "bench" / "engine_saving.md")
    args = ap.parse_args()

    import torch

    torch.set_num_threads(args.threads)
    from bench_collect import warm_games

    from srollout.envs.registry import resolve_env
    from srollout.policy import make_policy
    from srollout.rollout.engine import make_specs

    policy = make_policy(
        "lm", model=args.model, temperature=0.7, max_new_tokens=args.max_new_tokens
    )
    specs = make_specs(resolve_env("alfworld").task_set("eval"), args.groups)
    warm_s = warm_games(args.groups)
    stamp = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    machine = (
        f"{platform.machine()}, {os.cpu_count()} cores visible, torch {torch.__version__} on "
        f"{args.threads} thread(s)"
    )
    lines = [
        f"\n## {stamp} — {machine}\n",
        f"Command: `python benchmarks/bench_engine_saving.py {' '.join(sys.argv[1:])}`\n",
        f"Setup: {args.groups} groups of the `eval` set, G={args.G}, concurrency "
        f"{args.concurrency}, T_max={args.T_max}, gate at K={args.K}, model "
        f"`{Path(policy.model_path).name}`, max_new_tokens {args.max_new_tokens}, {args.repeats} "
        f"repeat(s), games pre-loaded in {warm_s:.1f} s.\n",
    ]
    for gate in args.gates.split(","):
        totals = measure(
            policy,
            specs,
            gate=gate,
            G=args.G,
            concurrency=args.concurrency,
            T_max=args.T_max,
            K=args.K,
            repeats=args.repeats,
        )
        lines += report_lines(totals, f"gate `{gate}`")
        print("\n".join(lines[-3:]), flush=True)
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    lines.append(f"\n(load average at the end: {load:.1f} on {os.cpu_count()} cores)")
    if not args.out.exists():
        args.out.write_text(
            "# Engine: wall-clock saving vs generated-token saving\n\n"
            "Appended by `benchmarks/bench_engine_saving.py`; newest last.\n"
        )
    with args.out.open("a") as fh:
        fh.write("\n".join(lines) + "\n")
    print(f"appended to {args.out}")


if __name__ == "__main__":
    main()
