"""`srollout collect --workers 2` on 2 local Ray workers, tiny Qwen2 policy, real ALFWorld engine:
the same Parquet as `--workers 1` (timing columns aside), and `--resume` of a run whose last
groups were lost finishes it with the same content."""

from __future__ import annotations

import json
import shutil

import polars as pl
import pytest

pytest.importorskip("ray", reason="the `dist` extra (ray) is not installed")

from srollout.rollout.ray_pool import ray_session  # noqa: E402
from srollout.rollout.records import TIMING_COLUMNS  # noqa: E402

TABLES = ("steps", "trajectories", "groups", "signals")
N_GROUPS = 5


@pytest.fixture(scope="module")
def local_ray():
    with ray_session(2) as where:
        yield where


def _args(model) -> list[str]:
    # 5 groups of G=2, chunks of 2 groups (concurrency 2 per worker -> 1 group in flight, x2)
    return [
        "collect",
        "--policy",
        "lm",
        "--model",
        str(model),
        "--groups",
        str(N_GROUPS),
        "--G",
        "2",
        "--T-max",
        "3",
        "--concurrency",
        "2",
        "--seed",
        "5",
        "--signal-K",
        "2",
        "--temperature",
        "1.0",
    ]


def _table(run, name: str) -> pl.DataFrame:
    df = pl.read_parquet(run / f"{name}.parquet")
    return df.drop([c for c in df.columns if c in TIMING_COLUMNS])


def _same(a, b) -> None:
    for name in TABLES:
        x, y = _table(a, name), _table(b, name)
        assert x.height > 0 and x.equals(y), name


@pytest.mark.slow  # ~100 s on 2 loaded cores (Ray start, 3 collects with the LM)
def test_two_workers_write_what_one_writes_and_resume(run_cli, tiny_policy, tmp_path, local_ray):
    one, two = tmp_path / "one", tmp_path / "two"
    res = run_cli(*_args(tiny_policy), "--out", one)
    assert res.exit_code == 0, res.stderr[-2000:]
    res = run_cli(*_args(tiny_policy), "--workers", "2", "--out", two)
    assert res.exit_code == 0, res.stderr[-2000:]
    _same(one, two)
    groups = pl.read_parquet(two / "groups.parquet")
    assert groups["group_id"].to_list() == [f"g{i:05d}" for i in range(N_GROUPS)]
    assert (pl.read_parquet(two / "trajectories.parquet")["token_ids"].list.len() > 0).all()
    manifest = json.loads((two / "manifest.json").read_text())
    assert manifest["status"] == "complete" and manifest["workers"] == 2
    assert (
        manifest["dist"]["workers"] == 2
        and manifest["dist"]["replaced"] == 0
        and manifest["dist"]["chunks"] == 3
    )
    assert manifest["policy"] and "workers" not in manifest["config"]  # not part of the resume key
    assert "Ray workers" in (two / "report.md").read_text()

    # what a kill leaves: some parts, no merged tables, status partial; resume on 2 workers
    for gid in ("g00001", "g00004"):
        shutil.rmtree(two / "parts" / gid)
    for name in TABLES:
        (two / f"{name}.parquet").unlink()
    res = run_cli(*_args(tiny_policy), "--workers", "2", "--out", two, "--resume")
    assert res.exit_code == 0, res.stderr[-2000:]
    assert "kept from the interrupted run" in res.stdout
    _same(one, two)
    manifest = json.loads((two / "manifest.json").read_text())
    assert (
        manifest["resumed_groups"] == 3 and manifest["dist"]["chunks"] == 2
    )  # g00001, g00004: one per worker
