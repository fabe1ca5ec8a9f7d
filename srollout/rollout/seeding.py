"""Per-trajectory seeds derived from (run seed, group index, traj_idx), never from scheduling.

A gated and an ungated run with the same run seed give every trajectory the same sampling seed
and the same environment seed, whichever groups happen to share a batch with it, so the two runs
produce identical trajectories up to step K, and a resumed run reproduces an uninterrupted one.
"""

from __future__ import annotations

import hashlib
from typing import NamedTuple

# Seeds stay below 2**31 so every backend accepts them (torch, numpy, vLLM's int seed).
_SEED_BITS = 31


class TrajSeeds(NamedTuple):
    """sample: the policy's sampling seed; env: the environment's reset seed."""

    sample: int
    env: int


def _derive(run_seed: int, group_index: int, traj_idx: int, stream: str) -> int:
    # A hash, not arithmetic: (seed, group, traj) triples never collide by accident
    # (seed=1, group=0 and seed=0, group=1 differ) and streams are independent.
    digest = hashlib.blake2b(
        f"srollout/{stream}/{run_seed}/{group_index}/{traj_idx}".encode(), digest_size=8
    ).digest()
    return int.from_bytes(digest, "little") % (1 << _SEED_BITS)


def traj_seeds(run_seed: int, group_index: int, traj_idx: int) -> TrajSeeds:
    """The seeds of trajectory ``traj_idx`` of the group at position ``group_index`` of the run.

    run_seed: the run's ``--seed``; group_index: 0-based position of the group in the run's task
    list (the same index in both arms of an A/B); traj_idx: 0..G-1. Returns ints in [0, 2**31).
    """
    if group_index < 0 or traj_idx < 0:
        raise ValueError(f"group_index and traj_idx must be >= 0, got {group_index}, {traj_idx}")
    return TrajSeeds(
        sample=_derive(run_seed, group_index, traj_idx, "sample"),
        env=_derive(run_seed, group_index, traj_idx, "env"),
    )
