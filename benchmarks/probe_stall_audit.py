"""Offline probe (issue 45, item 5): how many training iterations an audit of the trajectory
gate's stops needs before its Clopper–Pearson bound certifies a precision floor.

A run makes hundreds of stops where the group gate made a few cuts. The audit lets a seeded
share of the stops run on to T_max and labels each by its outcome (would it have failed?); the
95 % lower bound on stop precision from those labels must clear the floor before a rule can be
called certified. This replays an ungated buffer in group order as a training run would see it
(``--groups-per-iter`` groups an iteration, the Tier 3 default 10), for each W of the stall rule
at k0 ``--k0``: the stops it makes (the rule on each trajectory's recorded novelty), each audited
with probability ``--share`` (``core.audit.audit_pick``, one draw per trajectory), and reports the
first iteration whose cumulative bound clears each floor (never: the bound stays below it over
the whole buffer), with the audited stops it took and the rule's true precision on the buffer.

    python benchmarks/probe_stall_audit.py runs/results/buffer-500 --share 0.1,0.25,0.5
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from srollout.core.audit import audit_pick, clopper_pearson_lower  # noqa: E402
from srollout.core.stall_sweep import stall_stops  # noqa: E402
from srollout.stages.sweep_stall import load_trajectories  # noqa: E402


def first_certified(
    group: np.ndarray, stop: np.ndarray, success: np.ndarray, share: float, per_iter: int,
    floor: float, seed: int = 0,
) -> tuple[int | None, int]:  # fmt: skip
    """(the first iteration whose bound on the audited stops clears ``floor`` or None, the
    audited stops by then, or over the buffer when never)."""
    right = wrong = 0
    n_iter = int(group.max()) // per_iter + 1
    for it in range(n_iter):
        rows = np.flatnonzero((group // per_iter == it) & (stop > 0))
        for i in rows:
            if audit_pick(seed, int(i), share):  # a seeded draw per trajectory
                right += int(not success[i])
                wrong += int(success[i])
        n = right + wrong
        if n and clopper_pearson_lower(right, n) >= floor:
            return it + 1, n
    return None, right + wrong


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run", type=Path)
    ap.add_argument("--W", default="5,6,7,8,9,10")
    ap.add_argument("--k0", type=int, default=10)
    ap.add_argument("--share", default="0.1,0.25,0.5")
    ap.add_argument("--floors", default="0.85,0.9")
    ap.add_argument("--groups-per-iter", type=int, default=10)
    args = ap.parse_args()
    trajs = load_trajectories(args.run)
    shares = [float(x) for x in args.share.split(",")]
    floors = [float(x) for x in args.floors.split(",")]
    n_iter = int(trajs.group.max()) // args.groups_per_iter + 1
    print(
        f"{args.run}: {len(trajs.group)} trajectories, {n_iter} iterations of "
        f"{args.groups_per_iter} groups; k0 {args.k0}; 95 % Clopper–Pearson lower bound\n"
    )
    head = " | ".join(f"share {s:g}, floor {f:g}" for s in shares for f in floors)
    print(f"| W | stops / iteration | true precision | {head} |")
    print("|---|---|---|" + "---|" * (len(shares) * len(floors)))
    for W in (int(x) for x in args.W.split(",")):
        stop = stall_stops(trajs, W, args.k0)
        stopped = stop > 0
        precision = 1 - (stopped & trajs.success).sum() / stopped.sum()
        cells = []
        for share in shares:
            for floor in floors:
                it, n = first_certified(
                    trajs.group, stop, trajs.success, share, args.groups_per_iter, floor
                )
                cells.append(f"iteration {it} ({n} audited)" if it else f"never ({n} audited)")
        print(
            f"| {W} | {stopped.sum() / n_iter:.1f} | {precision:.3f} | " + " | ".join(cells) + " |"
        )


if __name__ == "__main__":
    main()
