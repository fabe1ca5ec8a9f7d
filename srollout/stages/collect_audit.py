"""``collect --audit F --audit-floor P``: the audited gates over a collect's groups: the group
gate's threshold and the trajectory gate's W (:class:`srollout.rollout.audits.Audit`), each moved
as train-onpolicy moves it between iterations, chunk by chunk (one engine call a chunk, in one
process: :data:`ONE_PROCESS`). What it does, writes and resumes: docs/gates.md ("In `collect`").
"""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import polars as pl

from srollout.config import CollectConfig
from srollout.core.audit import Band
from srollout.rollout.audits import Audit
from srollout.rollout.engine import GroupRecord, GroupSpec, RolloutSettings, RolloutSummary
from srollout.rollout.ray_pool import default_chunk_groups

CHUNKS_FILE = "audit_chunks.json"
ONE_PROCESS = (
    "one process: --audit moves the gate's threshold from one chunk of groups to the next, in order"
)

# roll(specs, settings) -> (records, summary): one engine call of the stage (parts written)
RollChunk = Callable[
    [Sequence[GroupSpec], RolloutSettings], tuple[list[GroupRecord], RolloutSummary]
]


class AuditSummary(NamedTuple):
    """The audit of a whole collect: chunks run (and their size), the gate's cuts, the audited
    ones with TP / FP (by their full outcome) and the steps they took after the cut, the bound
    after the last chunk (nan: no audited cut below its threshold) against the floor, and the
    threshold (d_L, or a learned gate's t) of the first chunk and the one the audit ends on
    (``group``: the run has a group gate). With the trajectory gate (``stall``): the stops that
    stood, the audited ones with TP (failed) / FP (won) and the steps they took after the stop,
    the last bound, and the W of the first chunk and the one the audit ends on."""

    chunks: int
    chunk_groups: int
    cuts: int
    audited: int
    tp: int
    fp: int
    audit_steps: int
    precision_lb: float
    floor: float
    start_threshold: float
    final_threshold: float
    band: Band | None = None  # with no cut: the best band of the groups let through
    group: bool = True
    stall: bool = False
    stalled: int = 0
    stop_audited: int = 0
    stop_tp: int = 0
    stop_fp: int = 0
    stop_steps: int = 0
    stop_precision_lb: float = math.nan
    start_W: int = 0
    final_W: int = 0

    def _bound(self, lb: float, what: str) -> str:
        if math.isnan(lb):
            return f"no audited {what} yet"
        return f"precision bound {lb:.3f} {'>=' if lb >= self.floor else '<'} floor {self.floor:g}"

    def line(self) -> str:
        parts = []
        if self.group:
            parts.append(
                f"audit: {self.audited} of {self.cuts} cuts audited (TP {self.tp}, FP {self.fp}; "
                f"{self.audit_steps} steps after the cut); "
                f"{self._bound(self.precision_lb, 'cut below the threshold')}; threshold "
                f"{self.start_threshold:.3g} -> {self.final_threshold:.3g} over {self.chunks} "
                f"chunk(s) of {self.chunk_groups} groups" + self._closed()
            )
        if self.stall:
            stops = self.stalled + self.stop_audited
            parts.append(
                f"stop audit: {self.stop_audited} of {stops} stops audited (TP {self.stop_tp} "
                f"failed, FP {self.stop_fp} won; {self.stop_steps} steps after the stop); "
                f"{self._bound(self.stop_precision_lb, 'stop')}; stall W {self.start_W} -> "
                f"{self.final_W} over {self.chunks} chunk(s) of {self.chunk_groups} groups"
            )
        return "\n".join(parts)

    def _closed(self) -> str:
        """Why a gate that cut nothing stayed shut: its best band against the floor."""
        if self.cuts or self.band is None:
            return ""
        b = self.band
        return (
            f"; no cut: the best band of the groups let through (the {b.n} nearest the "
            f"threshold, {b.zero_var} zero-variance) bounds precision at {b.precision_lb:.3f} "
            f"{'>=' if b.precision_lb >= self.floor else '<'} floor {self.floor:g}"
        )


class CollectAudit:
    """The audit of one collect run (module docstring): its :class:`Audit` (the group gate's),
    the chunk size and the rows of the chunks finished so far."""

    def __init__(
        self, audit: Audit, chunk_groups: int, rows: list[dict[str, Any]], path: Path, floor: float
    ):
        self.audit, self.chunk_groups, self.rows, self.path = audit, chunk_groups, rows, path
        self.floor = floor
        self.auditor: Any = audit.gate  # the group gate's (None without one): threshold and band
        self.stops: Any = audit.stops  # the trajectory gate's (None without one): W

    @classmethod
    def start(cls, config: CollectConfig, gate: Any, traj_gate: Any, run_dir: Path) -> CollectAudit:
        """The audit of ``run_dir``: a new one, or with ``--resume`` the one its files hold."""
        path = Path(run_dir) / CHUNKS_FILE
        saved = json.loads(path.read_text()) if config.resume and path.exists() else None
        chunk_groups = int(saved["chunk_groups"]) if saved else default_chunk_groups(config)
        rows = list(saved["chunks"]) if saved else []
        audited = Audit.of(
            config, gate, traj_gate, ckpt_dir=run_dir, iteration=len(rows), resume=config.resume
        )
        audit = cls(audited, chunk_groups, rows, path, config.audit_floor)
        audit._save_rows()  # the chunk size is fixed from the first start on
        return audit

    def chunk_of(self, spec: GroupSpec) -> int:
        """The 1-based chunk of group ``spec``."""
        return spec.index // self.chunk_groups + 1

    def done_ids(self, specs: Sequence[GroupSpec]) -> list[str]:
        """The groups of the finished chunks (the rest is rolled out, again if need be)."""
        return [s.group_id for s in specs if self.chunk_of(s) <= len(self.rows)]

    def run(
        self, todo: Sequence[GroupSpec], settings: RolloutSettings, roll: RollChunk
    ) -> list[RolloutSummary]:
        """Roll ``todo`` (whole chunks, in group order) chunk by chunk, each at the threshold the
        audit chose after the one before; audit and save after each. One summary a chunk."""
        summaries = []
        for chunk, batch in itertools.groupby(todo, key=self.chunk_of):
            batch = list(batch)
            records, summary = roll(batch, self.audit.settings(settings))
            summaries.append(summary)
            metrics, stops = self.audit.label(records, chunk)
            assert metrics is not None and stops is not None  # a CollectAudit runs with --audit
            self.rows.append(
                {
                    "chunk": chunk,
                    "first_group": batch[0].index,
                    "groups": len(batch),
                    "gate/cuts": sum(r.cut for r in records),
                    **metrics.columns(),
                    "gate/stalled": sum(t.stalled for r in records for t in r.trajs),
                    **stops.columns(),
                }
            )
            # the ledger first: on resume it is cut back to the rows saved after it
            self.audit.save()
            self._save_rows()
        return summaries

    def files(self) -> list[Path]:
        """The audit's files in the run directory: the ledger, the chunk rows and the gate as
        calibrated (for the next run's ``--gate``)."""
        from srollout.rollout.audit import AUDIT_FILE, AUDITED_GATE_FILE
        from srollout.rollout.stop_audit import AUDITED_STALL_GATE_FILE, STOP_AUDIT_FILE

        names = [AUDIT_FILE, self.path.name, AUDITED_GATE_FILE]
        names += [STOP_AUDIT_FILE, AUDITED_STALL_GATE_FILE]
        return [p for p in (self.path.parent / n for n in names) if p.exists()]

    def _save_rows(self) -> None:
        from srollout.atomic import atomic_write_json

        atomic_write_json({"chunk_groups": self.chunk_groups, "chunks": self.rows}, self.path)

    def _full_rows(self) -> list[dict[str, Any]]:
        """The chunk rows, those of a run audited before the trajectory gate's columns given its
        empty ones."""
        from srollout.rollout.stop_audit import NO_STOP_AUDIT

        empty = {"gate/stalled": 0, **NO_STOP_AUDIT.columns()}
        return [{**empty, **r} for r in self.rows]

    def table(self) -> pl.DataFrame:
        """audit.parquet: one row per chunk (:data:`srollout.schemas.AUDIT`)."""
        from srollout.schemas import AUDIT

        return pl.DataFrame(self._full_rows(), schema=dict(AUDIT.columns))

    def summary(self) -> AuditSummary:
        rows = self._full_rows()
        group, stops = self.auditor, self.stops

        def total(col: str) -> int:
            return sum(int(r[col]) for r in rows)

        return AuditSummary(
            chunks=len(rows),
            chunk_groups=self.chunk_groups,
            cuts=total("gate/cuts"),
            audited=total("gate/audited"),
            tp=total("gate/audit_tp"),
            fp=total("gate/audit_fp"),
            audit_steps=total("gate/audit_steps"),
            precision_lb=float(rows[-1]["gate/precision_lb"]) if rows else math.nan,
            floor=self.floor,
            start_threshold=float(rows[0]["gate/threshold"]) if rows else math.nan,
            final_threshold=float(group.knob.shown(group.threshold)) if group else math.nan,
            band=group.band() if group is not None else None,
            group=group is not None,
            stall=stops is not None,
            stalled=total("gate/stalled"),
            stop_audited=total("gate/stop_audited"),
            stop_tp=total("gate/stop_audit_tp"),
            stop_fp=total("gate/stop_audit_fp"),
            stop_steps=total("gate/stop_audit_steps"),
            stop_precision_lb=float(rows[-1]["gate/stop_precision_lb"]) if rows else math.nan,
            start_W=int(rows[0]["gate/stall_W"]) if rows else 0,
            final_W=stops.W if stops is not None else 0,
        )
