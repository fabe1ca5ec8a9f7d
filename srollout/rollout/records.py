"""A finished group's rows as the four Parquet tables (steps, trajectories, groups, signals): the
required columns of :mod:`srollout.schemas` plus the optional ones docs/artifacts.md lists in
italics; ``reward_var`` and ``label`` as the engine labels (:mod:`srollout.rollout.engine`).
"""

from __future__ import annotations

from typing import NamedTuple

import polars as pl

from srollout.rollout.engine import GroupRecord
from srollout.schemas import SIGNAL_NAMES, STEP_KEYS, STEP_SIGNAL_NAMES, STEPS

# the contract's steps columns, in its order, plus the arm
STEP_SCHEMA: dict[str, pl.DataType] = {**STEPS.columns, **STEPS.optional, "arm": pl.Utf8}

TRAJ_SCHEMA: dict[str, pl.DataType] = {
    "group_id": pl.Utf8,
    "traj_idx": pl.Int64,
    "task_id": pl.Utf8,
    "task_type": pl.Utf8,
    "seed": pl.Int64,
    "env_seed": pl.Int64,
    "reward": pl.Float64,
    "success": pl.Boolean,
    "n_steps": pl.Int64,
    "ended_by": pl.Utf8,
    "n_gen_tokens": pl.Int64,
    "n_prompt_tokens": pl.Int64,
    "n_valid": pl.Int64,
    "gen_s": pl.Float64,
    "env_s": pl.Float64,
    "reset_s": pl.Float64,
    "initial_observation": pl.Utf8,
    "token_ids": pl.List(pl.Int64),
    "action_mask": pl.List(pl.Boolean),
    "arm": pl.Utf8,
}

GROUP_SCHEMA: dict[str, pl.DataType] = {
    "group_id": pl.Utf8,
    "group_index": pl.Int64,
    "task_id": pl.Utf8,
    "task_type": pl.Utf8,
    "G": pl.Int64,
    "reward_mean": pl.Float64,
    "reward_var": pl.Float64,
    "label": pl.Utf8,
    "zero_var": pl.Boolean,
    "success_rate": pl.Float64,
    "cut": pl.Boolean,
    "cut_step": pl.Int64,
    "gate_K": pl.Int64,
    "gate_d_K": pl.Float64,
    "n_stopped": pl.Int64,
    "n_stalled": pl.Int64,
    "arm": pl.Utf8,
    "n_steps": pl.Int64,
    "n_gen_tokens": pl.Int64,
    "n_prompt_tokens": pl.Int64,
    "gen_s": pl.Float64,
    "env_s": pl.Float64,
    "reset_s": pl.Float64,
    "wall_s": pl.Float64,
    "started_tick": pl.Int64,
    "finished_tick": pl.Int64,
}

SIGNAL_SCHEMA: dict[str, pl.DataType] = {
    "group_id": pl.Utf8,
    "task_id": pl.Utf8,
    "task_type": pl.Utf8,
    "K": pl.Int64,
    **{name: pl.Float64 for name in SIGNAL_NAMES + STEP_SIGNAL_NAMES},
    "reward_var": pl.Float64,
    "label": pl.Utf8,
    "zero_var": pl.Boolean,
    "arm": pl.Utf8,
}

TABLE_SCHEMAS: dict[str, dict[str, pl.DataType]] = {
    "steps": STEP_SCHEMA,
    "trajectories": TRAJ_SCHEMA,
    "groups": GROUP_SCHEMA,
    "signals": SIGNAL_SCHEMA,
}

# groups.parquet of a run with --audit > 0 (every arm): which cuts the audit let run on
AUDIT_GROUP_SCHEMA: dict[str, pl.DataType] = {**GROUP_SCHEMA, "audited": pl.Boolean}
# a shadow run (collect --shadow): where each gate would have acted (null: it would not)
SHADOW_GROUP_SCHEMA: dict[str, pl.DataType] = {**GROUP_SCHEMA, "shadow_cut_step": pl.Int64}
SHADOW_TRAJ_SCHEMA: dict[str, pl.DataType] = {**TRAJ_SCHEMA, "shadow_stop_step": pl.Int64}
# trajectories.parquet of an audited collect: where the trajectory gate stopped a trajectory the
# audit let run on (null: not an audited stop)
AUDIT_TRAJ_SCHEMA: dict[str, pl.DataType] = {**TRAJ_SCHEMA, "audited_stop": pl.Int64}

# Columns that hold measured time: they differ between two runs of the same seed.
TIMING_COLUMNS: frozenset[str] = frozenset(
    {"gen_s", "env_s", "reset_s", "wall_s", "started_tick", "finished_tick"}
)


class GroupTables(NamedTuple):
    """The four tables of one group (rows: G*n_steps, G, 1, len(recorded K))."""

    steps: pl.DataFrame
    trajectories: pl.DataFrame
    groups: pl.DataFrame
    signals: pl.DataFrame

    def as_dict(self) -> dict[str, pl.DataFrame]:
        return dict(self._asdict())


def group_tables(record: GroupRecord, audit: bool = False, shadow: bool = False) -> GroupTables:
    """Turn one finished :class:`GroupRecord` into its four tables (schemas above); ``audit``:
    the run audits its gates, so the groups row has ``audited`` (:data:`AUDIT_GROUP_SCHEMA`) and
    each trajectory ``audited_stop`` (:data:`AUDIT_TRAJ_SCHEMA`);
    ``shadow``: a shadow run, so the groups row has ``shadow_cut_step`` and each trajectory
    ``shadow_stop_step`` (:data:`SHADOW_GROUP_SCHEMA`, :data:`SHADOW_TRAJ_SCHEMA`)."""
    from srollout.core.grpo import group_label, is_zero_variance, reward_variance

    spec = record.spec
    gid, task_id, task_type = record.group_id, spec.task.task_id, spec.task.task_type
    rewards = record.rewards
    reward_var = float(reward_variance(rewards))
    label = group_label(rewards, success=[t.success for t in record.trajs])
    zero_var = bool(is_zero_variance(rewards))

    step_rows = []
    traj_rows = []
    for t in record.trajs:
        for row in t.steps:
            keys = (gid, t.traj_idx, task_id, task_type)
            step_rows.append({**dict(zip(STEP_KEYS, keys, strict=True)), **row, "arm": record.arm})
        traj_rows.append(
            {
                "group_id": gid,
                "traj_idx": t.traj_idx,
                "task_id": task_id,
                "task_type": task_type,
                "seed": t.seed,
                "env_seed": t.env_seed,
                "reward": t.reward,
                "success": t.success,
                "n_steps": len(t.steps),
                "ended_by": t.ended_by,
                "n_gen_tokens": t.n_gen_tokens,
                "n_prompt_tokens": t.n_prompt_tokens,
                "n_valid": sum(1 for s in t.steps if s["valid"]),
                "gen_s": sum(s["gen_s"] for s in t.steps),
                "env_s": sum(s["env_s"] for s in t.steps),
                "reset_s": t.reset_s,
                "initial_observation": t.observations[0] if t.observations else None,
                "token_ids": list(t.tokens.token_ids) if t.tokens is not None else [],
                "action_mask": [bool(m) for m in t.tokens.action_mask]
                if t.tokens is not None
                else [],
                "arm": record.arm,
                **({"shadow_stop_step": t.shadow_stop} if shadow else {}),
                **({"audited_stop": t.audited_stop} if audit else {}),
            }
        )
    gate_d_K = (
        record.gate_signals.prefix_edit_distance_mean if record.gate_signals is not None else None
    )
    group_row = {
        "group_id": gid,
        "group_index": spec.index,
        "task_id": task_id,
        "task_type": task_type,
        "G": record.G,
        "reward_mean": sum(rewards) / len(rewards),
        "reward_var": reward_var,
        "label": label,
        "zero_var": zero_var,
        "success_rate": sum(t.success for t in record.trajs) / len(record.trajs),
        "cut": record.cut,
        "cut_step": record.cut_step,
        "gate_K": record.gate_K,
        "gate_d_K": gate_d_K,
        "n_stopped": sum(t.ended_by == "gate" for t in record.trajs),
        "n_stalled": sum(t.stalled for t in record.trajs),
        "arm": record.arm,
        "n_steps": sum(r["n_steps"] for r in traj_rows),
        "n_gen_tokens": sum(r["n_gen_tokens"] for r in traj_rows),
        "n_prompt_tokens": sum(r["n_prompt_tokens"] for r in traj_rows),
        "gen_s": sum(r["gen_s"] for r in traj_rows),
        "env_s": sum(r["env_s"] for r in traj_rows),
        "reset_s": sum(r["reset_s"] for r in traj_rows),
        "wall_s": record.wall_s,
        "started_tick": record.started_tick,
        "finished_tick": record.finished_tick,
    }
    signal_rows = [
        {
            "group_id": gid,
            "task_id": task_id,
            "task_type": task_type,
            "K": k,
            **sig.as_dict(),
            "reward_var": reward_var,
            "label": label,
            "zero_var": zero_var,
            "arm": record.arm,
        }
        for k, sig in sorted(record.signals.items())
    ]
    group_schema = GROUP_SCHEMA
    if audit:
        group_row["audited"], group_schema = record.audited, AUDIT_GROUP_SCHEMA
    elif shadow:
        group_row["shadow_cut_step"], group_schema = record.shadow_cut_step, SHADOW_GROUP_SCHEMA
    traj_schema = SHADOW_TRAJ_SCHEMA if shadow else AUDIT_TRAJ_SCHEMA if audit else TRAJ_SCHEMA
    return GroupTables(
        steps=pl.DataFrame(step_rows, schema=STEP_SCHEMA),
        trajectories=pl.DataFrame(traj_rows, schema=traj_schema),
        groups=pl.DataFrame([group_row], schema=group_schema),
        signals=pl.DataFrame(signal_rows, schema=SIGNAL_SCHEMA),
    )
