"""The Parquet log a trainer writes as it trains: every group its rollout function played, in the
tables of DESIGN.md's contract, so ``srollout analyze``, ``sweep`` and ``what-if`` read a user's
own run like a ``collect``.

Layout of the log directory (``GatedRollout(log_dir=...)``)::

    manifest.json                     stage "trainer-log", the rollout's settings, status
    parts/step-00000012/*.parquet     one part per training call, written atomically
                                      (srollout.rollout.parts), named by the trainer step it feeds
    steps / trajectories / groups / signals.parquet
                                      the parts merged in step order (at the end of training,
                                      or by :func:`merge_log`)

Every row carries ``trainer_step`` (the optimizer step the call's rollouts train: the trainer's
``global_step`` + 1 at the call); groups rows also carry ``in_batch`` (the group's rows went to
the optimizer: False for a group DAPO discarded or a cut group). Nothing is held in memory
between calls. When the trainer resumes from a checkpoint at step S, the first call removes the
parts of steps after S (they are played again) and restores what the rollout function needs to
continue exactly (the next group index, so the seeds; GRESO's history) from the parts that stay:
the log then holds every finished step once.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import polars as pl

from srollout.errors import SrolloutError
from srollout.rollout.engine import GroupRecord
from srollout.rollout.parts import finished_groups, merge_parts, parts_dir, write_part
from srollout.rollout.records import GroupTables, group_tables

STAGE = "trainer-log"
PART = "step-{:08d}"


@dataclass(frozen=True)
class LogResume:
    """What a reopened log restores: ``next_group`` (the next group index: seeds continue where
    the checkpoint left them), ``greso`` ((task_id, trainer_step, zero_var or cut) of every
    group in the log) and ``steps`` (the trainer steps the log holds)."""

    next_group: int
    greso: tuple[tuple[str, int, bool], ...]
    steps: tuple[int, ...]


def _step_of(part: str) -> int | None:
    head, _, num = part.partition("-")
    return int(num) if head == "step" and num.isdigit() else None


class TrainerLog:
    """A trainer log at ``out`` for a rollout function with settings ``config`` (a JSON-able
    mapping: a log is refused if it was made with other settings)."""

    def __init__(self, out: str | Path, config: Mapping[str, Any]) -> None:
        self.out = Path(out)
        self.config = json.loads(json.dumps(dict(config), default=str))
        self._manifest: Any = None

    # --- opening -------------------------------------------------------------------------------
    def open(self, trainer_step: int) -> LogResume:
        """Open the log at the trainer's ``global_step`` (0 for a fresh run; S when resumed from
        the checkpoint of step S). Refuses, in one line and before writing anything, a directory
        that is not a trainer log, a log made with other settings, and a fresh run (step 0) into
        a log that already holds steps."""
        from srollout.rundir import Manifest

        out = self.out
        if out.exists() and not out.is_dir():
            raise SrolloutError(f"log_dir {out}: exists and is not a directory")
        manifest = out / "manifest.json"
        if out.exists() and any(out.iterdir()):
            if not manifest.exists():
                raise SrolloutError(
                    f"log_dir {out} is not empty and has no manifest.json: it is not a srollout "
                    "trainer log; give an empty or new directory"
                )
            old = json.loads(manifest.read_text())
            if old.get("stage") != STAGE:
                raise SrolloutError(
                    f"log_dir {out} is a {old.get('stage')!r} run, not a trainer log; give an "
                    "empty or new directory"
                )
            before = old.get("config", {})
            for key in sorted(set(before) | set(self.config)):
                if before.get(key) != self.config.get(key):
                    raise SrolloutError(
                        f"log_dir {out} belongs to a run made with {key}={before.get(key)!r}, "
                        f"not {self.config.get(key)!r}; give a new directory for a new "
                        "configuration"
                    )
        steps = sorted(s for s in map(_step_of, finished_groups(out)) if s is not None)
        if steps and trainer_step == 0:
            raise SrolloutError(
                f"log_dir {out} already holds trainer steps {steps[0]}..{steps[-1]} of an earlier "
                "run, and this one starts at step 0: give a new directory, or resume the trainer "
                "from its checkpoint (resume_from_checkpoint) to continue that log"
            )
        for s in [s for s in steps if s > trainer_step]:  # played again after the checkpoint
            shutil.rmtree(parts_dir(out) / PART.format(s))
        for table in ("steps", "trajectories", "groups", "signals"):
            (out / f"{table}.parquet").unlink(missing_ok=True)  # merged again at the end
        kept = [s for s in steps if s <= trainer_step]
        resume = self._resume(kept)
        out.mkdir(parents=True, exist_ok=True)
        self._manifest = Manifest(out, STAGE, self.config)
        self._manifest.update(resumed_at_step=trainer_step if kept else None)
        return resume

    def _resume(self, steps: Sequence[int]) -> LogResume:
        if not steps:
            return LogResume(0, (), ())
        frames = [
            pl.read_parquet(
                parts_dir(self.out) / PART.format(s) / "groups.parquet",
                columns=["group_index", "task_id", "zero_var", "cut", "trainer_step"],
            )
            for s in steps
        ]
        groups = pl.concat(frames)
        greso = tuple(
            (str(r["task_id"]), int(r["trainer_step"]), bool(r["zero_var"] or r["cut"]))
            for r in groups.iter_rows(named=True)
        )
        return LogResume(int(groups["group_index"].max()) + 1, greso, tuple(steps))

    # --- writing -------------------------------------------------------------------------------
    def write(
        self,
        trainer_step: int,
        records: Sequence[GroupRecord],
        in_batch: Sequence[bool],
        shadow: bool = False,
    ) -> Path | None:
        """Write the groups of the call feeding ``trainer_step`` as its part (atomically; a part
        of the same step is replaced). ``in_batch[i]``: record i's rows went to the optimizer."""
        if self._manifest is None:
            raise SrolloutError("TrainerLog.write before open()")
        if not records:
            return None
        parts = [group_tables(r, shadow=shadow) for r in records]
        step = pl.lit(int(trainer_step), dtype=pl.Int64).alias("trainer_step")
        tables = {}
        for name in GroupTables._fields:
            df = pl.concat([getattr(p, name) for p in parts], how="diagonal_relaxed")
            tables[name] = df.with_columns(step)
        tables["groups"] = tables["groups"].with_columns(
            pl.Series("in_batch", [bool(b) for b in in_batch], dtype=pl.Boolean)
        )
        return write_part(self.out, PART.format(trainer_step), GroupTables(**tables))

    def merge(self) -> dict[str, Path]:
        """Merge the parts, in step order, into the four tables; the manifest says complete."""
        paths = merge_log(self.out)
        if self._manifest is not None:
            self._manifest.complete(list(paths.values()))
        return paths


def merge_log(out: str | Path) -> dict[str, Path]:
    """Merge a trainer log's parts (a finished run, or one stopped midway) into its four tables,
    in step order; returns table -> path."""
    out = Path(out)
    parts = sorted((p for p in finished_groups(out) if _step_of(p) is not None), key=_step_of)
    if not parts:
        raise SrolloutError(f"{out} holds no trainer-log parts (parts/step-*)")
    return merge_parts(out, parts)
