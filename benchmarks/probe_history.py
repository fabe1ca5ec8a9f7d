"""Offline probe (issue 35, item 4): does GRESO's per-task history help the gate?

On a collected buffer (no gate, groups in collection order, tasks repeating), each group gets the
history GRESO would have of its task when the group starts: how many earlier groups of the task
there were and the share of them that ended zero-variance (and all-fail). Then, at K:

- AUROC of the history alone for zero-variance and for all-fail (groups with a history);
- a logistic model (srollout's `fit_logistic`, standardised, NaN imputed with the training mean),
  cross-fitted over groups (5 folds), on (a) the nine signals at K, (b) the history alone,
  (c) both; its threshold chosen on the held-out scores by measured saving at precision >= the
  floor (as `probe_failure.py`: slightly optimistic). Measured saving = the steps the cut groups'
  trajectories would still have taken after K, over all steps.

The buffer is one policy, so the history here is as good as it can be; on-policy, a task's
history is of older weights (GRESO discounts it by skipping with a probability).

    python benchmarks/probe_history.py runs/results/buffer-500-logprob --K 10
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))


def task_history(task_ids: list[str], positive: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per group, in order: the number of earlier groups of its task and their share of
    ``positive`` (nan with none)."""
    seen: dict[str, list[bool]] = {}
    n, share = np.zeros(len(task_ids)), np.full(len(task_ids), np.nan)
    for i, (t, p) in enumerate(zip(task_ids, positive, strict=True)):
        past = seen.setdefault(t, [])
        n[i] = len(past)
        if past:
            share[i] = float(np.mean(past))
        past.append(bool(p))
    return n, share


def cross_fit(X: np.ndarray, y: np.ndarray, folds: np.ndarray) -> np.ndarray:
    """Held-out P(y) per row: standardise on the training folds (nan imputed with their mean),
    then srollout's L2 logistic fit."""
    from srollout.core.learned_gate import fit_logistic

    out = np.full(y.size, np.nan)
    for f in np.unique(folds):
        tr, te = folds != f, folds == f
        mu = np.nanmean(X[tr], axis=0)
        sd = np.nanstd(X[tr], axis=0)
        sd = np.where(sd > 1e-12, sd, 1.0)

        def z(a: np.ndarray, mu: np.ndarray = mu, sd: np.ndarray = sd) -> np.ndarray:
            return (np.where(np.isnan(a), mu, a) - mu) / sd

        fit = fit_logistic(z(X[tr]), y[tr])
        out[te] = 1.0 / (1.0 + np.exp(-(z(X[te]) @ np.asarray(fit.coef) + fit.intercept)))
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("run", type=Path)
    ap.add_argument("--K", type=int, default=10)
    ap.add_argument("--floor", type=float, default=0.9)
    args = ap.parse_args()
    from probe_failure import best_cut, load_buffer

    from srollout.core.learned_gate import assign_folds
    from srollout.core.stats import auroc
    from srollout.schemas import SIGNAL_NAMES, STEP_SIGNAL_NAMES

    names = [*SIGNAL_NAMES, *STEP_SIGNAL_NAMES]
    buf = load_buffer(args.run, args.K, names)
    groups, S = buf.groups, buf.signals
    zv = groups["zero_var"].to_numpy().astype(bool)
    all_fail = (groups["label"] == "all_fail").to_numpy()
    tasks = groups["task_id"].to_list()
    n_past, zv_share = task_history(tasks, zv)
    _, af_share = task_history(tasks, all_fail)
    H = np.column_stack([n_past, zv_share, af_share])
    has = n_past > 0
    rem, total = buf.remaining, buf.total
    oracle = rem[zv].sum() / total
    print(
        f"{args.run}: {len(tasks)} groups, {len(set(tasks))} tasks, {int(has.sum())} with a "
        f"history; K {args.K}; floor {args.floor}; oracle's measured saving "
        f"{100 * oracle:.1f} % of all steps\n"
    )
    print(
        f"history alone, AUROC (groups with one): zero-variance "
        f"{auroc(zv_share[has], zv[has]):.3f}; all-fail {auroc(af_share[has], all_fail[has]):.3f}"
    )
    folds = assign_folds(zv, 5, seed=0)
    print("\n| features | cut | precision | measured saving | share of the oracle |")
    print("|---|---|---|---|---|")
    for label, X in (
        (f"nine signals at K {args.K}", S),
        ("task history alone (3)", H),
        ("nine signals + task history", np.column_stack([S, H])),
    ):
        score = cross_fit(X, zv.astype(float), folds)
        cut = best_cut(score, zv, rem, args.floor)
        saved = rem[cut].sum() / total
        prec = zv[cut].mean() if cut.any() else float("nan")
        print(
            f"| {label} | {int(cut.sum())} | {prec:.3f} | {100 * saved:.2f} % | "
            f"{100 * saved / oracle:.1f} % |"
        )


if __name__ == "__main__":
    main()
