"""One row of metrics.parquet, namespaced the TRL way and built from one small record per namespace.

A row holds ``arm``, ``seed`` and the index (``iteration`` in train-onpolicy, ``step`` in
train-offpolicy), then ``rollout/…``, ``gate/…``, ``train/…`` and ``time/…`` (seconds, the only
columns that differ between two runs of the same seed); each column and its old flat name:
docs/artifacts.md (and :data:`ONPOLICY_RENAMES`, :data:`OFFPOLICY_RENAMES`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields, is_dataclass
from typing import Any

from srollout.rollout.audit import AUDIT_COLUMNS, NO_AUDIT, AuditMetrics  # noqa: F401
from srollout.rollout.stop_audit import NO_STOP_AUDIT, STOP_AUDIT_COLUMNS, StopAuditMetrics  # noqa: F401

# The names before namespacing (old -> new). On-policy rows also held ``step``, always equal to
# ``iteration``: it is dropped. Off-policy's ``n_groups`` counted the groups in the batch.
_SHARED_RENAMES: dict[str, str] = {  # the same in both stages
    "n_cut": "gate/cuts",
    "loss": "train/loss",
    "grad_l2": "train/grad_l2",
    "zero_adv_frac": "train/zero_adv_frac",
    "n_traj": "train/trajectories",
    "n_tokens": "train/action_tokens",
    "mean_logp": "train/mean_logp",
    "stepped": "train/stepped",
    "denominator": "train/denominator",
    "rollout_s": "time/rollout_s",
    "update_s": "time/update_s",
    "sync_s": "time/sync_s",
}
ONPOLICY_RENAMES: dict[str, str] = {
    **_SHARED_RENAMES,
    "n_groups": "rollout/groups",
    "n_env_steps": "rollout/env_steps",
    "n_gen_tokens": "rollout/gen_tokens",
    "train_reward_all": "rollout/reward",
    "rollout_adapter_iteration": "rollout/adapter_iteration",
    "n_kept": "gate/kept",
    "n_zero_var_kept": "gate/zero_var_kept",
    "n_useful": "gate/useful",
    "n_skipped": "gate/skipped",
    "n_rounds": "gate/dapo_rounds",
    "dapo_hit_cap": "gate/dapo_hit_cap",
    "train_reward": "train/reward",
    "iter_s": "time/iter_s",
    "cum_s": "time/cum_s",
    "warmup_s": "time/warmup_s",
    "eval_s": "time/eval_s",
}
OFFPOLICY_RENAMES: dict[str, str] = {
    **_SHARED_RENAMES,
    "n_groups": "gate/kept",
    "n_zero_var": "gate/zero_var_kept",
    "n_items": "train/items",
    "cum_update_s": "time/cum_update_s",
    "cum_rollout_s": "time/cum_rollout_s",
}


# Columns added after the namespacing (no old name), with the value an older row stands for.
ONPOLICY_ADDED: dict[str, Any] = {"gate/stalled": 0}


def upgrade_onpolicy_row(row: Mapping[str, Any]) -> dict[str, Any]:
    """An on-policy metrics row under the current names and in the current column order: a row
    written before the namespacing (a checkpoint of an older run) is renamed, reordered and loses
    its ``step`` (a copy of ``iteration``); a row without a column added since
    (:data:`ONPOLICY_ADDED`) gets it; a current row comes back unchanged."""
    added = dict(ONPOLICY_ADDED)
    if "gate/cut_tp" in row:  # judged before the trajectory gate's stops were
        added.update({"gate/stop_tp": 0, "gate/stop_fp": 0})
    if "gate/audited" in row:  # audited before the trajectory gate's audit
        added.update(NO_STOP_AUDIT.columns())
    if "train/loss" in row and all(k in row for k in added):
        return dict(row)
    renamed = {ONPOLICY_RENAMES.get(k, k): v for k, v in row.items() if k != "step"}
    for name, value in added.items():
        renamed.setdefault(name, value)
    every = [*onpolicy_columns(), *JUDGE_COLUMNS, *AUDIT_COLUMNS, *STOP_AUDIT_COLUMNS]
    order = {name: i for i, name in enumerate(every)}
    return dict(sorted(renamed.items(), key=lambda kv: order.get(kv[0], len(order))))


class _Row:
    """A metrics record whose :meth:`row` is its metrics.parquet row, in field order: the index
    fields as they are, each namespace record as ``<field>/<name>`` columns (a None value, such as
    a transformers run's ``rollout/adapter_iteration``, is not written), a record with its own
    ``columns()`` (judged, audited) as those; a None field writes nothing."""

    def row(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for f in fields(self):  # type: ignore[arg-type]
            value = getattr(self, f.name)
            if hasattr(value, "columns"):
                out.update(value.columns())
            elif is_dataclass(value):
                for part in fields(value):
                    if getattr(value, part.name) is not None:
                        out[f"{f.name}/{part.name}"] = getattr(value, part.name)
            elif value is not None:
                out[f.name] = value
        return out


@dataclass(frozen=True)
class TrainMetrics:
    """``train/…``: one GRPO update (:class:`srollout.training.update.UpdateStats`); each column:
    docs/artifacts.md."""

    loss: float
    grad_l2: float
    zero_adv_frac: float
    trajectories: int
    action_tokens: int
    mean_logp: float
    stepped: bool
    denominator: str

    @staticmethod
    def fields_of(stats: Any, denominator: str) -> dict[str, Any]:
        """The shared fields from an :class:`~srollout.training.update.UpdateStats`."""
        return dict(
            loss=stats.loss,
            grad_l2=stats.grad_l2,
            zero_adv_frac=stats.zero_adv_frac,
            trajectories=stats.n_traj,
            action_tokens=stats.n_tokens,
            mean_logp=stats.mean_logp,
            stepped=stats.stepped,
            denominator=denominator,
        )


# --- train-onpolicy: one row per (arm, seed, iteration) -----------------------------------------


@dataclass(frozen=True)
class RolloutMetrics:
    """``rollout/…`` of one iteration, all DAPO rounds (reward: a cut group's truncated rewards
    included; adapter_iteration: vLLM backends only, else None and not written)."""

    groups: int
    env_steps: int
    gen_tokens: int
    reward: float
    adapter_iteration: int | None = None


@dataclass(frozen=True)
class GateMetrics:
    """``gate/…`` of one iteration: what the gate, GRESO and DAPO did (docs/artifacts.md)."""

    cuts: int
    kept: int
    zero_var_kept: int
    useful: int
    skipped: int
    dapo_rounds: int
    dapo_hit_cap: bool
    stalled: int = 0


@dataclass(frozen=True)
class OnpolicyTrain(TrainMetrics):
    """:class:`TrainMetrics` plus reward: mean trajectory reward of the groups in the batch."""

    reward: float


@dataclass(frozen=True)
class IterationTimes:
    """``time/…`` of one iteration, seconds (iter = rollout + update + sync; cum: iter so far)."""

    rollout_s: float
    update_s: float
    sync_s: float
    iter_s: float
    cum_s: float
    warmup_s: float
    eval_s: float


@dataclass(frozen=True)
class CutJudgement:
    """``--judge-cuts``: the iteration's cut groups (and stops) rolled on to T_max after the timed
    rollout (same weights, same seeds, no gate, untimed), judged by their full outcomes."""

    cut_tp: int
    cut_fp: int
    cut_prefix_matched: int
    judge_s: float
    stop_tp: int = 0
    stop_fp: int = 0

    def columns(self) -> dict[str, Any]:
        return {
            "gate/cut_tp": self.cut_tp,
            "gate/cut_fp": self.cut_fp,
            "gate/cut_prefix_matched": self.cut_prefix_matched,
            "time/judge_s": self.judge_s,
            "gate/stop_tp": self.stop_tp,
            "gate/stop_fp": self.stop_fp,
        }


# written after the other columns, and only by a run with --judge-cuts; stop_tp / stop_fp: the
# trajectory gate's stops judged by their twins in the same roll-on (a right stop: the twin
# failed); rows of runs from before them read 0
JUDGE_COLUMNS = tuple(CutJudgement(0, 0, 0, 0.0).columns())


@dataclass(frozen=True)
class IterationMetrics(_Row):
    """One on-policy iteration of one (seed, arm); :meth:`row` is its metrics.parquet row, its
    keys in :func:`onpolicy_columns` order, then :data:`JUDGE_COLUMNS` when the cuts were judged,
    then :data:`AUDIT_COLUMNS` when the gate was audited."""

    arm: str
    seed: int
    iteration: int
    rollout: RolloutMetrics
    gate: GateMetrics
    train: OnpolicyTrain
    time: IterationTimes
    judged: CutJudgement | None = None
    audited: AuditMetrics | None = None
    stops_audited: StopAuditMetrics | None = None


def onpolicy_columns() -> list[str]:
    """The columns of an on-policy row, in order (``rollout/adapter_iteration``: vLLM only)."""
    parts = (
        ("rollout", RolloutMetrics),
        ("gate", GateMetrics),
        ("train", OnpolicyTrain),
        ("time", IterationTimes),
    )
    namespaced = [f"{ns}/{f.name}" for ns, kind in parts for f in fields(kind)]
    return ["arm", "seed", "iteration", *namespaced]


# --- train-offpolicy: one row per (arm, seed, step) ---------------------------------------------


@dataclass(frozen=True)
class OffpolicyGate:
    """``gate/…`` of one off-policy step: cuts (0 in the baseline arm), kept, zero_var_kept."""

    cuts: int
    kept: int
    zero_var_kept: int


@dataclass(frozen=True)
class OffpolicyTrain(TrainMetrics):
    """:class:`TrainMetrics` plus items: sampled action turns in the batch."""

    items: int


@dataclass(frozen=True)
class StepTimes:
    """``time/…`` of one off-policy step, seconds (rollout: the buffer's measured time of the step's
    groups, a cut group only up to K; sync always 0)."""

    rollout_s: float
    update_s: float
    sync_s: float
    cum_update_s: float
    cum_rollout_s: float


@dataclass(frozen=True)
class StepMetrics(_Row):
    """One off-policy step of one arm; :meth:`row` is its metrics.parquet row."""

    arm: str
    seed: int
    step: int
    gate: OffpolicyGate
    train: OffpolicyTrain
    time: StepTimes
