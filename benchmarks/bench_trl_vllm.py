"""The same TRL GRPO run through HF ``generate`` and through TRL's vLLM engine, gated and ungated.

    python benchmarks/bench_trl_vllm.py --steps 4 --groups 4            # make setup-vllm first
    python benchmarks/bench_trl_vllm.py --steps 2 --groups 2 --G 4 --T-max 6 --K 2 --out /tmp/b
    python benchmarks/bench_trl_vllm.py --from runs/bench-trl-vllm      # only report

Four runs of ``examples/trl_grpo_alfworld.py`` with one seed (same prompts, same engine seeds, so
the gated and ungated runs of a backend agree up to step K of the first step's groups): backend
``transformers`` (the trainer's module) and ``vllm`` (TRL's colocate engine, srollout's CPU
settings), each ``--no-gate`` and gated. One after another, not side by side, so that no run
takes cores from another; the order alternates the arms (base, gated, gated, base) so that a drift
in the machine's load does not fall on one arm. Per run: seconds per training step (TRL's
``train()`` wall ÷ steps; the engine start is in the process wall, not in it), the step times
TRL logged, generated tokens and groups cut. Per backend, the gate's saving: wall-clock saving,
generated-token saving and wall saving ÷ token saving (1.0: every token the gate saves is wall
time saved). Writes ``report.md`` and ``report.json`` in ``--out``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RUNS = (
    ("transformers", "baseline"),
    ("transformers", "gated"),
    ("vllm", "gated"),
    ("vllm", "baseline"),
)


def run_one(out: Path, backend: str, arm: str, extra: list[str]) -> float:
    """Run one arm; the process's wall-clock seconds (engine start included)."""
    name = f"{backend}-{arm}"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TRL_EXPERIMENTAL_SILENCE": "1"}
    cmd = [
        sys.executable,
        str(ROOT / "examples" / "trl_grpo_alfworld.py"),
        "--backend",
        backend,
        "--out",
        str(out / name),
        *extra,
        *(["--no-gate"] if arm == "baseline" else []),
    ]
    t0 = time.perf_counter()
    with open(out / f"{name}.log", "w") as log:
        rc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=ROOT).returncode
    if rc:
        sys.exit(f"{name} failed ({rc}); see {out / f'{name}.log'}")
    return time.perf_counter() - t0


def saving(base: float, gated: float) -> float | None:
    return None if not base else 1.0 - gated / base


def report(out: Path, process_s: dict[str, float], note: str) -> dict:
    rows, by = [], {}
    for backend, arm in RUNS:
        name = f"{backend}-{arm}"
        s = json.loads((out / name / "srollout-summary.json").read_text())
        assert s["backend"] == backend, (name, s["backend"])
        row = {
            "backend": backend,
            "arm": arm,
            "steps": s["steps"],
            "s_per_step": s["wall_s"] / s["steps"],
            "step_times": [p.get("step_time") for p in s["per_step"]],
            "gen_tokens": s["gen_tokens"],
            "groups": s["groups"],
            "groups_cut": s["groups_cut"],
            "train_wall_s": s["wall_s"],
            "process_wall_s": process_s.get(name),
        }
        rows.append(row)
        by[(backend, arm)] = row
    gate = {}
    for backend in ("transformers", "vllm"):
        b, g = by[(backend, "baseline")], by[(backend, "gated")]
        wall = saving(b["train_wall_s"], g["train_wall_s"])
        tok = saving(b["gen_tokens"], g["gen_tokens"])
        gate[backend] = {
            "wall_saving": wall,
            "token_saving": tok,
            "wall_per_token_saving": (wall / tok) if wall is not None and tok else None,
        }
    speed = {
        arm: (
            by[("transformers", arm)]["s_per_step"] / by[("vllm", arm)]["s_per_step"]
            if by[("vllm", arm)]["s_per_step"]
            else None
        )
        for arm in ("baseline", "gated")
    }
    result = {"rows": rows, "gate": gate, "hf_over_vllm_s_per_step": speed, "note": note}
    (out / "report.json").write_text(json.dumps(result, indent=2) + "\n")

    def pct(x: float | None) -> str:
        return "n/a" if x is None else f"{100 * x:.1f}%"

    lines = [
        f"# TRL GRPO through HF generate and vLLM, gated and ungated ({note})",
        "",
        "| backend | arm | s/step | TRL step times (s) | generated tokens | groups cut | "
        "process wall (s) |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        times = ", ".join(f"{t:.1f}" for t in r["step_times"] if t is not None)
        lines.append(
            f"| {r['backend']} | {r['arm']} | {r['s_per_step']:.1f} | {times} | {r['gen_tokens']} "
            f"| {r['groups_cut']}/{r['groups']} | {r['process_wall_s'] or float('nan'):.0f} |"
        )
    lines.append("")
    for backend, g in gate.items():
        ratio = g["wall_per_token_saving"]
        lines.append(
            f"- {backend}: the gate saves {pct(g['wall_saving'])} of the training wall-clock and "
            f"{pct(g['token_saving'])} of the generated tokens: wall ÷ token saving = "
            f"{'n/a' if ratio is None else f'{ratio:.2f}'}"
        )
    for arm, x in speed.items():
        lines.append(f"- {arm}: HF generate s/step ÷ vLLM s/step = {x:.2f}" if x else "")
    (out / "report.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="runs/bench-trl-vllm")
    parser.add_argument("--from", dest="from_", default=None, help="only report these runs")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--groups", type=int, default=4)
    parser.add_argument("--G", type=int, default=8)
    parser.add_argument("--T-max", type=int, default=20)
    parser.add_argument("--K", type=int, default=10)
    parser.add_argument("--d-L", type=float, default=0.12)
    parser.add_argument("--tasks", type=int, default=64)
    parser.add_argument("--note", default="", help="e.g. 'idle machine' or 'loaded machine'")
    args = parser.parse_args()
    note = args.note or f"{platform.node()}, {os.cpu_count()} CPUs, {dt.date.today()}"
    if args.from_:
        out = Path(args.from_)
        times = json.loads((out / "process_s.json").read_text())
        report(out, times, note)
        return
    out = Path(args.out)
    if out.exists():
        sys.exit(f"{out} exists; give a new --out (nothing is overwritten)")
    out.mkdir(parents=True)
    extra = [
        *("--steps", str(args.steps), "--groups", str(args.groups), "--G", str(args.G)),
        *("--T-max", str(args.T_max), "--K", str(args.K), "--d-L", str(args.d_L)),
        *("--tasks", str(args.tasks)),
    ]
    times: dict[str, float] = {}
    for backend, arm in RUNS:
        print(f"{backend} {arm} ...", flush=True)
        times[f"{backend}-{arm}"] = run_one(out, backend, arm, extra)
        (out / "process_s.json").write_text(json.dumps(times, indent=2) + "\n")
    report(out, times, note)


if __name__ == "__main__":
    main()
