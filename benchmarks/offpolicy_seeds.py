"""Tier 2 over seeds: mean ± sample std of several `srollout train-offpolicy` runs.

    python benchmarks/offpolicy_seeds.py RUN [RUN ...]

Each RUN is a finished train-offpolicy directory (one seed). Prints one markdown table: per seed,
then mean ± std over seeds, of the training-step wall-clock and its saving, the rollout and
end-to-end savings the buffer's measurements give, items, cuts (and how many were zero-variance),
gradient L2 and its ratio beside the dilution prediction, and the loss (last step; mean of all
steps) per arm.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def seed_row(run: Path) -> dict[str, float]:
    import polars as pl

    summary = json.loads((run / "summary.json").read_text())
    seed = json.loads((run / "manifest.json").read_text())["config"]["seed"]
    metrics = pl.read_parquet(run / "metrics.parquet")
    row: dict[str, float] = {"seed": seed}
    for arm in ("baseline", "gated"):
        m = metrics.filter(pl.col("arm") == arm).sort("step")
        row[f"update_s_{arm}"] = float(m["time/update_s"].sum())
        row[f"loss_last_{arm}"] = float(m["train/loss"][-1])
        row[f"loss_mean_{arm}"] = float(m["train/loss"].mean())
    row["train_saving"] = 1 - row["update_s_gated"] / row["update_s_baseline"]
    for key in (
        "rollout_saving",
        "end_to_end_saving",
        "items_baseline",
        "items_gated",
        "groups_cut",
        "cut_zero_var",
        "grad_l2_baseline",
        "grad_l2_gated",
        "grad_l2_ratio",
        "dilution_prediction",
    ):
        row[key] = float(summary[key])
    return row


QUANTITIES = (
    ("training-step wall-clock, baseline (s)", "update_s_baseline", 1, 1),
    ("training-step wall-clock, gated (s)", "update_s_gated", 1, 1),
    ("training-step saving (%)", "train_saving", 100, 1),
    ("rollout saving, from the buffer (%)", "rollout_saving", 100, 1),
    ("end-to-end saving (%)", "end_to_end_saving", 100, 1),
    ("train items, baseline", "items_baseline", 1, 0),
    ("train items, gated", "items_gated", 1, 0),
    ("groups cut (of 80)", "groups_cut", 1, 1),
    ("of them zero-variance", "cut_zero_var", 1, 1),
    ("gradient L2 mean, baseline", "grad_l2_baseline", 1, 3),
    ("gradient L2 mean, gated", "grad_l2_gated", 1, 3),
    ("gradient L2 ratio", "grad_l2_ratio", 1, 3),
    ("dilution prediction", "dilution_prediction", 1, 3),
    ("loss at the last step, baseline", "loss_last_baseline", 1, 3),
    ("loss at the last step, gated", "loss_last_gated", 1, 3),
    ("loss, mean of all steps, baseline", "loss_mean_baseline", 1, 3),
    ("loss, mean of all steps, gated", "loss_mean_gated", 1, 3),
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", type=Path, nargs="+", help="finished train-offpolicy runs")
    args = parser.parse_args()
    from srollout.report.onpolicy import mean_std

    rows = [seed_row(run) for run in args.runs]
    seeds = [int(r["seed"]) for r in rows]
    head = " | ".join(f"seed {s}" for s in seeds)
    lines = [f"| quantity | {head} | mean ± std |", "|---" * (len(seeds) + 2) + "|"]
    for label, key, scale, digits in QUANTITIES:
        values = [r[key] * scale for r in rows]
        mean, std = mean_std(values)
        cells = " | ".join(f"{v:.{digits}f}" for v in values)
        lines.append(f"| {label} | {cells} | {mean:.{digits}f} ± {std:.{digits}f} |")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
