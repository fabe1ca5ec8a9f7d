"""The loop detector offline (gate kind ``loop``; docs/gates.md, "The loop detector"): for each k0,
its stops on an ungated collect (:func:`srollout.core.stall_sweep.loop_stops` over [N, T]
:class:`~srollout.core.trajectory_signals.LoopCounts`, in
:func:`srollout.stages.sweep_stall.load_trajectories`' order), scored as the stall rule's
(:func:`~srollout.core.stall_sweep.score_stops`). Nothing is fitted, so its stops on every group are
already "held out". ``sweep --stall`` adds these rows to stall.parquet (``rule = "loop"``, W null);
``what-if`` shows one row.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import polars as pl

from srollout.core.stall_sweep import Trajectories, loop_stops, random_reference, score_stops
from srollout.core.trajectory_signals import LoopCounts, loop_counts
from srollout.errors import SrolloutError

KEYS = ("group_id", "traj_idx")
# the columns the loop detector reads, and why
NEEDS = {
    "action": "the pairs it compares",
    "observation": "the pairs it compares",
    "valid": "its rule on rejected actions",
}


def load_loop_counts(run: Path, shape: tuple[int, int], source: str) -> LoopCounts:
    """[N, T] loop counts of the collect in ``run`` (0 past each trajectory's end), trajectories
    in order of (group_id, traj_idx) as :class:`~srollout.core.stall_sweep.Trajectories` holds
    them; ``shape`` is that table's (N, T). A missing column is one SrolloutError naming it."""
    from srollout import schemas

    file = run / "steps.parquet"
    names = schemas.column_names(file)
    missing = [c for c in (*KEYS, "step", *NEEDS) if c not in names]
    if missing:
        why = "; ".join(f"{c}: {NEEDS[c]}" for c in missing if c in NEEDS)
        raise SrolloutError(
            f"{source}: {file} has no column(s) {', '.join(missing)}, which the loop detector "
            f"needs" + (f" ({why})" if why else "")
        )
    steps = schemas.read(file, schemas.STEPS, columns=[*KEYS, "step", *NEEDS])
    per = steps.sort(*KEYS, "step").group_by(list(KEYS), maintain_order=True).agg(pl.col(*NEEDS))
    trajs_file = run / "trajectories.parquet"
    keys = schemas.read(trajs_file, schemas.TRAJECTORIES, columns=list(KEYS)).sort(*KEYS)
    joined = keys.join(per, on=list(KEYS), how="left", maintain_order="left")
    N, T = shape
    if joined.height != N:
        raise SrolloutError(f"{source}: {run} holds {joined.height} trajectories, expected {N}")
    out = np.zeros((3, N, T), dtype=np.int64)
    for i, (actions, observations, valid) in enumerate(joined.select(*NEEDS).iter_rows()):
        if actions:
            n = min(len(actions), T)
            counts = loop_counts(actions[:n], observations[:n], [bool(v) for v in valid[:n]])
            out[:, i, :n] = np.array(counts, dtype=np.int64).T
    return LoopCounts(*out)


def loop_rows(trajs: Trajectories, counts: LoopCounts, k0s: Sequence[int], seed: int) -> list[dict]:
    """One row per k0: the loop detector's stops scored by the full outcomes
    (:class:`~srollout.core.stall_sweep.StopScore`'s fields) and the random reference's
    (``random_*``), with ``rule = "loop"`` and ``W`` None (the stall table's columns)."""
    rows = []
    for k0 in k0s:
        stop = loop_stops(counts, trajs.n_steps, k0)
        score = score_stops(trajs, stop)
        rnd = random_reference(trajs, stop, seed=seed)
        rows.append(
            {
                "rule": "loop",
                "W": None,
                "k0": k0,
                **score._asdict(),
                **{f"random_{k}": v for k, v in rnd._asdict().items()},
            }
        )
    return rows
