"""Dynamic sampling inside one TRL ``rollout_func`` call: DAPO's filter and refill
(:func:`srollout.core.arms.dapo_fill`) and GRESO's skip (a :class:`srollout.core.arms.Skipper`),
composed with the gates (:class:`srollout.integrations.trl.GatedRollout`). What a slot then holds
and what TRL logs: docs/integrations.md, "Dynamic sampling in TRL"."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from srollout.core.arms import (
    Skipper,
    dapo_fill,
    extra_round_tasks,
    greso_filter,
    greso_outcomes,
    record_outcomes,
)
from srollout.envs.base import Task
from srollout.errors import SrolloutError
from srollout.rollout.engine import GroupRecord, GroupSpec


@dataclass(frozen=True)
class SampledBatch:
    """What one call gathered: one group per block of G rows in the batch's order (None: a GRESO
    skip or a slot DAPO could not refill), every group rolled out (discarded ones included), refill
    groups beyond the first round, rounds run (1 + extra), tasks skipped and slots left unfilled."""

    slots: tuple[GroupRecord | None, ...]
    generated: tuple[GroupRecord, ...]
    extra_groups: int
    rounds: int
    skipped: int
    unfilled: int


def check_sampling(rollout: Any) -> None:
    """(``rollout``: a :class:`~srollout.integrations.trl.GatedRollout`, read for its settings.)
    One line for a setting dynamic sampling cannot work with."""
    if rollout.dynamic_sampling:
        if rollout.G < 2:
            raise SrolloutError(
                f"dynamic sampling keeps groups whose rewards differ; with G={rollout.G} a group "
                "never has reward variance, so no batch can be filled: use G >= 2"
            )
        if rollout.max_refill_rounds < 1:
            raise SrolloutError(
                f"dynamic sampling needs max_refill_rounds >= 1, got {rollout.max_refill_rounds}"
            )
    if rollout.greso_p is not None and not 0.0 <= rollout.greso_p <= 1.0:
        raise SrolloutError(f"greso_p must lie in [0, 1], got {rollout.greso_p}")


def check_pool(rollout: Any, tasks: Sequence[Task]) -> None:
    """The refill draws tasks outside the batch: refuse a batch that uses the whole task set."""
    if rollout.dynamic_sampling and len({t.task_id for t in tasks}) >= len(rollout.tasks):
        raise SrolloutError(
            f"dynamic sampling cannot fill this batch: it refills from tasks outside the batch, "
            f"and each generation batch of {len(tasks)} groups already uses all "
            f"{len(rollout.tasks)} tasks of the rollout's task set; give GatedRollout more tasks "
            "(n_tasks) or make the batch smaller (per_device_train_batch_size / num_generations)"
        )


def sample_batch(
    rollout: Any,
    tasks: Sequence[Task],
    roll: Callable[[list[GroupSpec]], list[GroupRecord]],
    call: int,
    skipper: Skipper | None,
    dynamic: bool | None = None,
) -> SampledBatch:
    """Fill the ``len(tasks)`` slots of training call ``call`` (1, 2, ...): GRESO's skip, the
    rollouts (``roll(specs)``, records in spec order) and DAPO's refill (``dynamic``, default
    ``rollout.dynamic_sampling``; neither: one group per slot). Group indices (so seeds) are
    ``rollout._next_group`` onward: one per slot, then one per refill group."""
    dynamic = rollout.dynamic_sampling if dynamic is None else dynamic
    if dynamic:
        check_pool(rollout, tasks)
    first = rollout._next_group
    specs = [GroupSpec(index=first + i, task=t) for i, t in enumerate(tasks)]
    rollout._next_group += len(specs)
    keep = list(range(len(specs)))
    if skipper is not None:
        keep, _ = greso_filter(skipper, [s.task.task_id for s in specs], call)
    skipped = len(specs) - len(keep)
    slots: list[GroupRecord | None]
    if dynamic:
        index = {t.task_id: i for i, t in enumerate(rollout.tasks)}
        used = {index[t.task_id] for t in tasks}

        def sample_round(n_needed: int, r: int) -> list[GroupRecord]:
            if r == 0 and keep:
                return roll([specs[k] for k in keep])
            extra = extra_round_tasks(len(rollout.tasks), used, call, r, n_needed, rollout.seed)
            used.update(extra)
            more = [
                GroupSpec(index=rollout._next_group + j, task=rollout.tasks[i])
                for j, i in enumerate(extra)
            ]
            rollout._next_group += len(more)
            return roll(more) if more else []

        filled = dapo_fill(len(specs), sample_round, rollout.max_refill_rounds)
        generated = list(filled.generated)
        slots = [*filled.useful, *[None] * (len(specs) - len(filled.useful))]
        extra = len(generated) - len(keep)  # round 0 rolls the kept slots, one group each
        rounds = filled.n_rounds
    else:
        generated = roll([specs[k] for k in keep]) if keep else []
        by_slot = dict(zip(keep, generated, strict=True))
        slots = [by_slot.get(i) for i in range(len(specs))]
        extra, rounds = 0, 1
    if skipper is not None:
        record_outcomes(skipper, call, greso_outcomes(generated))
    unfilled = sum(s is None for s in slots) - (0 if dynamic else skipped)
    return SampledBatch(tuple(slots), tuple(generated), extra, rounds, skipped, unfilled)
