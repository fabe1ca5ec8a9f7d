"""The paper's figures as PNG files. matplotlib (Agg backend) is imported inside each function so
that importing this module — and `srollout --help` — stays fast."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from srollout.atomic import atomic_file
from srollout.schemas import LABELS, signal_names

# One colour per group label, the paper's convention (Fig. "d_K by label").
LABEL_COLORS = {"all_fail": "#d62728", "mixed": "#7f7f7f", "all_succeed": "#2ca02c"}
ORACLE = {"marker": "*", "s": 120, "color": "gold", "edgecolor": "black"}  # pareto's oracle


def pyplot() -> Any:
    """``matplotlib.pyplot`` on the Agg backend (no display needed), imported on first use."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig: Any, path: str | Path, tight: bool = True) -> Path:
    """Save ``fig`` as a PNG atomically (temp file + rename), close it, return the path.

    tight: apply ``tight_layout`` first when the figure has no layout engine (the figures of this
    module set their margins by hand instead: layout passes cost a few hundred ms each, which
    matters for the 5 s budget of analyze + sweep)."""
    if tight and fig.get_layout_engine() is None:
        fig.tight_layout()
    # metadata without "Software"/date keeps the bytes reproducible for the same data;
    # bbox_inches="tight" is avoided because it draws the figure twice
    atomic_file(
        path, lambda tmp: fig.savefig(tmp, format="png", dpi=100, metadata={"Software": None})
    )
    pyplot().close(fig)
    return Path(path)


def _finish(fig: Any, ax: Any, path: str | Path, xlabel: str, ylabel: str, title: str) -> Path:
    """Label the axes, title the plot (when ``title``), set this module's margins and save."""
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    if title:
        ax.set_title(title, fontsize=10)
    fig.subplots_adjust(left=0.12, right=0.97, bottom=0.14, top=0.9)
    return save_figure(fig, path, tight=False)


def correlation_heatmap(corr: pl.DataFrame, path: str | Path, title: str = "") -> Path:
    """Two panels over (signal, K): Spearman ρ against reward variance, and AUROC for "non-zero
    variance". ``corr`` has the columns of correlation.parquet (K, metric, spearman_rho, auroc)."""
    plt = pyplot()
    Ks = sorted(corr["K"].unique().to_list())
    present = set(corr["metric"].to_list())
    metrics = [m for m in signal_names(present) if m in present]
    width = 2.6 + 2 * (1.0 * len(Ks) + 1.7)  # y labels + two panels, each with its colorbar
    fig, axes = plt.subplots(1, 2, figsize=(width, 0.5 * len(metrics) + 1.8))
    for ax, column, label, vmin, vmax, cmap in (
        (axes[0], "spearman_rho", "Spearman ρ vs reward variance", -1.0, 1.0, "RdBu_r"),
        (axes[1], "auroc", "AUROC for non-zero variance (raw)", 0.0, 1.0, "RdBu_r"),
    ):
        grid = np.full((len(metrics), len(Ks)), np.nan)
        for row in corr.iter_rows(named=True):
            if row["metric"] in metrics:
                value = row[column]
                grid[metrics.index(row["metric"]), Ks.index(row["K"])] = (
                    np.nan if value is None else value
                )
        image = ax.imshow(grid, cmap=cmap, vmin=vmin, vmax=vmax, aspect="auto")
        for (i, j), value in np.ndenumerate(grid):
            text = "—" if np.isnan(value) else f"{value:.2f}"
            ax.text(j, i, text, ha="center", va="center", fontsize=8)
        ax.set_xticks(range(len(Ks)), [f"K={k}" for k in Ks])
        ax.set_yticks(range(len(metrics)), metrics if ax is axes[0] else [""] * len(metrics))
        ax.set_title(label, fontsize=9)
        fig.colorbar(image, ax=ax, shrink=0.8)
    if title:
        fig.suptitle(title, fontsize=10)
    fig.subplots_adjust(left=2.4 / width, right=0.98, bottom=0.12, top=0.86, wspace=0.25)
    return save_figure(fig, path, tight=False)


def histogram_by_label(
    values: Sequence[float],
    labels: Sequence[str],
    path: str | Path,
    xlabel: str,
    threshold: float | None = None,
    title: str = "",
) -> Path:
    """Stacked histogram of one signal (e.g. d_K) coloured by group label; a dashed line at the
    gate threshold d_L when given."""
    plt = pyplot()
    values = np.asarray(values, dtype=float)
    labels = np.asarray(labels)
    fig, ax = plt.subplots(figsize=(6.0, 3.6))
    present = [lab for lab in LABELS if np.any(labels == lab)]
    bins = np.linspace(0.0, max(1.0, float(np.nanmax(values)) if values.size else 1.0), 26)
    ax.hist(
        [values[labels == lab] for lab in present],
        bins=bins,
        stacked=True,
        color=[LABEL_COLORS[lab] for lab in present],
        label=[f"{lab} (n={int(np.sum(labels == lab))})" for lab in present],
    )
    if threshold is not None:
        ax.axvline(
            threshold, color="red", linestyle="--", linewidth=1.2, label=f"d_L = {threshold:g}"
        )
    ax.legend(fontsize=8)
    return _finish(fig, ax, path, xlabel, "groups", title)


def scatter_by_label(
    x: Sequence[float],
    y: Sequence[float],
    labels: Sequence[str],
    path: str | Path,
    xlabel: str,
    ylabel: str,
    threshold: float | None = None,
    title: str = "",
) -> Path:
    """Scatter of a signal against reward variance, coloured by label, small jitter-free markers."""
    plt = pyplot()
    x = np.asarray(x, dtype=float)
    y = np.asarray(y, dtype=float)
    labels = np.asarray(labels)
    fig, ax = plt.subplots(figsize=(6.0, 3.8))
    for lab in LABELS:
        mask = labels == lab
        if mask.any():
            ax.scatter(x[mask], y[mask], s=14, alpha=0.7, color=LABEL_COLORS[lab], label=lab)
    if threshold is not None:
        ax.axvline(
            threshold, color="red", linestyle="--", linewidth=1.2, label=f"d_L = {threshold:g}"
        )
    ax.legend(fontsize=8)
    return _finish(fig, ax, path, xlabel, ylabel, title)


def curves_over_K(
    curves: Mapping[str, tuple[Sequence[int], Sequence[float]]],
    path: str | Path,
    ylabel: str,
    title: str = "",
) -> Path:
    """One line per named curve (e.g. "G=16", "G=8 sub-samples") of a value against K."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(5.5, 3.5))
    for name, (ks, ys) in curves.items():
        ax.plot(list(ks), [np.nan if v is None else v for v in ys], marker="o", label=name)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    return _finish(fig, ax, path, "K (gate step)", ylabel, title)


def pareto(
    sweep: pl.DataFrame,
    path: str | Path,
    precision_floor: float,
    chosen: int | None = None,
    title: str = "",
) -> Path:
    """Savings against precision for every swept (rule, K, d_L[, t_high]) row: safe savings as
    filled markers, the random-cut baseline with the same cuts as crosses, the oracle as a star,
    the precision floor as a dashed line, the chosen operating point circled."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    groups = sweep.group_by(["rule", "K"], maintain_order=True)
    for (rule, K), part in groups:
        prec = part["precision"].to_numpy()
        ax.plot(
            prec,
            100 * part["safe_savings"].to_numpy(),
            marker="o",
            linestyle="-" if rule == "r1" else ":",
            markersize=4,
            label=f"{rule}, K={K}: safe savings",
        )
        if "random_precision" in part.columns:
            ax.scatter(
                part["random_precision"].to_numpy(),
                100 * part["random_safe_savings"].to_numpy(),
                marker="x",
                s=16,
                color="gray",
            )
        if "oracle_safe_savings" in part.columns:
            ax.scatter([1.0], [100 * part["oracle_safe_savings"][0]], zorder=5, **ORACLE)
    ax.scatter([], [], marker="x", color="gray", label="random cut, same #cuts (mean)")
    ax.scatter([], [], label="oracle (all zero-variance cut)", **ORACLE)
    ax.axvline(
        precision_floor,
        color="red",
        linestyle="--",
        linewidth=1.0,
        label=f"precision floor {precision_floor:g}",
    )
    if chosen is not None:
        row = sweep.row(chosen, named=True)
        ax.scatter(
            [row["precision"]],
            [100 * row["safe_savings"]],
            s=220,
            facecolors="none",
            edgecolors="black",
            linewidths=1.8,
            label=f"chosen: {row['rule']} K={row['K']} d_L={row['d_L']:g}",
            zorder=6,
        )
    ax.set_xlim(-0.02, 1.05)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="best")
    ylabel = "safe savings (% of N·T_max steps)"
    return _finish(fig, ax, path, "precision = TP / cut", ylabel, title)
