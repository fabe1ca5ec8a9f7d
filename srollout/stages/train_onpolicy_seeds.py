"""``train-onpolicy --seeds 7,13,23,42 --workers N``: the seeds as Ray tasks, N at a time
(docs/scaling.md).

The story (:func:`run_seeds_parallel`):

1. open the run directory (``--resume`` reopens it; a run started without ``--workers`` is refused:
   its checkpoints are not per-seed runs);
2. every unfinished seed becomes one Ray task (one CPU): a one-seed ``train-onpolicy`` run in
   ``RUN/seeds/seed<S>/`` that resumes itself if started, so a Ray retry and a ``--resume`` both
   continue from its last checkpoint;
3. ``RUN/checkpoints/seed<S>-<arm>`` link to the seed runs' checkpoints, and the stage's own
   ``--resume`` pass writes the usual files over all seeds: those of a sequential run (timing
   aside), since every random draw of an arm derives from its seed;
4. the manifest records where the seeds ran.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import time
from collections import deque
from dataclasses import replace
from pathlib import Path
from typing import Any, NamedTuple

from srollout.config import TrainOnpolicyConfig
from srollout.errors import SrolloutError
from srollout.progress import StageBar
from srollout.rollout.ray_pool import ray_node_id, ray_session, require_ray
from srollout.rundir import Manifest, check_resumable, prepare_run_dir
from srollout.schemas import write_json

STAGE = "train-onpolicy"
SEEDS_DIR = "seeds"


class SeedRun(NamedTuple):
    """One seed trained by a Ray task: where (host, pid, Ray node id), how long (wall_s), whether it
    continued a seed run that was already started (resumed)."""

    seed: int
    host: str
    pid: int
    wall_s: float
    resumed: bool
    node: str = ""


def seed_run_dir(run_dir: Path, seed: int) -> Path:
    """``RUN/seeds/seed<S>``: the one-seed run of ``seed``."""
    return Path(run_dir) / SEEDS_DIR / f"seed{seed}"


def run_seeds_parallel(
    config: TrainOnpolicyConfig, workers: int, console: Any = None, progress: bool = True
) -> Any:
    """Train the seeds of ``config`` as Ray tasks, ``workers`` at a time; return the stage's
    :class:`~srollout.stages.train_onpolicy.OnpolicyResult` over all seeds."""
    require_ray(workers)  # before the run directory exists: a missing extra leaves nothing behind
    from srollout.stages.train_onpolicy import plan_training, run_train_onpolicy

    # the environment, tasks, model and gates resolved once here: a bad one fails before the run
    # directory exists, and the seeds' tasks get the model directory as resolved
    plan = plan_training(config)
    run_dir = prepare_run_dir(config.out, STAGE, overwrite=config.overwrite, resume=config.resume)
    if config.resume:
        # a run started without --workers: its checkpoints are not per-seed runs
        if not (run_dir / SEEDS_DIR).is_dir() and "dist" not in _manifest(run_dir):
            raise SrolloutError(
                f"--resume: {run_dir} was started without --workers (its checkpoints are not "
                "per-seed runs); resume it without --workers"
            )
        check_resumable(run_dir, STAGE, config.resume_key(), "checkpoints")
    config = replace(config, out=run_dir)
    reloaded = [
        s for s in config.seeds if _manifest(seed_run_dir(run_dir, s)).get("status") == "complete"
    ]
    todo = [s for s in config.seeds if s not in reloaded]
    dist: dict[str, Any] = {
        "ray": None,
        "workers": workers,
        "seed_runs": [f"{SEEDS_DIR}/seed{s}" for s in config.seeds],
        "reloaded_seeds": reloaded,
        "trained": [],
    }
    manifest = Manifest(run_dir, STAGE, config)
    manifest.update(dist=dist)

    # 2. the seeds not finished yet, N at a time
    if todo:
        seed_config = replace(config, model=plan.model_dir)
        with (
            ray_session(workers) as where,
            StageBar(
                console,
                "train-onpolicy seeds",
                len(config.seeds),
                enabled=progress and console is not None,
                completed=len(reloaded),
                eta=False,
            ) as bar,
        ):
            dist["ray"] = where
            manifest.update(dist=dist)
            runs = _train_seeds(seed_config, todo, run_dir, workers, bar)
        dist["trained"] = [
            {
                "seed": r.seed,
                "process": f"{r.host}:{r.pid}",
                "node": r.node,
                "wall_s": round(r.wall_s, 3),
                "resumed": r.resumed,
            }
            for r in runs
        ]

    # 3. link the checkpoints; the stage's --resume pass writes everything over all seeds
    _link_checkpoints(run_dir, config)
    result = run_train_onpolicy(
        replace(config, resume=True, overwrite=False), console=console, progress=False, plan=plan
    )

    # 4. the stage rewrote the manifest: add where the seeds ran
    write_json({**_manifest(run_dir), "dist": dist}, run_dir / "manifest.json")
    return result


def _train_seeds(
    config: TrainOnpolicyConfig, seeds: list[int], run_dir: Path, workers: int, bar: StageBar
) -> list[SeedRun]:
    """One Ray task per seed, at most ``workers`` in flight; the runs in finishing order."""
    import ray

    from srollout.rollout.ray_pool import remote_cause, worker_death_errors

    # max_retries: Ray reruns a task whose worker died (the rerun resumes the seed run);
    # an exception raised by the training itself is not retried.
    task = ray.remote(num_cpus=1, max_retries=2, retry_exceptions=False)(_train_seed)
    died = worker_death_errors(ray)
    queue = deque(seeds)
    pending: dict[Any, int] = {}
    runs: list[SeedRun] = []
    try:
        while queue or pending:
            while queue and len(pending) < workers:
                seed = queue.popleft()
                pending[task.remote(config, seed, str(seed_run_dir(run_dir, seed)))] = seed
            (ref,), _ = ray.wait(list(pending), num_returns=1)
            seed = pending.pop(ref)
            try:
                runs.append(ray.get(ref))
            except died as err:
                raise SrolloutError(
                    f"seed {seed}: its Ray worker died 3 times ({type(err).__name__}); "
                    f"rerun with --resume to continue from its last checkpoint"
                ) from err
            except ray.exceptions.RayTaskError as err:
                raise remote_cause(err) from err
            run = runs[-1]
            bar.update(
                advance=1, info=f"seed {seed} done in {run.wall_s:.0f} s on {run.host}:{run.pid}"
            )
    finally:
        for ref in pending:
            ray.cancel(ref, force=True)
    return runs


def _train_seed(config: TrainOnpolicyConfig, seed: int, out: str) -> SeedRun:
    """A Ray task: the one-seed run of ``seed`` in ``out``, resumed when it was started before."""
    from srollout.stages.train_onpolicy import run_train_onpolicy

    t0 = time.perf_counter()
    directory = Path(out)
    resumed = (directory / "manifest.json").exists()
    if directory.exists() and not resumed:  # killed before its manifest: nothing to keep
        shutil.rmtree(directory)
    run_train_onpolicy(
        replace(config, seeds=(seed,), out=directory, resume=resumed, overwrite=False),
        progress=False,
    )
    node = ray_node_id()
    return SeedRun(seed, socket.gethostname(), os.getpid(), time.perf_counter() - t0, resumed, node)


def _manifest(directory: Path) -> dict[str, Any]:
    """The run's manifest.json ({} when it has none yet)."""
    path = directory / "manifest.json"
    return json.loads(path.read_text()) if path.exists() else {}


def _link_checkpoints(run_dir: Path, config: TrainOnpolicyConfig) -> None:
    """``RUN/checkpoints/seed<S>-<arm>`` -> ``../seeds/seed<S>/checkpoints/seed<S>-<arm>``
    (relative, so the run directory can move)."""
    checkpoints = run_dir / "checkpoints"
    checkpoints.mkdir(parents=True, exist_ok=True)
    for seed in config.seeds:
        for arm in config.arms:
            name = f"seed{seed}-{arm}"
            link = checkpoints / name
            target = Path("..") / SEEDS_DIR / f"seed{seed}" / "checkpoints" / name
            if link.is_symlink():
                link.unlink()
            elif link.exists():
                raise SrolloutError(
                    f"{link} is a checkpoint directory, not a "
                    "link to a seed run; resume without --workers"
                )
            link.symlink_to(target, target_is_directory=True)
