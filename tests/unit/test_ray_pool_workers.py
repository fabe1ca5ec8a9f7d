"""run_groups_distributed on 2 local Ray workers with the corridor env (tests/unit/corridor_env.py):
the same records as the in-process engine, each group reported once, and a worker killed
mid-run (SIGKILL of its own process, or ray.kill from the driver) replaced with its chunk rerun.

Slow (~20 s on 2 loaded cores): a local Ray cluster starts, and every kill starts a worker again.
"""

from __future__ import annotations

import os
import signal
import sys
from functools import partial
from pathlib import Path

import pytest

ray = pytest.importorskip("ray", reason="the `dist` extra (ray) is not installed")
pytestmark = pytest.mark.slow

import corridor_env  # noqa: E402
from corridor_env import Corridor, Prompter, SeededWalker, roll, steps_of, tasks  # noqa: E402

from srollout.rollout.engine import RolloutSettings, make_specs  # noqa: E402
from srollout.rollout.ray_pool import WorkerRecipe, ray_session, run_groups_distributed  # noqa: E402
from srollout.rollout.records import group_tables  # noqa: E402

SETTINGS = RolloutSettings(G=3, T_max=8, seed=11, concurrency=6, signal_K=(2, 4))
SPECS = make_specs(tasks([3, 5, 9, 2, 4, 6, 8, 1, 7]), 9)  # lengths > T_max never win


@pytest.fixture(scope="module")
def local_ray():
    # the workers cannot import the test helpers: ship them by value
    ray.cloudpickle.register_pickle_by_value(corridor_env)
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    with ray_session(2) as where:
        yield where


class DiesOnce(SeededWalker):
    """The walker, except that the first process to act on ``group_id`` at step 2 SIGKILLs
    itself (a marker file makes it happen once per test, not in the replacement too)."""

    name = "dies-once"

    def __init__(self, marker: str, group_id: str) -> None:
        super().__init__(0.6)
        self.marker, self.group_id = marker, group_id

    def act(self, requests):
        mine = any(r.key.group_id == self.group_id and r.step == 2 for r in requests)
        if mine and not os.path.exists(self.marker):
            Path(self.marker).write_text(str(os.getpid()))
            os.kill(os.getpid(), signal.SIGKILL)
        return super().act(requests)


def _recipe(policy=None) -> WorkerRecipe:
    return WorkerRecipe(
        policy or partial(SeededWalker, 0.6), Corridor, Prompter(), SETTINGS, threads=None
    )


def _check_same_as_in_process(records) -> None:
    ids = [r.group_id for r in records]
    assert sorted(ids) == [s.group_id for s in SPECS]
    assert len(set(ids)) == len(ids)  # each group once
    ref, _ = roll(SPECS, SETTINGS, policy=SeededWalker(0.6))
    assert steps_of(records).equals(steps_of(ref))
    by_id = {r.group_id: r for r in ref}
    for r in records:  # groups, trajectories and signals too, timing aside
        a, b = group_tables(r), group_tables(by_id[r.group_id])
        timing = ("wall_s", "gen_s", "env_s", "reset_s", "started_tick", "finished_tick")
        assert a.groups.drop(timing).equals(b.groups.drop(timing))
        assert a.signals.equals(b.signals)


def test_two_workers_give_the_records_of_one_process(local_ray):
    records, ticks, started = [], [], []
    result = run_groups_distributed(
        SPECS,
        _recipe(),
        2,
        on_group=records.append,
        on_tick=ticks.append,
        chunk_groups=2,
        on_worker=lambda slot, info, actor: started.append((slot, info.pid)),
    )
    _check_same_as_in_process(records)
    assert result.workers == 2 and result.replaced == 0 and result.chunks == 5  # ceil(9 / 2)
    assert len({pid for _, pid in started}) == 2 and os.getpid() not in {pid for _, pid in started}
    # within a chunk, groups come in index order; chunks are consecutive index ranges
    for i in range(0, 9, 2):
        pos = [r.group_id for r in records].index(f"g{i:05d}")
        chunk = records[pos : pos + min(2, 9 - i)]
        assert [r.spec.index for r in chunk] == list(range(i, min(i + 2, 9)))
    assert result.summary.groups == 9
    assert result.summary.rows == sum(len(t.steps) for r in records for t in r.trajs)
    assert len(ticks) == 5 and ticks[-1].groups_done == 9


def test_a_worker_that_kills_itself_mid_chunk_is_replaced_and_its_groups_rerun(local_ray, tmp_path):
    marker = tmp_path / "died"
    records = []
    result = run_groups_distributed(
        SPECS,
        _recipe(partial(DiesOnce, str(marker), "g00004")),
        2,
        on_group=records.append,
        chunk_groups=3,
    )
    assert marker.exists()  # a worker really died, at step 2 of group g00004 (chunk g00003..g00005)
    assert result.replaced == 1 and result.chunks == 3
    _check_same_as_in_process(records)


def test_ray_kill_of_a_worker_from_the_driver(local_ray):
    """ray.kill of worker 1 as soon as the first group is back: either it was busy with a chunk
    (which fails and is rerun) or it just returned one (its next chunk fails and is rerun)."""
    actors: dict[int, object] = {}
    records: list = []

    def on_group(record):
        records.append(record)
        if len(records) == 1:
            ray.kill(actors[1], no_restart=True)

    result = run_groups_distributed(
        SPECS,
        _recipe(),
        2,
        on_group=on_group,
        chunk_groups=1,
        on_worker=lambda slot, info, actor: actors.__setitem__(slot, actor),
    )
    assert result.replaced == 1
    _check_same_as_in_process(records)


def _no_model():
    from srollout.errors import SrolloutError

    raise SrolloutError("--model /nowhere: no such directory")


def test_an_error_in_a_worker_is_the_driver_error_and_not_retried(local_ray):
    from srollout.errors import SrolloutError

    started = []
    with pytest.raises(SrolloutError, match=r"^--model /nowhere: no such directory$"):
        run_groups_distributed(SPECS, _recipe(_no_model), 2, on_worker=lambda *a: started.append(a))
    assert started == []  # no worker came up, none was replaced in a loop
