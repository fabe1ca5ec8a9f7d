"""srollout.rollout.ray_pool without Ray: chunking, the summed summary, a worker run in process
(pooled environments), and the one-line error when the `dist` extra is missing."""

from __future__ import annotations

import sys
from functools import partial

import pytest
from corridor_env import Corridor, Prompter, SeededWalker, roll, steps_of, tasks

from srollout.errors import SrolloutError
from srollout.rollout.engine import RolloutSettings, RolloutSummary, make_specs
from srollout.rollout.ray_pool import (
    RolloutWorker,
    WorkerRecipe,
    chunk_size,
    chunked,
    default_chunk_groups,
)


def test_chunks_are_consecutive_in_group_order_whatever_the_input_order():
    specs = make_specs(tasks([2] * 7), 7)
    chunks = chunked(list(reversed(specs)), 3)
    assert [[s.index for s in c] for c in chunks] == [[0, 1, 2], [3, 4, 5], [6]]
    with pytest.raises(SrolloutError):
        chunked(specs, 0)


def test_default_chunk_is_twice_the_groups_a_worker_holds():
    assert default_chunk_groups(RolloutSettings(G=8, concurrency=64)) == 16  # 64 // 8 = 8 in flight
    assert default_chunk_groups(RolloutSettings(G=8, concurrency=12)) == 2  # one group fits
    assert default_chunk_groups(RolloutSettings(G=3, concurrency=6)) == 4
    # a short run is shared out: 8 groups on 2 workers -> 4 each, not one chunk of 16
    assert chunk_size(RolloutSettings(G=8, concurrency=64), n_groups=8, workers=2) == 4
    assert chunk_size(RolloutSettings(G=8, concurrency=64), n_groups=100, workers=2) == 16
    assert chunk_size(RolloutSettings(G=8, concurrency=64), n_groups=9, workers=2) == 5


def test_summed_summary_hand_numbers():
    a = RolloutSummary(
        groups=2,
        wall_s=5.0,
        gen_s=3.0,
        env_s=1.0,
        reset_s=0.5,
        overhead_s=0.5,
        ticks=4,
        rows=20,
        mean_batch=5.0,
        n_gen_tokens=100,
        n_prompt_tokens=400,
        n_cut=1,
    )
    b = RolloutSummary(
        groups=1,
        wall_s=4.0,
        gen_s=2.0,
        env_s=0.5,
        reset_s=0.5,
        overhead_s=1.0,
        ticks=6,
        rows=10,
        mean_batch=10 / 6,
        n_gen_tokens=50,
        n_prompt_tokens=100,
        n_cut=0,
    )
    s = RolloutSummary.total([a, b], wall_s=6.0, workers=2)
    # 2 workers x 6 s = 12 worker-seconds; 5 + 1.5 + 1 of them generated, stepped or reset
    assert (s.groups, s.gen_s, s.env_s, s.reset_s, s.wall_s) == (3, 5.0, 1.5, 1.0, 6.0)
    assert s.overhead_s == pytest.approx(12.0 - 7.5)
    assert (s.ticks, s.rows, s.mean_batch, s.n_gen_tokens, s.n_prompt_tokens, s.n_cut) == (
        10,
        30,
        3.0,
        150,
        500,
        1,
    )


def test_a_worker_in_process_equals_the_engine_and_reuses_its_environments():
    settings = RolloutSettings(G=3, T_max=6, seed=5, concurrency=6, signal_K=(2, 4))
    specs = make_specs(tasks([2, 3, 4, 5, 6]), 5)
    made: list[Corridor] = []

    def factory():
        made.append(Corridor())
        return made[-1]

    worker = RolloutWorker(
        WorkerRecipe(partial(SeededWalker, 0.6), factory, Prompter(), settings, threads=None)
    )
    info = worker.start()
    assert info.policy == "walker" and info.build_s >= 0
    first = worker.run(specs[:3])
    n_envs = len(made)
    second = worker.run(specs[3:])
    # the second chunk ran on the first chunk's environments (lent to the engine, which never
    # closes them)
    assert len(made) == n_envs <= settings.concurrency and not any(env.closed for env in made)
    records = first.records + second.records
    assert sorted(r.group_id for r in records) == [s.group_id for s in specs]
    ref, _ = roll(specs, settings, policy=SeededWalker(0.6))
    assert steps_of(records).equals(steps_of(ref))
    assert first.summary.groups + second.summary.groups == 5


@pytest.mark.parametrize(
    "command",
    [
        ["collect", "--policy", "noisy-expert", "--groups", "2"],
        ["train-onpolicy", "--preset", "tiny"],
    ],
)
def test_workers_without_ray_is_one_line_naming_the_extra(run_cli, monkeypatch, tmp_path, command):
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray -> ImportError, as without the extra
    out = tmp_path / "run"
    res = run_cli(*command, "--workers", "2", "--out", out)
    assert res.exit_code == 2
    assert (
        "error: --workers 2 runs on Ray, which is not installed: pip install 'srollout[dist]'"
        in res.stderr
    )
    assert "Traceback" not in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1
    assert not out.exists()  # refused before the run directory was made


def test_the_message_names_the_dist_extra(monkeypatch):
    from srollout.rollout.ray_pool import require_ray

    monkeypatch.setitem(sys.modules, "ray", None)
    with pytest.raises(
        SrolloutError,
        match=r"^--workers 3 runs on Ray, which is not installed: pip install 'srollout\[dist\]'$",
    ):
        require_ray(3)


def test_zero_workers_is_refused(run_cli, tmp_path):
    res = run_cli(
        "collect",
        "--policy",
        "noisy-expert",
        "--groups",
        "2",
        "--workers",
        "0",
        "--out",
        tmp_path / "r",
    )
    assert res.exit_code == 2 and "--workers must be >= 1" in res.stderr


def test_a_ray_token_is_found_where_ray_looks_for_one(monkeypatch, tmp_path):
    from srollout.rollout.ray_pool import ray_token_available

    for name in ("RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert not ray_token_available()
    (tmp_path / ".ray").mkdir()
    (tmp_path / ".ray" / "auth_token").write_text("abc")
    assert ray_token_available()  # ~/.ray/auth_token, where `ray start --head` leaves it
    monkeypatch.setenv("RAY_AUTH_TOKEN_PATH", str(tmp_path / "elsewhere"))
    assert not ray_token_available()  # an explicit path wins over the default one
    (tmp_path / "elsewhere").write_text("abc")
    assert ray_token_available()
    monkeypatch.setenv("RAY_AUTH_TOKEN_PATH", str(tmp_path / "missing"))
    monkeypatch.setenv("RAY_AUTH_TOKEN", "abc")
    assert ray_token_available()


def test_a_failed_join_says_what_to_do(monkeypatch, tmp_path):
    from srollout.rollout.ray_pool import _join_error

    monkeypatch.setenv("HOME", str(tmp_path))
    for name in ("RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH", "RAY_AUTH_MODE"):
        monkeypatch.delenv(name, raising=False)
    refused = _join_error("10.0.0.1:6379", RuntimeError("InvalidAuthToken: token mismatch"))
    assert refused.startswith("the Ray cluster at 10.0.0.1:6379 did not let this client join")
    assert "(RAY_AUTH_MODE=unset, token not found)" in refused
    assert "needs RAY_AUTH_MODE=token" in refused and refused.endswith("token mismatch")
    nothing = _join_error("10.0.0.1:6379", ConnectionError("could not connect\n  to GCS"))
    assert nothing == (
        "RAY_ADDRESS=10.0.0.1:6379: could not join a Ray cluster there (ConnectionError: could "
        "not connect to GCS); start one with `ray start --head`, or unset RAY_ADDRESS to run on "
        "a local Ray"
    )


class _Cluster:
    """What ``ray.nodes()`` says about a cluster: a live head, a dead second node."""

    def __init__(self, fail: bool = False) -> None:
        self.fail = fail

    def nodes(self):
        if self.fail:
            raise ConnectionError("GCS unreachable")
        return [
            {"NodeID": "aa11", "Alive": True, "NodeManagerAddress": "10.0.0.1"},
            {"NodeID": "bb22ccdd33ee44ff", "Alive": False, "NodeManagerAddress": "10.0.0.2"},
        ]


def test_a_worker_whose_node_is_dead_is_told_from_one_that_died_alone():
    from srollout.rollout.ray_pool import _node_alive, _node_name

    assert _node_alive(_Cluster(), "aa11")  # the worker died, its node lives: replace it
    assert not _node_alive(_Cluster(), "bb22ccdd33ee44ff")  # its node died: no replacement
    assert not _node_alive(_Cluster(), "gone")  # a node the cluster forgot is not alive
    assert _node_alive(_Cluster(), "")  # never started: nobody knows its node, replace it
    assert not _node_alive(_Cluster(fail=True), "aa11")  # the cluster cannot be read at all
    assert _node_name(_Cluster(), "bb22ccdd33ee44ff") == "bb22ccdd33ee (10.0.0.2)"
    assert _node_name(_Cluster(fail=True), "bb22ccdd33ee44ff") == "bb22ccdd33ee"


@pytest.fixture
def machine(monkeypatch):
    """A machine of ``cores`` usable cores with Ray installed and no cluster in the environment."""
    import os

    def set_up(cores: int, omp: str | None = None, ray_address: str | None = None) -> None:
        monkeypatch.setattr(os, "sched_getaffinity", lambda _pid: set(range(cores)))
        for name, value in (("OMP_NUM_THREADS", omp), ("RAY_ADDRESS", ray_address)):
            if value is None:
                monkeypatch.delenv(name, raising=False)
            else:
                monkeypatch.setenv(name, value)

    return set_up


def test_workers_auto_spreads_the_lm_over_the_cores_when_each_gets_16_groups(machine):
    from srollout.config import CollectConfig
    from srollout.stages.collect import auto_workers

    pytest.importorskip("ray")
    machine(2)
    assert auto_workers(CollectConfig(groups=100))[0] == 2  # the default collect: 2 workers
    assert auto_workers(CollectConfig(groups=32))[0] == 2  # 16 groups each
    n, why = auto_workers(CollectConfig(groups=31))  # 15 each: start-up not paid for
    assert n == 1 and "31 groups do not pay" in why
    machine(16)
    assert auto_workers(CollectConfig(groups=100)) == (
        6,  # 100 // 16: the message says why not one per core
        "6 Ray workers of 1 torch thread, 16+ groups each, 16 cores (100 groups)",
    )
    assert auto_workers(CollectConfig(groups=1000)) == (
        16,
        "16 Ray workers of 1 torch thread, one per core (1000 groups)",
    )
    machine(16, omp="4")  # the user capped the threads: so many cores, no more
    assert auto_workers(CollectConfig(groups=1000))[0] == 4
    machine(1)
    assert auto_workers(CollectConfig(groups=1000)) == (1, "one process: one usable core")
    machine(8, ray_address="10.0.0.1:6379")
    assert "ask for --workers N" in auto_workers(CollectConfig(groups=1000))[1]
    machine(8)
    assert auto_workers(CollectConfig(groups=1000, policy="noisy-expert"))[0] == 1
    assert auto_workers(CollectConfig(groups=1000, backend="vllm"))[0] == 1


def test_workers_auto_without_ray_is_one_process(machine, monkeypatch):
    import importlib.util

    from srollout.config import CollectConfig
    from srollout.stages.collect import auto_workers

    machine(8)
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda n, *a: None if n == "ray" else real(n))
    n, why = auto_workers(CollectConfig(groups=1000))
    assert n == 1 and "Ray is not installed" in why


def test_workers_that_is_not_a_number_is_one_line(run_cli, tmp_path):
    res = run_cli("collect", "--policy", "noisy-expert", "--groups", "2", "--workers", "two",
                  "--out", tmp_path / "r")  # fmt: skip
    assert res.exit_code == 2 and "--workers 'two': a number of workers >= 1, or auto" in res.stderr
    assert not (tmp_path / "r").exists()


class _SlowRay:
    """Stands in for the ray module's init/shutdown only: its node start times out ``fails``
    times (Ray's own message), then starts. Tests srollout's retry, not Ray."""

    TIMEOUT = (
        "The current node timed out during startup. This could happen because some of the "
        "raylet failed to startup or the GCS has become overloaded."
    )

    def __init__(self, fails: int, error: Exception | None = None) -> None:
        self.fails, self.error, self.inits, self.shutdowns = fails, error, 0, 0

    def init(self, **_: object) -> None:
        self.inits += 1
        if self.error is not None:
            raise self.error
        if self.inits <= self.fails:
            raise Exception(self.TIMEOUT)

    def shutdown(self) -> None:
        self.shutdowns += 1


def test_a_local_start_that_times_out_is_tried_once_more_then_is_one_line():
    from srollout.rollout.ray_pool import _start_local

    once = _SlowRay(fails=1)
    _start_local(once, 2)
    assert (once.inits, once.shutdowns) == (2, 1)
    twice = _SlowRay(fails=2)
    with pytest.raises(SrolloutError, match="local Ray did not start: its node timed out during"):
        _start_local(twice, 2)
    assert (twice.inits, twice.shutdowns) == (2, 2)
    other = _SlowRay(fails=0, error=ValueError("object_store_memory is too small"))
    with pytest.raises(ValueError, match="too small"):  # any other failure is Ray's own
        _start_local(other, 2)
    assert other.inits == 1
