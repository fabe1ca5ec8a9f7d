"""A real two-node Ray cluster on this machine, started with Ray's own commands (`ray start --head`,
then `ray start --address=...`, loopback only, token authentication on as Ray 2.60's head turns
it on), reached through `RAY_ADDRESS`: `collect --workers 2` runs one worker on each node and
writes what one process writes; bad clusters are one line and exit 2.

Each node is a `ray start --block` process in its own session, stopped by signalling its process
group, so the test never runs `ray stop` (which would stop every Ray on the machine)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import polars as pl
import pytest

pytest.importorskip("ray", reason="the `dist` extra (ray) is not installed")

from srollout.rollout.records import TIMING_COLUMNS  # noqa: E402

pytestmark = pytest.mark.slow  # ~60 s: two Ray nodes start, three small collects

RAY = str(Path(sys.executable).with_name("ray"))
TABLES = ("steps", "trajectories", "groups", "signals")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start_node(args: list[str], env: dict[str, str], log: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [RAY, "start", "--block", "--num-cpus", "1", "--disable-usage-stats", *args],
        env=env,
        stdout=log.open("w"),
        stderr=subprocess.STDOUT,
        start_new_session=True,  # its own process group: the node and what it starts
    )


def _stop(node: subprocess.Popen) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(node.pid, sig)
        except ProcessLookupError:
            return
        try:
            node.wait(timeout=15)
            return
        except subprocess.TimeoutExpired:
            continue


def _alive_nodes(address: str, env: dict[str, str]) -> int:
    code = (
        f"import ray; ray.init(address={address!r}, logging_level='ERROR'); "
        "print(sum(1 for n in ray.nodes() if n['Alive']))"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
    )
    return int(proc.stdout.strip().splitlines()[-1]) if proc.returncode == 0 else 0


@contextmanager
def two_nodes(home: Path) -> Iterator[tuple[str, list[subprocess.Popen]]]:
    """Two Ray nodes of 1 CPU each on loopback, the head's token in HOME/.ray/auth_token; yields
    (address, [head, node])."""
    env = {**os.environ, "HOME": str(home), "RAY_AUTH_MODE": "token"}
    env.pop("RAY_ADDRESS", None)
    subprocess.run([RAY, "get-auth-token", "--generate"], env=env, check=True, timeout=60)
    port = _free_port()
    address = f"127.0.0.1:{port}"
    # Ray's sockets live under --temp-dir, and a socket path may not pass 107 bytes: keep it short
    temp = tempfile.mkdtemp(prefix="ray-", dir="/tmp")
    head = _start_node(
        ["--head", "--port", str(port), "--node-ip-address", "127.0.0.1",
         "--include-dashboard", "false", "--temp-dir", temp],
        env, home / "head.log",
    )  # fmt: skip
    nodes = [head]
    try:
        deadline = time.monotonic() + 120
        while _alive_nodes(address, env) < 1:
            assert time.monotonic() < deadline, (home / "head.log").read_text()[-2000:]
            time.sleep(2)
        nodes.append(
            _start_node(
                ["--address", address, "--node-ip-address", "127.0.0.1"], env, home / "node.log"
            )
        )
        while _alive_nodes(address, env) < 2:
            assert time.monotonic() < deadline, (home / "node.log").read_text()[-2000:]
            time.sleep(2)
        yield address, nodes
    finally:
        for node in reversed(nodes):
            _stop(node)
        shutil.rmtree(temp, ignore_errors=True)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """Two Ray nodes of 1 CPU each on loopback; yields (address, HOME of the cluster's user)."""
    home = tmp_path_factory.mktemp("ray-home")
    with two_nodes(home) as (address, _):
        yield address, home


def srollout(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    """The CLI in a process of its own, as a user runs it (Ray state stays out of pytest's)."""
    env = {**env, "OMP_NUM_THREADS": "1", "COLUMNS": "200"}
    env.pop("SROLLOUT_DEBUG", None)
    cmd = [sys.executable, "-m", "srollout.cli.app", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)


def _user_env(home: Path, address: str | None) -> dict[str, str]:
    """A user's shell on the cluster's machine who never heard of Ray's token mode: HOME holds
    (or not) a token, RAY_AUTH_MODE is unset, SROLLOUT_HOME is where the games are cached."""
    from srollout.home import srollout_home

    env = {**os.environ, "HOME": str(home), "SROLLOUT_HOME": str(srollout_home())}
    for name in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH", "RAY_ADDRESS"):
        env.pop(name, None)
    if address:
        env["RAY_ADDRESS"] = address
    return env


def _collect(out: Path, *extra: str) -> list[str]:
    return [
        "collect", "--policy", "noisy-expert", "--groups", "4", "--G", "2", "--T-max", "4",
        "--seed", "3", "--signal-K", "2", "--out", str(out), *extra,
    ]  # fmt: skip


def _table(run: Path, name: str) -> pl.DataFrame:
    df = pl.read_parquet(run / f"{name}.parquet")
    return df.drop([c for c in df.columns if c in TIMING_COLUMNS])


def test_collect_on_two_nodes_lands_a_worker_on_each_and_writes_what_one_process_writes(
    cluster, tmp_path
):
    address, home = cluster
    one = srollout(*_collect(tmp_path / "one"), env=_user_env(home, None))
    assert one.returncode == 0, one.stderr
    two = srollout(*_collect(tmp_path / "two", "--workers", "2"), env=_user_env(home, address))
    assert two.returncode == 0, two.stderr
    dist = json.loads((tmp_path / "two" / "manifest.json").read_text())["dist"]
    assert dist["workers"] == 2 and dist["nodes"] == 2, dist
    assert len(set(dist["worker_nodes"])) == 2 and "" not in dist["worker_nodes"]
    assert dist["ray"] == f"Ray cluster at {address} (2 CPUs, 2 nodes)"
    for name in TABLES:
        a, b = _table(tmp_path / "one", name), _table(tmp_path / "two", name)
        assert a.height > 0 and a.equals(b), name


def test_more_workers_than_the_cluster_has_cpus_is_one_line(cluster, tmp_path):
    address, home = cluster
    res = srollout(*_collect(tmp_path / "run", "--workers", "3"), env=_user_env(home, address))
    assert res.returncode == 2, res.stderr
    assert (
        f"--workers 3 needs 3 CPUs, but the Ray cluster at {address} has 2 (2 nodes)" in res.stderr
    )
    assert "Traceback" not in res.stderr


def test_a_client_without_the_token_is_told_what_to_set(cluster, tmp_path):
    address, _ = cluster
    env = _user_env(tmp_path, address)  # a HOME without ~/.ray/auth_token
    res = srollout(*_collect(tmp_path / "run", "--workers", "2"), env=env)
    assert res.returncode == 2, res.stderr
    assert f"the Ray cluster at {address} did not let this client join" in res.stderr
    assert "needs RAY_AUTH_MODE=token" in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1, res.stderr


def test_ray_address_pointing_at_nothing_is_one_line(tmp_path):
    env = _user_env(tmp_path, f"127.0.0.1:{_free_port()}")
    t0 = time.monotonic()
    res = srollout(*_collect(tmp_path / "run", "--workers", "2"), env=env)
    assert res.returncode == 2, res.stderr
    assert "could not join a Ray cluster there" in res.stderr and "Traceback" not in res.stderr
    assert time.monotonic() - t0 < 120


def test_train_onpolicy_seeds_on_two_nodes_equal_seeds_in_sequence(cluster, tiny_policy, tmp_path):
    address, home = cluster
    args = [
        "train-onpolicy", "--preset", "tiny", "--seeds", "7,13", "--model", str(tiny_policy),
        "--iterations", "1", "--n-eval", "1", "--no-interleave",
    ]  # fmt: skip
    seq = srollout(*args, "--out", str(tmp_path / "seq"), env=_user_env(home, None))
    assert seq.returncode == 0, seq.stderr[-2000:]
    par = srollout(
        *args, "--workers", "2", "--out", str(tmp_path / "par"), env=_user_env(home, address)
    )
    assert par.returncode == 0, par.stderr[-2000:]
    trained = json.loads((tmp_path / "par" / "manifest.json").read_text())["dist"]["trained"]
    assert sorted(t["seed"] for t in trained) == [7, 13]
    assert len({t["node"] for t in trained}) == 2 and all(t["node"] for t in trained), trained
    for name in ("metrics", "eval"):
        a, b = (pl.read_parquet(tmp_path / run / f"{name}.parquet") for run in ("seq", "par"))
        timing = [c for c in a.columns if c.endswith("_s") or c == "tok_per_s"]
        a, b = a.drop(timing), b.drop(timing)
        keys = [c for c in ("seed", "arm", "iteration", "task_id") if c in a.columns]
        assert a.height > 0 and a.sort(keys).equals(b.sort(keys)), name


def test_a_node_dying_mid_run_is_one_line_keeps_the_finished_groups_and_resume_completes(
    tmp_path_factory, tmp_path
):
    """The second node is killed (its whole process group, as a machine that goes away) once the
    first groups are written: the run stops with one line naming the node, exit 2, the groups
    that finished stay, and --resume on the head alone writes what one process writes."""
    home = tmp_path_factory.mktemp("ray-home-dies")
    args = _collect(tmp_path / "run", "--groups", "60", "--T-max", "8", "--concurrency", "2")
    with two_nodes(home) as (address, nodes):
        env = {**_user_env(home, address), "OMP_NUM_THREADS": "1", "COLUMNS": "200"}
        cmd = [sys.executable, "-m", "srollout.cli.app", *args, "--workers", "2"]
        run = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True)  # fmt: skip
        parts = tmp_path / "run" / "parts"
        deadline = time.monotonic() + 180
        while not (parts.is_dir() and any(p.is_dir() and not p.name.startswith(".")
                                          for p in parts.iterdir())):  # fmt: skip
            assert run.poll() is None and time.monotonic() < deadline, run.communicate()
            time.sleep(0.2)
        _stop(nodes[1])
        _, stderr = run.communicate(timeout=240)
    assert run.returncode == 2, stderr
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in stderr, stderr
    assert "died mid-run, taking its worker" in lines[0] and "--resume" in lines[0], lines[0]
    kept = int(lines[0].split("; ")[1].split(" of ")[0])
    finished = [p for p in parts.iterdir() if p.is_dir() and not p.name.startswith(".")]
    assert 0 < kept == len(finished) < 60, (kept, len(finished))
    # the cluster is gone: --resume in one process (no RAY_ADDRESS) rolls out the rest
    resumed = srollout(*args, "--resume", env=_user_env(home, None))
    assert resumed.returncode == 0, resumed.stderr
    one = srollout(*_collect(tmp_path / "one", "--groups", "60", "--T-max", "8",
                             "--concurrency", "2"), env=_user_env(home, None))  # fmt: skip
    assert one.returncode == 0, one.stderr
    for name in TABLES:
        a, b = _table(tmp_path / "one", name), _table(tmp_path / "run", name)
        assert a.height > 0 and a.equals(b), name
