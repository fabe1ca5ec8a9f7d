"""Run every benchmark, one after another, then assemble docs/benchmarks.md.

    python benchmarks/run_all.py                 # all benchmarks (tens of minutes on 2 cores)
    python benchmarks/run_all.py --only core,envs
    python benchmarks/run_all.py --assemble-only # just rebuild docs/benchmarks.md

Each benchmark writes its own section to docs/bench/<name>.md with the date and machine it ran
on; docs/benchmarks.md is those sections in pipeline order. Benchmarks are not timed tests:
compare ratios measured within one section, not numbers across sections or machines.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BENCH_DIR = ROOT / "docs" / "bench"

# name -> the command's arguments (each script writes docs/bench/<name>.md)
BENCHMARKS: dict[str, list[str]] = {
    "core": ["benchmarks/bench_core.py"],
    "analyze_sweep": ["benchmarks/bench_analyze_sweep.py"],
    "envs": ["benchmarks/bench_envs.py"],
    "policy": ["benchmarks/bench_policy.py"],
    "collect": ["benchmarks/bench_collect.py", "--what", "quick,gate,default"],
    "trl_gate": ["benchmarks/bench_trl_gate.py", "--steps", "6"],
}

HEADER = """# Benchmarks

Measured by the scripts in `benchmarks/` (`make bench`, or one script at a time). Every section
says when and on what machine it ran. These shared 2-core machines are noisy: read the ratios
measured side by side within a section; absolute times move by tens of percent between runs.

The paper's tables at full size (the 500-group buffer, the gates held out, Tiers 1–3 over seeds)
are on their own page, [results.md](results.md), with every command; `benchmarks/heldout_eval.py`
and `benchmarks/offpolicy_seeds.py` make two of its tables.
"""


def assemble() -> Path:
    parts = [HEADER]
    for name in BENCHMARKS:
        section = BENCH_DIR / f"{name}.md"
        if section.exists():
            # each section's headings move one level down under this page's title
            lines = section.read_text().strip().splitlines()
            parts.append("\n".join("#" + ln if ln.startswith("#") else ln for ln in lines) + "\n")
    out = ROOT / "docs" / "benchmarks.md"
    out.write_text("\n".join(parts))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", default=",".join(BENCHMARKS), help="comma list of benchmark names")
    ap.add_argument("--assemble-only", action="store_true")
    args = ap.parse_args()
    if not args.assemble_only:
        for name in args.only.split(","):
            if name not in BENCHMARKS:
                sys.exit(f"unknown benchmark {name!r}; known: {', '.join(BENCHMARKS)}")
            print(f"== {name}", flush=True)
            subprocess.run([sys.executable, *BENCHMARKS[name]], cwd=ROOT, check=True)
    print(f"wrote {assemble()}")


if __name__ == "__main__":
    main()
