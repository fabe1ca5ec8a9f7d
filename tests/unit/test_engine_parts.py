"""Part files: atomic per-group directories, leftovers of a killed write, merge in group order."""

from __future__ import annotations

import polars as pl
from corridor_env import roll, tasks

from srollout.rollout.engine import RolloutSettings, make_specs
from srollout.rollout.parts import finished_groups, merge_parts, parts_dir, write_part
from srollout.rollout.records import TIMING_COLUMNS, group_tables


def _records():
    settings = RolloutSettings(G=3, T_max=6, seed=4, concurrency=6, signal_K=(2, 4))
    records, _ = roll(make_specs(tasks([2, 5, 3, 4]), 4), settings)
    return records


def test_parts_merge_in_group_order_whatever_the_finishing_order(tmp_path):
    records = _records()
    a, b = tmp_path / "a", tmp_path / "b"
    for r in records:
        write_part(a, r.group_id, group_tables(r))
    for r in reversed(records):
        write_part(b, r.group_id, group_tables(r))
    ids = [f"g{i:05d}" for i in range(4)]
    assert finished_groups(a) == finished_groups(b) == ids
    pa, pb = merge_parts(a, ids), merge_parts(b, ids)
    for name in ("steps", "trajectories", "groups", "signals"):
        da, db = pl.read_parquet(pa[name]), pl.read_parquet(pb[name])
        keep = [c for c in da.columns if c not in TIMING_COLUMNS]
        assert da.select(keep).equals(db.select(keep)), name
    groups = pl.read_parquet(pa["groups"])
    assert groups["group_id"].to_list() == ids
    assert groups["G"].to_list() == [3] * 4
    assert pl.read_parquet(pa["trajectories"]).height == 12
    assert pl.read_parquet(pa["signals"])["K"].to_list() == [2, 4] * 4


def test_half_written_part_is_ignored_and_removed(tmp_path):
    records = _records()
    write_part(tmp_path, records[0].group_id, group_tables(records[0]))
    # what a kill -9 during write_part leaves: a hidden temp dir with some of the tables
    stale = parts_dir(tmp_path) / ".g00001.tmp-abc"
    stale.mkdir()
    group_tables(records[1]).steps.write_parquet(stale / "steps.parquet")
    # and a directory missing a table is not finished either
    partial = parts_dir(tmp_path) / "g00002"
    partial.mkdir()
    assert finished_groups(tmp_path) == ["g00000"]
    assert not stale.exists()
