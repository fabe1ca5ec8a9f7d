"""Offline probe of the audited gate (issue 35): replay a collected buffer's groups, in order, as
the iterations of a run, and let `srollout.core.audit` move R1's d_L as `train-onpolicy --audit`
would. The policy does not change here (a buffer is one policy), so this shows where the audit
settles and what it costs on that policy, not how it tracks drift (tests/unit/test_audit.py does).

Per iteration of B groups: cut iff d_K < θ; each cut is audited with probability F (the same
seeded draw as training); audited cuts are labelled by their full outcome, uncut groups by their
own. Economics, in environment steps: a cut saves the steps its trajectories would still have
taken after K; an audited cut runs on to the end (as `train-onpolicy --audit` does), so it saves
nothing: the audit costs the saving it forgoes; net = what the unaudited cuts save.

    python benchmarks/probe_audit.py runs/results/buffer-500-logprob --K 10 --d-L 0.12

``--d-L 0`` replays the evidence-first start: the gate cuts nothing until the groups it let
through certify a band of d_K (core.audit's loosen move), as ``--d-L 0 --audit F`` runs.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def replay(d, zv, rem, total, *, theta0, fraction, floor, batch, seed=7):
    """The audited (fraction > 0) or fixed (fraction = 0) gate over the groups in order."""
    from srollout.core.audit import AuditLedger, Labelled, audit_pick, next_threshold

    ledger, theta = AuditLedger(), theta0
    cut_all = np.zeros(d.size, dtype=bool)
    audited = np.zeros(d.size, dtype=bool)
    thetas, first_cut = [], None
    for it, start in enumerate(range(0, d.size, batch), start=1):
        idx = np.arange(start, min(start + batch, d.size))
        thetas.append(theta)
        cut = d[idx] < theta
        cut_all[idx] = cut
        first_cut = it if first_cut is None and cut.any() else first_cut
        rows = []
        for i, c in zip(idx, cut, strict=True):
            if not np.isfinite(d[i]):
                continue
            if c and fraction > 0 and audit_pick(seed, int(i), fraction):
                audited[i] = True
                rows.append(Labelled(it, float(d[i]), bool(zv[i]), "audit"))
            elif not c:
                rows.append(Labelled(it, float(d[i]), bool(zv[i]), "through"))
        if fraction > 0:
            ledger.add(rows)
            theta = next_threshold(theta, ledger.recent(it), floor=floor).threshold
    n = cut_all.sum()
    return {
        "cut": int(n),
        "precision": float(zv[cut_all].mean()) if n else float("nan"),
        "audited": int(audited.sum()),
        "saved %": 100 * rem[cut_all].sum() / total,
        "audit cost %": 100 * rem[audited].sum() / total,
        "net %": 100 * rem[cut_all & ~audited].sum() / total,
        "last d_L": thetas[-1],
        "first cut": "-" if first_cut is None else str(first_cut),
        "d_L path": " ".join(f"{t:.3f}" for t in thetas[:: max(1, len(thetas) // 8)]),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("run", type=Path)
    ap.add_argument("--K", type=int, default=10)
    ap.add_argument("--d-L", dest="d_L", type=float, default=0.12)
    ap.add_argument("--batch", type=int, default=8, help="groups per iteration")
    ap.add_argument("--floor", type=float, default=0.85)
    args = ap.parse_args()
    from probe_failure import load_buffer  # benchmarks/ is on the path of a script here

    buf = load_buffer(args.run, args.K, ["prefix_edit_distance_mean"])
    groups, d, rem, total = buf.groups, buf.signals[:, 0], buf.remaining, buf.total
    zv = groups["zero_var"].to_numpy()
    print(
        f"{args.run}: {d.size} groups in order, {args.batch} an iteration, R1 at K {args.K}, "
        f"start d_L {args.d_L}, floor {args.floor}\n"
    )
    print(
        "| gate | cut | precision (all cuts, full outcome) | audited | cuts' saving | audit cost | "
        "net saving | first cut (iteration) | last d_L | d_L along the run |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for label, fraction in (
        ("fixed", 0.0),
        ("audited F=0.25", 0.25),
        ("audited F=0.5", 0.5),
        ("audited F=1", 1.0),
    ):
        r = replay(
            d,
            zv,
            rem,
            total,
            theta0=args.d_L,
            fraction=fraction,
            floor=args.floor,
            batch=args.batch,
        )
        print(
            f"| {label} | {r['cut']} | {r['precision']:.3f} | {r['audited']} | "
            f"{r['saved %']:.2f} % | {r['audit cost %']:.2f} % | {r['net %']:.2f} % | "
            f"{r['first cut']} | {r['last d_L']:.3f} | {r['d_L path']} |"
        )


if __name__ == "__main__":
    main()
