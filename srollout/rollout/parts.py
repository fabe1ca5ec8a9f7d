"""Per-group part directories: what makes ``collect --resume`` exact after a kill -9.

Each finished group's four tables are written into ``<run>/parts/.<group_id>.tmp-*/`` and the
directory is then renamed to ``<run>/parts/<group_id>/`` in one ``os.replace``, so a part either
exists whole or not at all; a half-written temp directory left by a killed process is ignored
and removed on resume. The final Parquets are the concatenation of the parts in group order,
so they do not depend on the order groups finished in.
"""

from __future__ import annotations

import shutil
from collections.abc import Mapping
from pathlib import Path

import polars as pl

from srollout.atomic import atomic_dir
from srollout.rollout.records import TABLE_SCHEMAS, GroupTables
from srollout.schemas import ARTIFACTS, dump_parquet
from srollout.schemas import write as write_parquet

PARTS_DIR = "parts"
TABLES: tuple[str, ...] = ("steps", "trajectories", "groups", "signals")


def parts_dir(run_dir: Path) -> Path:
    return Path(run_dir) / PARTS_DIR


def write_part(
    run_dir: Path, group_id: str, tables: GroupTables | Mapping[str, pl.DataFrame]
) -> Path:
    """Write one group's tables (or a verl session's, by name) atomically as
    ``parts/<group_id>/<table>.parquet``."""
    final = parts_dir(run_dir) / group_id
    # a rerun of the same group (should not happen) replaces the old part
    with atomic_dir(final) as tmp:
        named = tables.as_dict() if isinstance(tables, GroupTables) else tables
        for name, df in named.items():
            # fsynced, so that a power cut after the rename cannot leave an empty file behind it
            dump_parquet(df, tmp / f"{name}.parquet")
    return final


def finished_groups(run_dir: Path) -> list[str]:
    """Ids of the groups whose part is complete, sorted; removes leftovers of killed writes."""
    root = parts_dir(run_dir)
    if not root.exists():
        return []
    done = []
    for entry in sorted(root.iterdir()):
        if entry.name.startswith("."):
            shutil.rmtree(entry, ignore_errors=True)
        elif entry.is_dir() and all((entry / f"{t}.parquet").exists() for t in TABLES):
            done.append(entry.name)
    return done


def merge_parts(run_dir: Path, group_ids: list[str]) -> dict[str, Path]:
    """Concatenate the parts of ``group_ids`` (in that order) into ``<run>/<table>.parquet``.

    Returns table name -> path. Every table is validated against its schemas.py artifact.
    """
    root = parts_dir(run_dir)
    written = {}
    for name in TABLES:
        frames = [pl.read_parquet(root / gid / f"{name}.parquet") for gid in group_ids]
        df = (
            pl.concat(frames, how="vertical")
            if frames
            else pl.DataFrame(schema=TABLE_SCHEMAS[name])
        )
        written[name] = write_parquet(df, Path(run_dir) / f"{name}.parquet", ARTIFACTS[name])
    return written
