"""The Ray backend of the engine (the ``dist`` extra): :func:`ray_session` and ``--workers N``,
the batched engine on N Ray actors fed chunks of groups by the driver.

How chunks, worker deaths and node deaths are handled: docs/scaling.md ("How it works").
Importing this module does not import Ray; the functions that need it do.
"""

from __future__ import annotations

import logging
import math
import os
import socket
import sys
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any, NamedTuple

from srollout.envs.base import TextEnv
from srollout.errors import NotAvailableError, SrolloutError
from srollout.policy.base import Policy
from srollout.rollout.engine import (
    GroupRecord,
    GroupSpec,
    Prompter,
    RolloutSettings,
    RolloutSummary,
    TickStats,
    run_groups,
)

# A chunk whose worker died this many times in a row is not tried again.
MAX_WORKER_DEATHS = 3

# The logger of Ray's "Token authentication is enabled for this Ray cluster" notice.
TOKEN_NOTICE_LOGGER = "ray._private.authentication.authentication_token_setup"

# Records of a chunk (T_max=30, G=8: ~125 kB a group) pass through it; 200 MB holds a wide margin.
OBJECT_STORE_BYTES = 200 * 1024**2


def require_ray(workers: int) -> ModuleType:
    """The ``ray`` module, or a one-line :class:`NotAvailableError` naming the ``dist`` extra."""
    try:
        import ray
    except ImportError:
        raise NotAvailableError(
            f"--workers {workers} runs on Ray, which is not installed: pip install 'srollout[dist]'"
        ) from None
    return ray


@contextmanager
def ray_session(workers: int) -> Iterator[str]:
    """Connect to Ray for the duration of the block; yield where the work runs (for manifests).

    Joins ``$RAY_ADDRESS`` when set, else starts a local Ray of ``workers`` CPUs; inside a running
    session it joins that one and leaves it running. Worker output is not forwarded (errors come
    back as exceptions), so the console keeps its progress bar.
    """
    address = os.environ.get("RAY_ADDRESS")
    ray = require_ray(workers)
    if ray.is_initialized():
        yield f"the running Ray session ({_cpus(ray)} CPUs)"
        return
    if address:
        _join_cluster(ray, address, workers)
        where = f"Ray cluster at {address} ({_cpus(ray)} CPUs, {_nodes(ray)} nodes)"
    else:
        # Ray 2.60 turns token authentication on for the local cluster it starts and says so on
        # every run; that cluster is srollout's own and lives for one command: not the user's news
        notice = logging.getLogger(TOKEN_NOTICE_LOGGER)
        level = notice.level
        notice.setLevel(logging.ERROR)
        try:
            _start_local(ray, workers)
        finally:
            notice.setLevel(level)
        where = f"local Ray ({workers} CPUs)"
    try:
        yield where
    finally:
        ray.shutdown()


# Ray waits a fixed 30 s for its raylet to register (ray._private.node); on a loaded machine
# (CI beside a training run) that can pass while the raylet is still starting: one more try.
STARTUP_TRIES = 2
_STARTUP_TIMEOUT = "timed out during startup"


def _start_local(ray: ModuleType, workers: int) -> None:
    """A new local cluster of ``workers`` CPUs; a start that times out is tried once more, then
    is one line."""
    for attempt in range(1, STARTUP_TRIES + 1):
        try:
            ray.init(
                address="local",  # a new cluster, even when a `ray start` one runs on this machine
                num_cpus=workers,
                include_dashboard=False,
                object_store_memory=OBJECT_STORE_BYTES,
                logging_level=logging.WARNING,
                log_to_driver=False,
            )
            return
        except Exception as err:  # Ray raises a bare Exception for this
            if _STARTUP_TIMEOUT not in str(err):
                raise
            ray.shutdown()
            if attempt == STARTUP_TRIES:
                raise SrolloutError(
                    f"local Ray did not start: its node {_STARTUP_TIMEOUT} {STARTUP_TRIES} times "
                    "(Ray waits 30 s; is the machine overloaded?)"
                ) from None


def _cpus(ray: ModuleType) -> int:
    return int(ray.cluster_resources().get("CPU", 0))


def _nodes(ray: ModuleType) -> int:
    return sum(1 for n in ray.nodes() if n.get("Alive"))


def ray_token_available() -> bool:
    """Whether this machine holds a Ray auth token where Ray looks for one: ``$RAY_AUTH_TOKEN``,
    the file ``$RAY_AUTH_TOKEN_PATH``, or ``~/.ray/auth_token`` (where ``ray start --head`` and
    ``ray get-auth-token --generate`` put it)."""
    if os.environ.get("RAY_AUTH_TOKEN"):
        return True
    path = os.environ.get("RAY_AUTH_TOKEN_PATH") or Path.home() / ".ray" / "auth_token"
    return Path(path).is_file()


def _join_cluster(ray: ModuleType, address: str, workers: int) -> None:
    """``ray.init`` on the cluster at ``address``, or one line saying what is wrong.

    A client whose ``RAY_AUTH_MODE`` is unset does not send its token, so with a token at hand
    token mode is turned on (as Ray does for a local ``ray.init``). A cluster with fewer CPUs
    than ``workers`` would wait forever for the missing workers: refused before any work."""
    if "RAY_AUTH_MODE" not in os.environ and ray_token_available():
        os.environ["RAY_AUTH_MODE"] = "token"
        try:  # Ray caches its config: refresh it, as Ray does when it turns token mode on itself
            from ray._raylet import Config

            Config.initialize("")
        except (ImportError, AttributeError):
            pass
    if not _answers(address):  # else Ray retries for minutes before it gives up
        raise SrolloutError(_join_error(address, ConnectionError(f"nothing answers at {address}")))
    try:
        with _core_stderr_held():
            ray.init(address=address, logging_level=logging.WARNING, log_to_driver=False)
    except Exception as err:  # Ray raises ConnectionError, AuthenticationError, RuntimeError, ...
        raise SrolloutError(_join_error(address, err, answers=True)) from None  # checked above
    cpus, nodes = _cpus(ray), _nodes(ray)
    if cpus < workers:
        ray.shutdown()
        raise SrolloutError(
            f"--workers {workers} needs {workers} CPUs, but the Ray cluster at {address} has "
            f"{cpus} ({nodes} nodes): ask for fewer workers or add nodes (docs/scaling.md)"
        )


@contextmanager
def _core_stderr_held() -> Iterator[None]:
    """Hold what Ray's C++ core writes to stderr while it joins a cluster: a refused client
    logs the same warning every second for ~20 s before Ray raises. Shown again with
    ``SROLLOUT_DEBUG=1``; otherwise the one line of the error says it."""
    import tempfile

    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as held:
        os.dup2(held.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            if os.environ.get("SROLLOUT_DEBUG"):
                held.seek(0)
                sys.stderr.write(held.read().decode(errors="replace"))


def _answers(address: str) -> bool:
    """Whether something listens at ``host:port`` (a Ray head that refused us, not no cluster);
    True for an address of another form (``auto``, ``ray://…``): Ray's own error decides."""
    host, _, port = address.rpartition(":")
    if not port.isdigit() or "://" in address:
        return True
    try:
        with socket.create_connection((host or "127.0.0.1", int(port)), timeout=3):
            return True
    except OSError:
        return False


def _join_error(address: str, err: BaseException, answers: bool = False) -> str:
    """The one line for a failed ``ray.init(address=...)``; ``answers``: the address accepts
    connections, so a cluster is there and refused us (Ray 2.60 says only "could not connect"
    when it refuses a client without the cluster's token)."""
    text = f"{type(err).__name__}: {err}"
    first = " ".join(text.split())[:300]
    if answers or "auth" in text.lower() or "token" in text.lower():
        mode = os.environ.get("RAY_AUTH_MODE") or "unset"
        token = "found" if ray_token_available() else "not found"
        return (
            f"the Ray cluster at {address} did not let this client join (RAY_AUTH_MODE={mode}, "
            f"token {token}); a cluster with token authentication needs RAY_AUTH_MODE=token "
            "and the head's token: set RAY_AUTH_TOKEN, or copy the head's ~/.ray/auth_token to "
            "this machine; every `ray start` of the cluster needs the same (docs/scaling.md). "
            f"Ray said: {first}"
        )
    return (
        f"RAY_ADDRESS={address}: could not join a Ray cluster there ({first}); start one with "
        "`ray start --head`, or unset RAY_ADDRESS to run on a local Ray"
    )


@dataclass(frozen=True)
class WorkerRecipe:
    """What a worker needs to roll out as the driver would; shipped to every worker (picklable).

    make_policy is called once per worker, in the worker; ``settings.concurrency`` is per worker;
    threads: torch threads in the worker (None: as Ray gives a one-CPU worker, one).
    """

    make_policy: Callable[[], Policy]
    env_factory: Callable[[], TextEnv]
    prompter: Prompter
    settings: RolloutSettings
    threads: int | None = None


class WorkerInfo(NamedTuple):
    """A started worker: host name, process id, policy name, seconds its policy took to build,
    the id of the Ray node it runs on ("" outside Ray)."""

    host: str
    pid: int
    policy: str
    build_s: float
    node: str = ""


def ray_node_id() -> str:
    """The id of the Ray node this process runs on; "" when it is not in a Ray session (two nodes
    of one machine share a host name, not a node id)."""
    ray = sys.modules.get("ray")  # never imported here: a one-process run does not load Ray
    if ray is None or not ray.is_initialized():
        return ""
    return str(ray.get_runtime_context().get_node_id())


class ChunkResult(NamedTuple):
    """One chunk rolled out by a worker: its groups in index order and the engine's totals."""

    records: list[GroupRecord]
    summary: RolloutSummary


class DistResult(NamedTuple):
    """Totals of :func:`run_groups_distributed`: engine totals summed over chunks (wall_s: the
    driver's), worker slots used, replacements started, chunks (reruns not counted), policy build
    seconds of every worker in start order, seconds until the first workers were all up."""

    summary: RolloutSummary
    workers: int
    replaced: int
    chunks: int
    build_s: list[float]
    start_s: float


class RolloutWorker:
    """One rollout worker: a policy replica and a pool of environments, running chunks of groups.
    A plain class that Ray wraps as an actor; :meth:`start` once, then :meth:`run` per chunk."""

    def __init__(self, recipe: WorkerRecipe) -> None:
        self.recipe = recipe
        self.policy: Policy | None = None
        # lent to every chunk's engine call, so loaded games stay warm (a fresh ALFWorld reset
        # costs ~3x); all of them are free again when a call returns
        self._envs: list[TextEnv] = []

    def start(self) -> WorkerInfo:
        """Set torch's threads and build the policy; say where this worker runs."""
        if self.recipe.threads is not None:
            import torch

            torch.set_num_threads(self.recipe.threads)
        t0 = time.perf_counter()
        self.policy = self.recipe.make_policy()
        build_s = time.perf_counter() - t0
        return WorkerInfo(
            socket.gethostname(),
            os.getpid(),
            str(getattr(self.policy, "name", type(self.policy).__name__)),
            build_s,
            ray_node_id(),
        )

    def run(self, specs: Sequence[GroupSpec]) -> ChunkResult:
        """Roll out ``specs`` through the engine; return every group (index order) and the
        totals."""
        if self.policy is None:
            raise RuntimeError("RolloutWorker.run before start()")
        records: list[GroupRecord] = []
        summary = run_groups(
            list(specs),
            self.policy,
            self.recipe.env_factory,
            self.recipe.prompter,
            self.recipe.settings,
            on_group=records.append,
            envs=self._envs,
        )
        records.sort(key=lambda r: r.spec.index)
        return ChunkResult(records, summary)

    def close(self) -> None:
        """Close every environment this worker made."""
        for env in self._envs:
            env.close()
        self._envs.clear()


def default_chunk_groups(settings: Any) -> int:
    """Groups per chunk: twice what a worker holds in flight (``concurrency // G``), so a worker
    refills its batch from its own chunk while the driver's next chunk is on its way. ``settings``:
    anything with ``concurrency`` and ``G`` (RolloutSettings; collect --audit's CollectConfig)."""
    return 2 * max(1, settings.concurrency // settings.G)


def chunk_size(settings: RolloutSettings, n_groups: int, workers: int) -> int:
    """:func:`default_chunk_groups`, but at most ``ceil(n_groups / workers)`` so that a short run
    is shared out over every worker."""
    return max(1, min(default_chunk_groups(settings), math.ceil(n_groups / max(workers, 1))))


def chunked(specs: Sequence[GroupSpec], size: int) -> list[list[GroupSpec]]:
    """``specs`` in group-index order, cut into consecutive chunks of ``size`` (the last
    shorter)."""
    if size < 1:
        raise SrolloutError(f"chunk_groups must be >= 1, got {size}")
    ordered = sorted(specs, key=lambda s: s.index)
    return [ordered[i : i + size] for i in range(0, len(ordered), size)]


def run_groups_distributed(
    specs: Sequence[GroupSpec],
    recipe: WorkerRecipe,
    workers: int,
    on_group: Callable[[GroupRecord], None] | None = None,
    on_tick: Callable[[TickStats], None] | None = None,
    chunk_groups: int | None = None,
    on_worker: Callable[[int, WorkerInfo, Any], None] | None = None,
) -> DistResult:
    """Roll out ``specs`` on ``workers`` Ray actors (inside :func:`ray_session`).

    on_group: once per group as its chunk comes back (groups of a chunk in index order);
    on_tick: once per returned chunk; on_worker(slot, info, actor): every worker that started,
    replacements included.
    """
    import ray

    t0 = time.perf_counter()
    size = (
        chunk_groups
        if chunk_groups is not None
        else chunk_size(recipe.settings, len(specs), workers)
    )
    chunks = chunked(specs, size)
    n_slots = min(workers, len(chunks))
    if n_slots == 0:
        return DistResult(RolloutSummary.total([], time.perf_counter() - t0, 0), 0, 0, 0, [], 0.0)

    died = worker_death_errors(ray)
    actor_class = ray.remote(num_cpus=1, max_restarts=0)(RolloutWorker)
    actors: dict[int, Any] = {}
    pending: dict[Any, tuple[str, int, int]] = {}  # object ref -> ("start"|"run", slot, chunk)
    queue = deque(range(len(chunks)))
    deaths = [0] * len(chunks)  # workers each chunk killed
    start_deaths = [0] * n_slots  # per slot, in a row
    summaries: list[RolloutSummary] = []
    build_s: list[float] = []
    replaced, done, returned, start_s = 0, 0, 0, 0.0
    waiting = set(range(n_slots))  # first workers not started yet
    node_of: dict[int, str] = {}  # slot -> Ray node id of its current worker
    lost_node = ""  # set when a worker's node died: no more chunks go out, then the run stops

    def launch(slot: int) -> None:
        actors[slot] = actor_class.remote(recipe)
        pending[actors[slot].start.remote()] = ("start", slot, -1)

    def assign(slot: int) -> None:
        if queue and not lost_node:
            i = queue.popleft()
            pending[actors[slot].run.remote(chunks[i])] = ("run", slot, i)

    try:
        for slot in range(n_slots):
            launch(slot)
        while pending:
            (ref,), _ = ray.wait(list(pending), num_returns=1)
            kind, slot, i = pending.pop(ref)
            try:
                value = ray.get(ref)
            except died as err:
                if lost_node or not _node_alive(ray, node_of.get(slot, "")):
                    lost_node = lost_node or node_of.get(slot, "") or "?"
                    _kill(ray, actors.pop(slot))  # not replaced: its node is gone
                    continue
                if kind == "run":
                    deaths[i] += 1
                    if deaths[i] >= MAX_WORKER_DEATHS:
                        raise SrolloutError(
                            f"groups {chunks[i][0].group_id}..{chunks[i][-1].group_id} killed "
                            f"{deaths[i]} workers in a row (last: {type(err).__name__}); stopping "
                            "(the groups already written are kept)"
                        ) from err
                    queue.appendleft(i)  # rerun first, on the replacement
                else:
                    start_deaths[slot] += 1
                    if start_deaths[slot] >= MAX_WORKER_DEATHS:
                        raise SrolloutError(
                            f"Ray worker {slot} died {start_deaths[slot]} times while starting "
                            f"(last: {type(err).__name__})"
                        ) from err
                _kill(ray, actors[slot])
                replaced += 1
                launch(slot)
                continue
            except ray.exceptions.RayTaskError as err:
                raise remote_cause(err) from err
            if kind == "start":
                start_deaths[slot] = 0
                node_of[slot] = value.node
                build_s.append(value.build_s)
                if on_worker is not None:
                    on_worker(slot, value, actors[slot])
                if slot not in waiting:  # a replacement: straight to work
                    assign(slot)
                    continue
                waiting.remove(slot)
                if not waiting and not lost_node:  # every first worker is up: all start at once
                    start_s = time.perf_counter() - t0
                    for other in range(n_slots):
                        assign(other)
                continue
            returned += 1
            summaries.append(value.summary)
            for record in value.records:
                if on_group is not None:
                    on_group(record)
            done += len(value.records)
            assign(slot)
            if on_tick is not None:
                s = value.summary
                in_flight = sum(len(chunks[j]) for k, _, j in pending.values() if k == "run")
                # rows: the trajectories in flight on the workers, as a one-process tick counts them
                rows = in_flight * recipe.settings.G
                on_tick(
                    TickStats(returned, rows, s.n_gen_tokens, s.gen_s, s.env_s, in_flight, done)
                )
        if lost_node:
            raise SrolloutError(
                f"Ray node {_node_name(ray, lost_node)} died mid-run, taking its worker; {done} "
                f"of {len(specs)} groups finished and are kept: rerun with --resume (after "
                "restarting the node, or with --workers the nodes left can hold) for the rest"
            )
    finally:
        for actor in actors.values():
            _kill(ray, actor)
    wall = time.perf_counter() - t0
    return DistResult(
        RolloutSummary.total(summaries, wall, n_slots),
        n_slots,
        replaced,
        len(chunks),
        build_s,
        start_s,
    )


def _node_alive(ray: Any, node: str) -> bool:
    """Whether the Ray node ``node`` is alive (True when unknown: "" is a worker that never
    started, whose node nobody learned). Ray marks a node dead before it fails its actors."""
    if not node:
        return True
    try:
        return any(n.get("NodeID") == node and n.get("Alive") for n in ray.nodes())
    except Exception:  # the cluster's state cannot be read: the head is gone, so is the node
        return False


def _node_name(ray: Any, node: str) -> str:
    """``node``'s id, shortened, with its address when the cluster still says it."""
    try:
        ip = next((n["NodeManagerAddress"] for n in ray.nodes() if n.get("NodeID") == node), "")
    except Exception:
        ip = ""
    return f"{node[:12]} ({ip})" if ip else node[:12]


def worker_death_errors(ray: Any) -> tuple[type[BaseException], ...]:
    """The Ray errors that mean "the worker is gone" (not an error of the code it ran)."""
    names = (
        "RayActorError",
        "ActorUnavailableError",
        "WorkerCrashedError",
        "NodeDiedError",
        "ObjectLostError",
    )
    return tuple(getattr(ray.exceptions, n) for n in names if hasattr(ray.exceptions, n))


def remote_cause(err: BaseException) -> BaseException:
    """The exception raised in the worker (Ray wraps it; its message is the remote traceback)."""
    cause = getattr(err, "cause", None)
    return cause if isinstance(cause, BaseException) else err


def _kill(ray: Any, actor: Any) -> None:
    try:
        ray.kill(actor, no_restart=True)
    except Exception:  # already gone
        pass
