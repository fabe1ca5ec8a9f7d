"""`--backend vllm-server` against servers srollout did not start: vLLM's own entry point
(`python -m vllm.entrypoints.openai.api_server`), on the shipped default policy, on CPU.

With vLLM's defaults (chunked prefill on, bf16, no dev mode) a seeded rollout would kill the
server's engine; srollout refuses before any generation request, in one line, writes nothing,
and the server lives on. With the fixing flags a tiny collect runs, one completion per step,
also from two Ray workers sharing the one server.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import polars as pl
import pytest

from tests.component.test_vllm_backends import ROOT, free_port

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("vllm") is None, reason="vLLM is not installed: make setup-vllm"
)
TINY = ["--groups", "2", "--G", "2", "--T-max", "4", "--signal-K", "2", "--seed", "3"]
FIX = ["--no-enable-chunked-prefill", "--dtype", "float32", "--enforce-eager"]


def srollout(*args: str | Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    full = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "200", **(env or {})}
    full.pop("SROLLOUT_DEBUG", None)
    return subprocess.run(
        [sys.executable, "-m", "srollout.cli.app", *map(str, args)],
        capture_output=True, text=True, timeout=600, env=full, cwd=ROOT,
    )  # fmt: skip


def start_vllm(flags: list[str], env: dict[str, str]):
    """vLLM's own OpenAI server for the default policy on a free port: (process, URL, log)."""
    from srollout.policy.shipped import default_policy

    port = free_port()
    log = open(Path(os.environ.get("TMPDIR", "/tmp")) / f"vllm-foreign-{port}.log", "w")  # noqa: SIM115
    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server"]
    cmd += ["--model", str(default_policy()), "--port", str(port), *flags]
    base = {k: v for k, v in os.environ.items() if k != "VLLM_SERVER_DEV_MODE"}
    proc = subprocess.Popen(
        cmd,
        stdout=log,
        stderr=subprocess.STDOUT,
        env={**base, "OMP_NUM_THREADS": "1", "VLLM_CPU_KVCACHE_SPACE": "1", **env},
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + 400
    while True:
        try:
            urllib.request.urlopen(f"{url}/v1/models", timeout=2).read()
            return proc, url, log
        except OSError:
            if proc.poll() is not None or time.time() > deadline:
                os.killpg(proc.pid, 9)
                pytest.fail(f"vLLM did not come up: {Path(log.name).read_text()[-3000:]}")
            time.sleep(1)


def stop(proc, log) -> None:
    try:
        os.killpg(proc.pid, 15)
    except ProcessLookupError:  # a server whose engine died has shut itself down
        pass
    proc.wait(timeout=60)
    log.close()


def metric(url: str, name: str) -> float:
    """The sum of a Prometheus counter's samples on the server."""
    text = urllib.request.urlopen(f"{url}/metrics", timeout=5).read().decode()
    return sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith(name + "{"))


def health(url: str) -> int:
    return urllib.request.urlopen(f"{url}/health", timeout=5).status


@pytest.mark.slow  # vLLM's default server starts and compiles, then dies (166-314 s, 2 busy cores)
def test_vllm_default_server_is_refused_before_any_request_and_lives(tmp_path):
    proc, url, log = start_vllm([], {})
    try:
        out = tmp_path / "run"
        res = srollout(
            "collect", *TINY, "--backend", "vllm-server", "--base-url", url, "--out", out
        )
        assert res.returncode == 2, res.stderr
        assert res.stderr.strip().splitlines() == [
            f"error: the vLLM server at {url} does not say its device and whether chunked "
            "prefill is on (vLLM shows them at /server_info only with VLLM_SERVER_DEV_MODE=1), "
            "and a CPU server with chunked prefill on dies on seeded requests: restart it with "
            "VLLM_SERVER_DEV_MODE=1 (on a CPU also --no-enable-chunked-prefill --dtype float32), "
            "use `srollout serve`, or set SROLLOUT_UNCHECKED_SERVER=1 for a GPU server"
        ]
        assert not out.exists()
        assert health(url) == 200
        assert metric(url, "vllm:request_success_total") == 0  # no request reached the engine

        # told to go on unchecked, the collect kills it: the line says so, and why
        res = srollout(
            "collect", "--groups", "8", "--G", "4", "--T-max", "15",
            "--backend", "vllm-server", "--base-url", url,
            "--out", tmp_path / "unchecked", env={"SROLLOUT_UNCHECKED_SERVER": "1"},
        )  # fmt: skip
        lines = res.stderr.strip().splitlines()
        assert res.returncode == 2 and len(lines) == 2, res.stderr
        assert lines[0].startswith(f"warning: the vLLM server at {url}: not checked")
        assert lines[1] in (
            f"error: the vLLM server at {url} died during the run (its engine said: EngineCore "
            "encountered an issue. See stack trace (above) for the root cause.)",
            f"error: the vLLM server at {url} died during the run (it stopped answering)",
        )
    finally:
        stop(proc, log)


@pytest.mark.slow  # vLLM's server starts, two tiny collects, one on Ray (~256 s, 2 busy cores)
def test_vllm_server_with_the_fixing_flags_serves_one_and_two_workers(tmp_path):
    proc, url, log = start_vllm(FIX, {"VLLM_SERVER_DEV_MODE": "1"})
    try:
        out = tmp_path / "one"
        res = srollout(
            "collect", *TINY, "--backend", "vllm-server", "--base-url", url, "--out", out
        )
        assert res.returncode == 0, res.stderr
        steps = pl.read_parquet(out / "steps.parquet")
        assert pl.read_parquet(out / "trajectories.parquet").height == 4
        assert 4 <= steps.height <= 16
        # one completion per step, every one answered by this server
        assert metric(url, "vllm:request_success_total") == steps.height
        if importlib.util.find_spec("ray") is None:
            pytest.skip("the `dist` extra (ray) is not installed: --workers 2 not tried")
        two = tmp_path / "two"
        res = srollout(
            "collect", *TINY, "--backend", "vllm-server", "--base-url", url,
            "--workers", "2", "--concurrency", "2", "--out", two,
        )  # fmt: skip
        assert res.returncode == 0, res.stderr
        manifest = json.loads((two / "manifest.json").read_text())
        assert manifest["status"] == "complete" and manifest["workers"] == 2
        steps2 = pl.read_parquet(two / "steps.parquet")
        assert metric(url, "vllm:request_success_total") == steps.height + steps2.height
        cols = ["group_id", "traj_idx", "step", "action", "response"]
        assert steps2.select(cols).sort(cols[:3]).equals(steps.select(cols).sort(cols[:3]))
    finally:
        stop(proc, log)
