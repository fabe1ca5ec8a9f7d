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

    python benchmarks/golden_noise.py --logits   # appends the log-prob section to the same page

``--logits`` measures what the log-prob tolerance (``LOGPROB_ATOL``) rests on: the shipped
policy's logits and log-probs on 8 x 200 seeded random tokens under each kernel setting against
the native ones (largest absolute difference), then the golden collects rerun with the logits
perturbed by seeded noise of growing amplitude (golden_runs.logit_noise): the largest absolute
log-prob difference against golden.json, and whether any sampled token changed.
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

from golden_runs import (  # noqa: E402
    FLOAT_ATOL,
    FLOAT_RTOL,
    LOGPROB_ATOL,
    compare,
    flat_cells,
    float_kind,
    load_golden,
    logit_noise,
    run_all,
    table_record,
)

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


# One process per kernel setting: the shipped policy's float32 logits on seeded random tokens.
LOGITS_SNIPPET = """
import sys, numpy, torch
from srollout.policy.shipped import default_policy
from srollout.policy.transformers_backend import load_model
torch.set_num_threads(1)
model, _ = load_model(default_policy())
ids = torch.randint(model.config.vocab_size, (8, 200), generator=torch.Generator().manual_seed(0))
with torch.inference_mode():
    numpy.save(sys.argv[1], model(input_ids=ids).logits.float().numpy())
"""
NOISE_AMPLITUDES = (2e-5, 2e-4, 2e-3, 2e-2)
COLLECTS = ["collect-lm", "collect-lm-gated"]


def _logits_under(setting: dict[str, str], path: Path):
    import subprocess

    import numpy as np

    env = {**os.environ, "OMP_NUM_THREADS": "1", **setting}
    cmd = [sys.executable, "-c", LOGITS_SNIPPET, str(path)]
    subprocess.run(cmd, check=True, capture_output=True, env=env, timeout=600)
    return np.load(path)


def _log_softmax(x):
    import numpy as np

    x = x.astype(np.float64)
    m = x.max(-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(-1, keepdims=True))


def logits_section(settings: dict[str, dict[str, str]]) -> list[str]:
    """The log-prob tolerance's two measurements, as markdown lines."""
    import numpy as np

    rows = []
    with tempfile.TemporaryDirectory(prefix="golden-logits-") as tmp:
        native = _logits_under({}, Path(tmp) / "native.npy")
        lp_native = _log_softmax(native)
        top = native.argmax(-1)[..., None]
        for name, env in settings.items():
            if name == "native":
                continue
            other = _logits_under(env, Path(tmp) / "other.npy")
            lp = _log_softmax(other)
            top_lp = np.abs(np.take_along_axis(lp - lp_native, top, -1)).max()
            rows.append(
                f"| {name} | {np.abs(other - native).max():.2g} | {top_lp:.2g} | "
                f"{np.abs(lp - lp_native).max():.2g} |"
            )
            print(rows[-1], flush=True)
    golden = load_golden()
    noise_rows = []
    for amplitude in NOISE_AMPLITUDES:
        with tempfile.TemporaryDirectory(prefix="golden-logit-noise-") as tmp:
            now = run_all(Path(tmp), only=COLLECTS, prelude=logit_noise(amplitude))
        worst = 0.0
        for table, rec in now.items():
            for column, values in golden[table]["floats"].items():
                if float_kind(column) != "logprob":
                    continue
                pairs = zip(flat_cells(values), flat_cells(rec["floats"][column]), strict=True)
                worst = max([worst] + [abs(a - b) for a, b in pairs if a == a and b == b])
        changed = sorted({f"{d.table.split('/')[-1]}:{d.column}" for d in compare(
            {k: v for k, v in golden.items() if k in now}, now) if d.row is None})  # fmt: skip
        noise_rows.append(
            f"| ±{amplitude:g} | {worst:.2g} | {', '.join(changed) or 'none (every token kept)'} |"
        )
        print(noise_rows[-1], flush=True)
    return [
        "### The log-prob tolerance (`--logits`)",
        "",
        "The shipped policy's logits on 8 × 200 seeded random tokens (float32, 1 thread) under "
        "each setting, against the native kernels (largest absolute difference):",
        "",
        "| setting | logits | log-prob of the top token | any log-prob |",
        "|---|---|---|---|",
        *rows,
        "",
        "The golden collects (`collect-lm`, `collect-lm-gated`) rerun with every forward's logits "
        "perturbed by seeded uniform noise (`golden_runs.logit_noise`), against golden.json:",
        "",
        "| logit noise | largest log-prob difference | exact columns that differ |",
        "|---|---|---|",
        *noise_rows,
        "",
        f"The golden runs compare log-prob columns within **{LOGPROB_ATOL:g} absolute**.",
        "",
    ]


def main() -> None:
    from srollout.rundir import machine_info

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--collect-groups", type=int, default=0)
    ap.add_argument("--settings", help="comma list of setting names (native is always run)")
    ap.add_argument("--logits", action="store_true", help="measure the log-prob tolerance only")
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
    if args.logits:
        info = machine_info()
        lines = [
            "",
            f"- date: {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC; "
            f"machine: {info['cpu_model']}, {info['cpu_count']} CPUs, torch's native kernels "
            f"{info.get('torch_cpu_capability', '?')}; command: `python benchmarks/golden_noise.py "
            "--logits`",
            "",
            *logits_section(settings),
        ]
        text = args.out.read_text() if args.out.exists() else ""
        cut = text.find("\n### The log-prob tolerance")
        text = text if cut < 0 else text[: text.rfind("\n- date:", 0, cut)]
        args.out.write_text(text.rstrip("\n") + "\n" + "\n".join(lines))
        print("\n".join(lines))
        return
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
