"""Prototype an agreement signal on a real collect before you register it.

An agreement signal is one function of a group at step K: a
:class:`srollout.core.signals.GroupAtK` (the G END-padded K-prefixes, the distinct ones and how
many trajectories share each, the actions a_K and observations o_K at step K), computed once per
group and handed to every signal. This script writes one, ``shared_opening`` (the share of the
first K steps that all G trajectories took alike: 1 when their prefixes are identical), computes
it beside the registered signals on every group of a collect, and prints how well each tells the
zero-variance groups (the ones the gate should cut) from the rest, as ``srollout analyze`` does.

    python examples/your_own_signal.py RUN_DIR [--K 10]       # a collect you already have
    python examples/your_own_signal.py --groups 24 [--K 6]     # collects one first (planner)

To make it a signal of srollout (docs/extending.md, "A signal"): its function in
``srollout/core/signals.py``, its entry in ``AGREEMENT_SIGNALS``, its name and unit in
``srollout/signal_names.py``, and its test; the engine, the signals table, ``analyze``, ``sweep``
and the gates then read it by name.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from srollout.core.signals import AGREEMENT_SIGNALS, GroupAtK, group_at_K
from srollout.core.stats import rank_stats


def shared_opening(g: GroupAtK) -> float:
    """Share of the first K steps every trajectory of the group took alike (1: one prefix)."""
    alike = 0
    for column in zip(*g.distinct, strict=True):  # step t of every distinct prefix
        if len(set(column)) > 1:
            break
        alike += 1
    return alike / g.K


def collect(groups: int, K: int, out: Path) -> Path:
    """An ungated collect of the noisy planner on the real ALFWorld engine (seconds)."""
    srollout = Path(sys.executable).with_name("srollout")
    T_max = max(12, K + 4)
    subprocess.run(
        [str(srollout), "collect", "--policy", "noisy-expert", "--groups", str(groups)]
        + ["--G", "4", "--T-max", str(T_max), "--signal-K", str(K), "--out", str(out)],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("run", nargs="?", type=Path, help="a collect's run directory")
    ap.add_argument("--K", type=int, default=10, help="the step the signals look at")
    ap.add_argument("--groups", type=int, default=24, help="groups to collect without RUN")
    args = ap.parse_args()

    from srollout.stages.buffer import load_buffer

    with tempfile.TemporaryDirectory() as tmp:
        run = args.run or collect(args.groups, args.K, Path(tmp) / "collect")
        buffer = load_buffer(run, K=[args.K], default_K=[args.K])
    if buffer.trajectories is None:
        sys.exit(f"{run}: no steps.parquet: the signals need the trajectories themselves")
    per_group = (
        buffer.trajectories.sort(["group_id", "traj_idx"])
        .group_by("group_id", maintain_order=True)
        .agg("actions", "observations")
        .join(buffer.groups.select("group_id", "reward_var", "zero_var"), on="group_id")
    )
    values: dict[str, list[float]] = {name: [] for name in (*AGREEMENT_SIGNALS, "shared_opening")}
    for actions, observations in per_group.select("actions", "observations").iter_rows():
        g = group_at_K(actions, args.K, observations)
        for name, fn in AGREEMENT_SIGNALS.items():
            values[name].append(fn(g))
        values["shared_opening"].append(shared_opening(g))

    reward_var = per_group["reward_var"].to_numpy()
    zero_var = per_group["zero_var"].to_numpy()
    print(f"{per_group.height} groups at K = {args.K}, {int(zero_var.sum())} zero-variance")
    print(f"{'signal':<28} {'mean':>6} {'Spearman rho':>13} {'AUROC':>6}")
    for name, v in values.items():
        stats = rank_stats(np.asarray(v, dtype=float), reward_var, zero_var)
        print(f"{name:<28} {np.nanmean(v):6.3f} {stats.rho:13.3f} {stats.auroc:6.3f}")
    print(
        "AUROC: the chance that a zero-variance group scores above a group with signal; "
        "below 0.5 the signal is high where the group has signal (d_K: agreeing groups score low)"
    )


if __name__ == "__main__":
    main()
