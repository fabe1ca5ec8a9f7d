"""Offline probe (issue 35): where a cut's measured saving lies, and whether the signals at K,
the policy's own log-probs included, can find the groups that hold it.

On a collected buffer (no gate) with the step signals (`collect` after 2026-11-27):

- the oracle's measured saving (every zero-variance group cut at K; saving = the real environment
  steps its trajectories would still have taken after K, over all real steps), split into
  all-fail and all-succeed groups;
- AUROC of each signal at K for all-fail vs the rest and zero-variance vs the rest (0.5 = no
  information; below 0.5: lower values mean the positive class);
- a logistic model on the seven classic signals, then on all nine, cross-fitted over groups
  (5 folds), its threshold chosen on the held-out scores by MEASURED saving at precision >= the
  floor: the share of the oracle's measured saving it captures, and from which groups. The
  threshold is chosen on the same held-out scores it is scored on (slightly optimistic; the
  sweep's nested protocol is the strict one).

    python benchmarks/probe_failure.py runs/results/buffer-500-logprob --K 10,15,20
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple

import numpy as np
import polars as pl

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


class Buffer(NamedTuple):
    """A collected buffer read for a probe: groups in run order (``group_index``), trajectories,
    the named signals at K as an [n, len(names)] array in that order (nan: no signal), the steps
    each group would still take after K, and all the buffer's steps."""

    groups: pl.DataFrame
    trajs: pl.DataFrame
    signals: np.ndarray
    remaining: np.ndarray
    total: float


def load_buffer(run: Path, K: int, names: Sequence[str]) -> Buffer:
    """``run``'s groups/trajectories/signals tables, the signals ``names`` at ``K`` joined in
    group order (what probe_audit and probe_history read)."""
    groups = pl.read_parquet(run / "groups.parquet").sort("group_index")
    trajs = pl.read_parquet(run / "trajectories.parquet")
    sig = pl.read_parquet(run / "signals.parquet").filter(pl.col("K") == K)
    order = groups["group_id"]
    S = (
        pl.DataFrame({"group_id": order})
        .join(sig.select("group_id", *names), on="group_id", how="left")
        .select(names)
        .to_numpy()
        .astype(float)
    )
    return Buffer(groups, trajs, S, remaining_steps(trajs, K, order), float(trajs["n_steps"].sum()))


def remaining_steps(trajs: pl.DataFrame, K: int, order: pl.Series) -> np.ndarray:
    """Per group of ``order``: the steps its trajectories took after K (what a cut at K saves)."""
    rem = trajs.group_by("group_id").agg((pl.col("n_steps") - K).clip(lower_bound=0).sum())
    joined = pl.DataFrame({"group_id": order}).join(rem, on="group_id", how="left")
    return joined["n_steps"].to_numpy().astype(float)


def cross_fit_scores(X: np.ndarray, K: int, y: np.ndarray, folds: np.ndarray) -> np.ndarray:
    """Held-out P(y) per row from srollout's learned-gate model (standardised logistic, NaN
    imputed with the training mean) fit on the other folds."""
    from srollout.core.learned_gate import LogisticModel, feature_matrix

    F = feature_matrix(X, K)
    out = np.full(y.size, np.nan)
    for f in np.unique(folds):
        tr, te = folds != f, folds == f
        out[te] = LogisticModel.fit(F[tr], y[tr]).proba(F[te])
    return out


def best_cut(score: np.ndarray, positive: np.ndarray, gain: np.ndarray, floor: float):
    """Cut iff score >= t: the t with the largest Σ gain over ALL cut groups whose precision
    (positives / cut) >= floor; returns the cut mask (nothing when no t clears the floor)."""
    order = np.argsort(-score, kind="stable")
    s, pos, g = score[order], positive[order], gain[order]
    prec = np.cumsum(pos) / np.arange(1, s.size + 1)
    value = np.cumsum(g)
    last = np.r_[s[1:] != s[:-1], True]
    ok = last & (prec >= floor - 1e-12)
    cut = np.zeros(score.size, dtype=bool)
    if ok.any():
        j = np.flatnonzero(ok)[np.argmax(value[ok])]
        cut[order[: j + 1]] = True
    return cut


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("run", type=Path)
    ap.add_argument("--K", default="10,15,20")
    ap.add_argument("--floor", type=float, default=0.9)
    args = ap.parse_args()
    from srollout.core.learned_gate import assign_folds
    from srollout.core.stats import auroc
    from srollout.schemas import SIGNAL_NAMES, STEP_SIGNAL_NAMES

    groups = pl.read_parquet(args.run / "groups.parquet").sort("group_id")
    trajs = pl.read_parquet(args.run / "trajectories.parquet")
    signals = pl.read_parquet(args.run / "signals.parquet")
    label = groups["label"].to_numpy()
    zv, fail, win = groups["zero_var"].to_numpy(), label == "all_fail", label == "all_succeed"
    total = float(trajs["n_steps"].sum())
    print(
        f"{args.run}: {groups.height} groups, all-fail {fail.sum()}, all-succeed {win.sum()}, "
        f"mixed {(label == 'mixed').sum()}; {total:.0f} environment steps\n"
    )
    for K in (int(k) for k in args.K.split(",")):
        rem = remaining_steps(trajs, K, groups["group_id"])
        sig = signals.filter(pl.col("K") == K).sort("group_id")
        assert sig["group_id"].to_list() == groups["group_id"].to_list()
        oracle = rem[zv].sum() / total
        print(
            f"## K = {K}: oracle measured saving {100 * oracle:.1f} % of all steps "
            f"(all-fail {100 * rem[fail].sum() / total:.1f} %, "
            f"all-succeed {100 * rem[win].sum() / total:.1f} %)"
        )
        print("| signal | AUROC all-fail vs rest | AUROC zero-variance vs rest | n |")
        print("|---|---|---|---|")
        for name in SIGNAL_NAMES + STEP_SIGNAL_NAMES:
            x = sig[name].to_numpy().astype(float)
            ok = np.isfinite(x)
            print(
                f"| {name} | {auroc(x[ok], fail[ok]):.3f} | {auroc(x[ok], zv[ok]):.3f} | "
                f"{ok.sum()} |"
            )
        print(
            "\n| features | target | cut | precision | all-fail / all-succeed / mixed cut "
            "| measured saving | share of oracle |"
        )
        print("|---|---|---|---|---|---|---|")
        for feats, fname in (
            (SIGNAL_NAMES, "classic 7"),
            (SIGNAL_NAMES + STEP_SIGNAL_NAMES, "all 9"),
        ):
            X = sig.select(feats).to_numpy().astype(float)
            keep = np.isfinite(X).all(1)
            for target, tname in ((zv, "zero-variance"), (fail, "all-fail")):
                score = cross_fit_scores(X, K, target.astype(float), assign_folds(target, 5, 0))
                score[~keep] = -np.inf
                cut = best_cut(score, zv, rem, args.floor)  # a right cut: zero-variance
                saved = rem[cut].sum() / total
                prec = zv[cut].mean() if cut.any() else float("nan")
                print(
                    f"| {fname} | {tname} | {cut.sum()} | {prec:.3f} | {(cut & fail).sum()} / "
                    f"{(cut & win).sum()} / {(cut & ~zv).sum()} | {100 * saved:.2f} % | "
                    f"{100 * saved / oracle:.1f} % |"
                )
        print()


if __name__ == "__main__":
    main()
