"""``ab-rollout --audit F --audit-floor P``: every gated arm audits its own gates (docs/gates.md,
"In `ab-rollout`").

Each arm with the group gate or the trajectory gate has its own
:class:`srollout.rollout.audits.Audit` (ledgers ``<run>/<arm>/audit.json`` and
``audit-stall.json``). The arm's timed runs, in schedule order, are its iterations: run k rolls
its groups (all DAPO rounds) at the threshold the audits of runs 1 .. k-1 chose, its audited cuts
running on inside the timed engine call (their cost is the arm's); after the clock stops they
move the threshold for run k+1. A run's audit is kept in its ``block-<b>.json`` (``audit``),
written after ``audit.json``: on ``--resume`` the ledger is cut back to the arm's finished runs.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import polars as pl

from srollout.config import AbRolloutConfig
from srollout.core.arms import ArmSpec
from srollout.rollout.audits import Audit
from srollout.stages.ab_rollout.schedule import Block

# the audit's columns of blocks.parquet (per timed run) and arms.parquet (per arm), null on an
# arm without the gate: the group gate's, then the trajectory gate's
GROUP_AUDIT_DTYPES: dict[str, Any] = {
    "audited": pl.Int64,
    "audit_tp": pl.Int64,
    "audit_fp": pl.Int64,
    "audit_steps": pl.Int64,
    "audit_precision_lb": pl.Float64,
    "audit_threshold": pl.Float64,
    "audit_next_threshold": pl.Float64,
}
STOP_AUDIT_DTYPES: dict[str, Any] = {
    "stop_audited": pl.Int64,
    "stop_audit_tp": pl.Int64,
    "stop_audit_fp": pl.Int64,
    "stop_audit_steps": pl.Int64,
    "stop_precision_lb": pl.Float64,
    "stall_W": pl.Int64,
    "next_stall_W": pl.Int64,
}
AUDIT_DTYPES: dict[str, Any] = {**GROUP_AUDIT_DTYPES, **STOP_AUDIT_DTYPES}
AUDIT_BLOCK_COLUMNS = tuple(AUDIT_DTYPES)


def check_auditable(config: AbRolloutConfig, arms: Sequence[ArmSpec]) -> None:
    """With ``--audit``: a gate the audit cannot move is one line, before anything is written."""
    if config.audit > 0:
        for arm in arms:
            if arm.gate_rule is not None or arm.traj_gate is not None:
                Audit.of(config, arm.gate_rule, arm.traj_gate)


def arm_iterations(schedule: Sequence[Block]) -> dict[int, int]:
    """Block order -> its arm's 1-based timed-run number (the audit's iteration)."""
    seen: dict[str, int] = {}
    out = {}
    for b in schedule:
        seen[b.arm.name] = seen.get(b.arm.name, 0) + 1
        out[b.order] = seen[b.arm.name]
    return out


def arm_auditors(
    config: AbRolloutConfig,
    arms: Sequence[ArmSpec],
    schedule: Sequence[Block],
    todo: Sequence[Block],
    run_dir: Path,
) -> dict[str, Any]:
    """arm name -> its :class:`Audit` (arms with a gate, with ``--audit``), resumed from the
    arm's finished timed runs (those before its first one still to do)."""
    if config.audit <= 0:
        return {}
    pending = {b.order for b in todo}
    out = {}
    for arm in arms:
        if arm.gate_rule is None and arm.traj_gate is None:
            continue
        mine = [b for b in schedule if b.arm.name == arm.name]
        done = next((i for i, b in enumerate(mine) if b.order in pending), len(mine))
        ckpt = Path(run_dir) / arm.name  # beside the arm's r<repeat>/ tables
        ckpt.mkdir(parents=True, exist_ok=True)
        out[arm.name] = Audit.of(
            config,
            arm.gate_rule,
            arm.traj_gate,
            ckpt_dir=ckpt,
            iteration=done,
            resume=config.resume,
        )
    return out


def audited_block(block: Block, audit: Audit) -> Block:
    """``block`` with its arm at the gates the audit chose for it."""
    arm = block.arm
    gate = audit.gate.current_gate() if audit.gate is not None else arm.gate_rule
    traj = audit.stops.current_gate() if audit.stops is not None else arm.traj_gate
    return block._replace(arm=arm.with_gate(gate, arm.gate_K, traj))


def audit_block(audit: Audit, records: Sequence[Any], iteration: int) -> dict[str, Any]:
    """Audit one timed run's groups (after its clock stopped), save the ledgers, and return what
    block-<b>.json keeps of it (:data:`AUDIT_BLOCK_COLUMNS`; only the gates the arm has)."""
    m, stops = audit.label(records, iteration)
    assert m is not None and stops is not None  # an arm's audit runs only with --audit
    audit.save()
    out: dict[str, Any] = {}
    if audit.gate is not None:
        shown = float(audit.gate.knob.shown(audit.gate.threshold))  # the next run's threshold
        names = ("audited", "audit_tp", "audit_fp", "audit_steps", "precision_lb", "threshold")
        values = [*(getattr(m, n) for n in names), shown]
        out |= dict(zip(GROUP_AUDIT_DTYPES, values, strict=True))
    if audit.stops is not None:  # the stop metrics' own names, then the next run's W
        out |= {c: getattr(stops, c) for c in list(STOP_AUDIT_DTYPES)[:-1]}
        out["next_stall_W"] = audit.stops.W
    return out


def arm_audit_totals(runs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """One arm's audit over its timed runs (schedule order; each a blocks.parquet row): the counts
    summed, the last run's bound and threshold (or W), and the one the audit ends on; null for a
    gate the arm does not have."""
    last = runs[-1] if runs else {}
    out: dict[str, Any] = {}
    for dtypes in (GROUP_AUDIT_DTYPES, STOP_AUDIT_DTYPES):
        names = list(dtypes)  # four counts, then the bound, the threshold (or W) and the next one
        has = bool(runs) and all(r.get(names[0]) is not None for r in runs)
        for c in names[:4]:
            out[c] = sum(int(r[c]) for r in runs) if has else None
        for c in names[4:]:
            out[c] = last.get(c) if has else None
    return out
