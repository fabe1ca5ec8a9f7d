"""How far training floats move when only the CPU kernels change: the measurement behind the
golden runs' float tolerance (tests/golden/golden_runs.py, FLOAT_RTOL).

    python benchmarks/golden_noise.py                   # writes docs/bench/golden_noise.md
    python benchmarks/golden_noise.py --collect-groups 16  # also a larger collect per setting

One process cannot try another processor, but it can make torch take other kernels on this one,
which is what a different CPU does: ATen's SIMD family (``ATEN_CPU_CAPABILITY``), oneDNN's
(``ONEDNN_MAX_CPU_ISA``), MKL's GEMM code path (``MKL_ENABLE_INSTRUCTIONS``) and the thread count
(another split of every sum). Each setting reruns the golden runs that use the shipped model
(``collect-lm``, ``train-offpolicy``, ``train-onpolicy``) and is compared with the machine's own
choice: exact columns must be equal, and every float column reports its largest relative
difference. ``--collect-groups N`` adds a default-size collect (G 8, T_max 30) of N groups per
setting, to see whether kernel noise ever changes a sampled token.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "golden"))

from golden_runs import FLOAT_ATOL, FLOAT_RTOL, flat_cells, table_record  # noqa: E402

# setting name -> environment (on top of the golden runs' OMP_NUM_THREADS=1)
SETTINGS: dict[str, dict[str, str]] = {
    "native": {},
    "ATen default (no SIMD)": {"ATEN_CPU_CAPABILITY": "default"},
    "ATen AVX2 + oneDNN AVX2": {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2"},
    "ATen AVX-512": {"ATEN_CPU_CAPABILITY": "avx512"},
    "oneDNN SSE4.1": {"ONEDNN_MAX_CPU_ISA": "SSE41"},
    "MKL SSE4.2": {"MKL_ENABLE_INSTRUCTIONS": "SSE4_2"},
    "2 threads": {"OMP_NUM_THREADS": "2"},
    # MKL's own reproducible code path: another GEMM kernel on any CPU (on an AMD CPU MKL ignores
    # MKL_ENABLE_INSTRUCTIONS and this is the one knob that changes its matmuls)
    "MKL COMPATIBLE": {"MKL_CBWR": "COMPATIBLE"},
    "ATen default + MKL COMPATIBLE": {"ATEN_CPU_CAPABILITY": "default", "MKL_CBWR": "COMPATIBLE"},
}
TRAINING = ["collect-lm", "train-offpolicy", "train-onpolicy"]


def _has_avx512() -> bool:
    try:
        return " avx512f " in Path("/proc/cpuinfo").read_text()
    except OSError:
        return False


def _collect(root: Path, groups: int, env: dict[str, str]) -> dict[str, dict]:
    import subprocess

    out = root / "collect-default"
    cmd = [sys.executable, "-m", "srollout.cli.app", "collect", "--groups", str(groups)]
    cmd += ["--seed", "11", "--out", str(out)]
    full = {**os.environ, "OMP_NUM_THREADS": "1", "CI": "true", **env}
    subprocess.run(cmd, check=True, capture_output=True, env=full, timeout=3600)
    import polars as pl

    tokens = int(pl.read_parquet(out / "steps.parquet")["n_gen_tokens"].sum())
    print(f"  collect: {tokens} sampled tokens", flush=True)
    return {
        f"collect-default/{t.name}": table_record(t)
        for t in sorted(out.glob("*.parquet"))
        if t.name in ("steps.parquet", "trajectories.parquet", "groups.parquet")
    }


def _rel(a, b) -> float:
    if a is None or b is None or (isinstance(a, float) and math.isnan(a)):
        return 0.0 if a is b or (a != a and b != b) else math.inf
    return abs(a - b) / max(abs(a), 1e-12)


def main() -> None:
    from golden_runs import run_all

    from srollout.rundir import machine_info

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--collect-groups", type=int, default=0)
    ap.add_argument("--settings", help="comma list of setting names (native is always run)")
    ap.add_argument("--out", type=Path, default=ROOT / "docs" / "bench" / "golden_noise.md")
    args = ap.parse_args()
    import torch  # noqa: F401  (loaded, so machine_info names torch's native kernels)

    chosen = set(args.settings.split(",")) | {"native"} if args.settings else set(SETTINGS)
    if unknown := chosen - set(SETTINGS):
        ap.error(f"unknown settings {sorted(unknown)}; known: {', '.join(SETTINGS)}")
    settings = {
        k: v
        for k, v in SETTINGS.items()
        if k in chosen and ("avx512" not in str(v) or _has_avx512())
    }
    started = datetime.now(timezone.utc)
    records: dict[str, dict[str, dict]] = {}
    seconds: dict[str, float] = {}
    for name, env in settings.items():
        t0 = time.perf_counter()
        with tempfile.TemporaryDirectory(prefix="golden-noise-") as tmp:
            records[name] = run_all(Path(tmp), only=TRAINING, env=env)
            if args.collect_groups:
                records[name].update(_collect(Path(tmp), args.collect_groups, env))
        seconds[name] = time.perf_counter() - t0
        print(f"{name}: {seconds[name]:.0f} s", flush=True)

    base = records["native"]
    rows, worst = [], 0.0
    for name in settings:
        if name == "native":
            continue
        exact_diff = sorted(
            f"{t}:{c}"
            for t, rec in base.items()
            for c, digest in rec["exact"].items()
            if records[name][t]["exact"].get(c) != digest
        )
        per_col = {}
        for t, rec in base.items():
            for c, vals in rec["floats"].items():
                now = flat_cells(records[name][t]["floats"][c])
                pairs = zip(flat_cells(vals), now, strict=True)
                per_col[f"{t.split('/')[0]} {c}"] = max((_rel(a, b) for a, b in pairs), default=0)
        top = max(per_col, key=per_col.get)
        worst = max(worst, per_col[top]) if not exact_diff else worst
        rows.append(
            f"| {name} | {', '.join(exact_diff) or 'none'} | {per_col[top]:.2g} ({top}) | "
            f"{seconds[name]:.0f} |"
        )

    info = machine_info()
    lines = [
        "## Golden runs under other CPU kernels (`benchmarks/golden_noise.py`)",
        "",
        f"- date: {started:%Y-%m-%d %H:%M} UTC",
        f"- machine: {info['cpu_model']}, {info['cpu_count']} CPUs, {info['platform']}, "
        f"torch's native kernels {info.get('torch_cpu_capability', '?')}",
        "- command: `python benchmarks/golden_noise.py"
        + (f" --collect-groups {args.collect_groups}" if args.collect_groups else "")
        + (f' --settings "{args.settings}"' if args.settings else "")
        + "`",
        "- each setting reruns `collect-lm`, `train-offpolicy` and `train-onpolicy --preset tiny`"
        " (tests/golden/golden_runs.py)"
        + (
            f" and a default collect of {args.collect_groups} groups (G 8, T_max 30)"
            if args.collect_groups
            else ""
        )
        + ", compared with the native run",
        "",
        "| setting | exact columns that differ | largest relative float difference (where) | s |",
        "|---|---|---|---|",
        *rows,
        "",
        f"Largest relative float difference among settings whose exact columns all agree: "
        f"**{worst:.2g}**. The golden tolerance is rtol {FLOAT_RTOL:g} (atol {FLOAT_ATOL:g}).",
        "",
    ]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
