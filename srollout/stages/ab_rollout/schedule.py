"""The A/B's schedule: which arm rolls which groups when, and where each timed run is kept.

R repeats × B blocks of tasks; in each block every arm rolls the block's groups, arms in ABBA
order over blocks (A B | B A | ...), so machine drift favours no arm. Pure bookkeeping: no
engine, no clock.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, NamedTuple

from srollout.config import AbRolloutConfig
from srollout.core.arms import ArmSpec
from srollout.rollout.engine import GroupSpec, make_specs


class Block(NamedTuple):
    """One timed run: ``arm`` rolls ``specs`` (block ``block`` of repeat ``repeat``); ``order`` is
    its 0-based position in the whole schedule."""

    order: int
    repeat: int
    block: int
    arm: ArmSpec
    specs: tuple[GroupSpec, ...]


def split_blocks(specs: Sequence[GroupSpec], n_blocks: int) -> list[tuple[GroupSpec, ...]]:
    """``specs`` cut into ``n_blocks`` contiguous chunks whose sizes differ by at most one."""
    n = len(specs)
    bounds = [round(i * n / n_blocks) for i in range(n_blocks + 1)]
    return [tuple(specs[bounds[i] : bounds[i + 1]]) for i in range(n_blocks)]


def make_schedule(
    arms: Sequence[ArmSpec], specs: Sequence[GroupSpec], repeats: int, n_blocks: int
) -> list[Block]:
    """Every (repeat, block, arm) run in order: arms forward on even slots, reversed on odd ones
    (slot = repeat · B + block), so with 2 arms the runs go A B | B A | A B | ... (ABBA)."""
    out: list[Block] = []
    for r in range(repeats):
        for b, chunk in enumerate(split_blocks(specs, n_blocks)):
            for arm in arms if (r * n_blocks + b) % 2 == 0 else tuple(reversed(arms)):
                out.append(Block(len(out), r, b, arm, chunk))
    return out


def arm_dir(run_dir: Path, arm: str, repeat: int) -> Path:
    """Where the tables of one (arm, repeat) live: ``<run>/<arm>/r<repeat>/``."""
    return Path(run_dir) / arm / f"r{repeat}"


def block_file(run_dir: Path, block: Block) -> Path:
    return arm_dir(run_dir, block.arm.name, block.repeat) / f"block-{block.block}.json"


def extra_start(config: AbRolloutConfig, block: Block) -> int:
    """First group index of DAPO's extra groups in ``block``.

    A block whose tasks start at group index s owns the indices
    groups + R·s .. groups + R·(s + n) − 1 (n tasks, R = --dapo-max-rounds): room for every extra
    group its rounds can ask for (each round asks for at most n). So a block's extra groups —
    their tasks (group i plays task i mod the set's size) and seeds — depend neither on other
    blocks nor on the arm: ``dapo`` and ``gated+dapo`` draw from the same sequence."""
    return config.groups + config.dapo_max_rounds * block.specs[0].index


def warm_tasks(
    config: AbRolloutConfig,
    arms: Sequence[ArmSpec],
    specs: Sequence[GroupSpec],
    tasks: Sequence[Any],
) -> list[Any]:
    """The tasks whose games the warm-up loads: the A/B's, and with a DAPO arm every task its
    extra rounds may reach (so extra rounds do not pay first loads the other arms never pay)."""
    out = {s.task.task_id: s.task for s in specs}
    if any(a.dapo for a in arms):
        for s in make_specs(tasks, config.groups * (1 + config.dapo_max_rounds), config.groups):
            out.setdefault(s.task.task_id, s.task)
    return list(out.values())
