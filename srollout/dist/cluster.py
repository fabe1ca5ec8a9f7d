"""Where the Ray work runs: the one-line error without the extra, and the session around a run.

``ray_session(N)`` joins the cluster in ``$RAY_ADDRESS`` when it is set; otherwise it starts a
local Ray with N CPUs (one per worker: each rollout actor and each seed task asks for one CPU),
no dashboard and a small object store, and stops it at the end. Inside a session that is already
running (a test fixture, a notebook) it joins that one and leaves it running.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager
from types import ModuleType

from srollout.errors import NotAvailableError

# Records of a chunk (T_max=30, G=8: ~125 kB a group) pass through it; 200 MB holds a wide margin.
OBJECT_STORE_BYTES = 200 * 1024**2


def require_ray(workers: int) -> ModuleType:
    """The ``ray`` module, or a one-line :class:`NotAvailableError` naming the ``dist`` extra.

    workers: the ``--workers`` value that asked for Ray (named in the message)."""
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

    workers: the number of parallel workers; a local cluster gets that many CPUs. Worker output
    is not forwarded to this process (errors come back as exceptions), so the console keeps its
    progress bar.
    """
    ray = require_ray(workers)
    if ray.is_initialized():
        yield f"the running Ray session ({_cpus(ray)} CPUs)"
        return
    address = os.environ.get("RAY_ADDRESS")
    if address:
        ray.init(address=address, logging_level=logging.WARNING, log_to_driver=False)
        where = f"Ray cluster at {address} ({_cpus(ray)} CPUs)"
    else:
        ray.init(
            address="local",  # a new cluster, even when a `ray start` one runs on this machine
            num_cpus=workers,
            include_dashboard=False,
            object_store_memory=OBJECT_STORE_BYTES,
            logging_level=logging.WARNING,
            log_to_driver=False,
        )
        where = f"local Ray ({workers} CPUs)"
    try:
        yield where
    finally:
        ray.shutdown()


def _cpus(ray: ModuleType) -> int:
    return int(ray.cluster_resources().get("CPU", 0))
