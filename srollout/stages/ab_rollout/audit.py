"""``ab-rollout --audit F --audit-floor P``: every gated arm audits its own gate.

Each arm with the gate (gated, gated+dapo, gated+greso) has its own
:class:`srollout.rollout.audit.GateAuditor`, its ledger in ``<run>/<arm>/audit.json``. The
arm's timed runs, in schedule order, are its iterations (1, 2, ... over repeats and blocks): run
k rolls its groups (all DAPO rounds) with the gate at the threshold the audits of runs 1 .. k-1
chose, a seeded share F of its cuts running on to T_max inside the timed engine call (their
steps and tokens are the arm's cost); after the clock stops its audited cuts and the groups it
let through move the threshold for run k+1. What a run's audit found is kept in its
``block-<b>.json`` (``audit``), written after ``audit.json``: on ``--resume`` the ledger is cut
back to the arm's finished runs.

The baseline arm still judges every cut (ab.parquet's ``tp`` / ``fp``): with ``--audit 1.0``
every cut is audited and, the seeds being the same, its full outcome is the baseline twin's, so
the audit's TP / FP equal the baseline-judged ones.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import polars as pl

from srollout.config import AbRolloutConfig
from srollout.core.arms import ArmSpec
from srollout.rollout.audits import Audit
from srollout.stages.ab_rollout.schedule import Block, arm_dir

# the audit's columns of blocks.parquet (per timed run) and arms.parquet (per arm), null on an
# arm without the gate
AUDIT_DTYPES: dict[str, Any] = {
    "audited": pl.Int64,
    "audit_tp": pl.Int64,
    "audit_fp": pl.Int64,
    "audit_steps": pl.Int64,
    "audit_precision_lb": pl.Float64,
    "audit_threshold": pl.Float64,
    "audit_next_threshold": pl.Float64,
}
AUDIT_BLOCK_COLUMNS = tuple(AUDIT_DTYPES)


def check_auditable(config: AbRolloutConfig, arms: Sequence[ArmSpec]) -> None:
    """With ``--audit``: a gate the audit cannot move is one line, before anything is written."""
    if config.audit > 0:
        for arm in arms:
            if arm.gate_rule is not None:
                Audit.of(config, arm.gate_rule)


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
    """arm name -> its :class:`Audit` (gated arms, with ``--audit``), resumed from the arm's
    finished timed runs (those before its first one still to do)."""
    if config.audit <= 0:
        return {}
    pending = {b.order for b in todo}
    out = {}
    for arm in arms:
        if arm.gate_rule is None:
            continue
        mine = [b for b in schedule if b.arm.name == arm.name]
        done = next((i for i, b in enumerate(mine) if b.order in pending), len(mine))
        ckpt = audit_dir(run_dir, arm.name)
        ckpt.mkdir(parents=True, exist_ok=True)
        out[arm.name] = Audit.of(
            config, arm.gate_rule, ckpt_dir=ckpt, iteration=done, resume=config.resume
        )
    return out


def audited_block(block: Block, audit: Audit) -> Block:
    """``block`` with its arm at the gate the audit chose for it."""
    gate = audit.gate.current_gate() if audit.gate is not None else block.arm.gate_rule
    return block._replace(arm=block.arm.with_gate(gate, block.arm.gate_K, block.arm.traj_gate))


def audit_block(audit: Audit, records: Sequence[Any], iteration: int) -> dict[str, Any]:
    """Audit one timed run's groups (after its clock stopped), save the ledger, and return what
    block-<b>.json keeps of it (:data:`AUDIT_BLOCK_COLUMNS`)."""
    m, _ = audit.label(records, iteration)
    assert m is not None and audit.gate is not None  # an arm's audit runs only with --audit
    audit.save()
    auditor = audit.gate
    return dict(
        zip(
            AUDIT_BLOCK_COLUMNS,
            (
                m.audited,
                m.audit_tp,
                m.audit_fp,
                m.audit_steps,
                m.precision_lb,
                m.threshold,
                float(auditor.knob.shown(auditor.threshold)),
            ),
            strict=True,
        )
    )


def arm_audit_totals(runs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """One arm's audit over its timed runs (schedule order; each a blocks.parquet row): the counts
    summed, the last run's bound and threshold, and the threshold the audit ends on."""
    last = runs[-1] if runs else {}
    return {
        "audited": sum(int(r["audited"]) for r in runs),
        "audit_tp": sum(int(r["audit_tp"]) for r in runs),
        "audit_fp": sum(int(r["audit_fp"]) for r in runs),
        "audit_steps": sum(int(r["audit_steps"]) for r in runs),
        "audit_precision_lb": last.get("audit_precision_lb", math.nan),
        "audit_threshold": last.get("audit_threshold", math.nan),
        "audit_next_threshold": last.get("audit_next_threshold", math.nan),
    }


def audit_dir(run_dir: Path, arm: str) -> Path:
    """Where an arm's ledger lives: ``<run>/<arm>/`` (beside its ``r<repeat>/`` tables)."""
    return arm_dir(run_dir, arm, 0).parent


__all__ = (
    "AUDIT_BLOCK_COLUMNS",
    "AUDIT_DTYPES",
    "arm_audit_totals",
    "arm_auditors",
    "arm_iterations",
    "audit_block",
    "audit_dir",
    "audited_block",
    "check_auditable",
)
