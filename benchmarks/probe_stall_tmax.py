"""Offline probe (issue 45): the stall rule on an ungated buffer cut to a shorter horizon.

Tier 3 trains with T_max 20 while the 500-group buffer was collected with T_max 30. A trajectory
of the buffer cut at ``--T-max`` steps is what the same policy would have played with that
horizon (the engine's seeds do not depend on T_max): it succeeded iff it won within the horizon,
and its stall counts are the same up to there. For each (W, k0) this scores the rule on the cut
buffer as ``sweep --stall`` does: stops, precision of "stopped => would have failed", the share
of all steps and generated tokens after the stops, and the groups the stops turn zero-variance
or mixed.

    python benchmarks/probe_stall_tmax.py runs/results/buffer-500 --T-max 20
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from srollout.core.stall_sweep import Trajectories, score_stops, stall_stops  # noqa: E402
from srollout.stages.sweep_stall import load_trajectories  # noqa: E402


def cut_to(trajs: Trajectories, T: int) -> Trajectories:
    """The trajectories as a horizon of ``T`` steps would have ended them."""
    return Trajectories(
        trajs.group,
        np.minimum(trajs.n_steps, T),
        trajs.success & (trajs.n_steps <= T),
        trajs.since_new[:, :T],
        trajs.step_reward[:, :T],
        trajs.step_tokens[:, :T],
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run", type=Path)
    ap.add_argument("--T-max", type=int, default=20)
    ap.add_argument("--W", default="2,3,4,5,6,8")
    ap.add_argument("--k0", default="3,5,10")
    args = ap.parse_args()
    trajs = cut_to(load_trajectories(args.run), args.T_max)
    print(
        f"{args.run} cut to T_max {args.T_max}: {len(trajs.group)} trajectories, success "
        f"{trajs.success.mean():.3f}, {int(trajs.n_steps.sum())} steps\n"
    )
    print("| k0 | W | stops | precision | steps saved | tokens saved | to zero-var | to mixed |")
    print("|---|---|---|---|---|---|---|---|")
    for k0 in (int(x) for x in args.k0.split(",")):
        for W in (int(x) for x in args.W.split(",")):
            s = score_stops(trajs, stall_stops(trajs, W, k0))
            print(
                f"| {k0} | {W} | {s.n_stops} | {s.precision:.3f} | {s.step_savings:.1%} | "
                f"{s.token_savings:.1%} | {s.to_zero_var} | {s.to_mixed} |"
            )


if __name__ == "__main__":
    main()
