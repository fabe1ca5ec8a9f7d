"""`srollout analyze`: how well mid-rollout divergence at step K predicts zero-variance groups
(paper §4.2–4.3, App. "Full correlation table", "Per-task-type", "False-positive case analysis",
"G=8 vs G=16 robustness panel").

Story: read the buffer (computing the seven signals at each K from steps when needed) → for each
(K, signal) Spearman ρ against the reward variance σ_r² and AUROC for the label "non-zero
variance" → the same per task type → median/IQR of every signal per group label → the default
gate's false positives → with G > 8, the same correlation table on seeded G=8 sub-samples →
write Parquet, PNG figures and report.md, print rich tables.

Sign convention: a higher divergence predicts non-zero variance, so AUROC > 0.5 and ρ > 0 mean
"the signal works" for every signal except termination_fraction τ_K, whose relation to the label
is U-shaped; its raw AUROC (not 1 − AUROC) is reported like every other.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import polars as pl

from srollout import schemas
from srollout.config import PAPER_K_VALUES, AnalyzeConfig
from srollout.report.markdown import Section, doc_link, figure, write_report
from srollout.report.tables import num, to_markdown, to_rich
from srollout.rundir import Manifest, prepare_run_dir
from srollout.schemas import LABELS, signal_names
from srollout.stages.buffer import (
    Buffer,
    groups_from_trajectories,
    load_buffer,
    signals_from_trajectories,
    subsample_trajectories,
)

D_K = "prefix_edit_distance_mean"
TAU_K = "termination_fraction"
SUBSAMPLE_G = 8
LABEL_ORDER = {lab: i for i, lab in enumerate(LABELS)}  # tables list the labels in this order

PER_TASK_TYPE_FILE = "per_task_type.parquet"
STRATIFICATION_FILE = "stratification.parquet"
FALSE_POSITIVES_FILE = "false_positives.parquet"
CORRELATION_G8_FILE = "correlation_g8.parquet"

# false positives listed in the console and in report.md (false_positives.parquet holds them all)
FP_SHOWN_CONSOLE = 20
FP_SHOWN_REPORT = 100
# points drawn in the d_K-vs-σ_r² scatter: past this many groups a seeded sample (said in the
# caption)
SCATTER_POINTS = 20_000
# signals-table rows from which analyze shows a bar over its statistics (~2 s at 400,000 rows)
STATISTICS_BAR_FROM = 400_000


class AnalyzeResult(NamedTuple):
    """Everything `analyze` computed; the tables are also the Parquet files in ``run_dir``."""

    run_dir: Path
    signals: pl.DataFrame
    correlation: pl.DataFrame
    per_task_type: pl.DataFrame
    task_type_summary: pl.DataFrame
    stratification: pl.DataFrame
    false_positives: pl.DataFrame | None
    correlation_g8: pl.DataFrame | None
    outputs: tuple[Path, ...]


def _measured(signals: pl.DataFrame) -> tuple[str, ...]:
    """The signals to rank: the seven, and each step signal the table holds a value of (a run of
    the planners records no log-probs: its ``action_logprob_mean`` is all NaN and left out)."""
    return tuple(
        m
        for m in signal_names(signals.columns)
        if m not in schemas.STEP_SIGNAL_NAMES
        or signals[m].cast(pl.Float64).fill_nan(None).drop_nulls().len() > 0
    )


def correlation_table(signals: pl.DataFrame) -> pl.DataFrame:
    """One row per (K, metric) of a signals table (needs zero_var): n (groups with a finite
    value), Spearman ρ of the signal against σ_r² with its two-sided p-value, and the raw AUROC of
    the signal as a score for "non-zero variance" (positive class = mixed groups).

    Each cell is :func:`srollout.core.stats.rank_stats`: the signal ranked once for both ρ and
    AUROC, σ_r² ranked once per K (the numbers of scipy's spearmanr and mannwhitneyu)."""
    from srollout.core.stats import rank_stats, rankdata

    rows: list[tuple[Any, ...]] = []
    for (K,), part in sorted(signals.partition_by("K", as_dict=True, maintain_order=True).items()):
        variance = part["reward_var"].to_numpy()
        nonzero = ~part["zero_var"].to_numpy()
        variance_ranks = rankdata(variance)
        for metric in _measured(signals):
            x = part[metric].cast(pl.Float64).fill_null(np.nan).to_numpy()
            # (K, metric, n, spearman_rho, p_value, auroc): the table's columns in order
            rows.append((K, metric, *rank_stats(x, variance, nonzero, target_ranks=variance_ranks)))
    return pl.DataFrame(rows, schema=schemas.CORRELATION.columns, orient="row")


def per_task_type_table(signals: pl.DataFrame) -> pl.DataFrame:
    """The correlation table of each task type: task_type, n_zv (zero-variance groups) + the
    columns of :func:`correlation_table`."""
    parts = []
    for (task_type,), part in sorted(
        signals.partition_by("task_type", as_dict=True, maintain_order=True).items()
    ):
        n_zv = int(part.filter(pl.col("K") == part["K"][0])["zero_var"].sum())
        parts.append(
            correlation_table(part).select(
                pl.lit(task_type).alias("task_type"), pl.lit(n_zv, pl.Int64).alias("n_zv"), pl.all()
            )
        )
    return pl.concat(parts)


def task_type_summary(per_type: pl.DataFrame, gate_K: int) -> pl.DataFrame:
    """Paper Table "per-task-type": per type n, n_zv, the AUROC of d_K at the gate's K, and the
    best raw AUROC over (metric, K) with the winning pair. NaN cells (one class empty) are
    skipped."""
    rows = []
    for task_type in per_type["task_type"].unique(maintain_order=True).to_list():
        part = per_type.filter(pl.col("task_type") == task_type)
        gate = part.filter((pl.col("K") == gate_K) & (pl.col("metric") == D_K))
        finite = part.filter(pl.col("auroc").is_not_nan()).sort(
            ["auroc", "K"], descending=[True, False]
        )
        best = finite.row(0, named=True) if finite.height else None
        rows.append(
            {
                "task_type": task_type,
                "n": int(part["n"].max()),
                "n_zv": int(part["n_zv"][0]),
                "d_K_auroc": float(gate["auroc"][0]) if gate.height else float("nan"),
                "best_metric": best["metric"] if best else None,
                "best_K": best["K"] if best else None,
                "best_auroc": float(best["auroc"]) if best else float("nan"),
            }
        )
    return pl.DataFrame(
        rows,
        schema={
            "task_type": pl.Utf8,
            "n": pl.Int64,
            "n_zv": pl.Int64,
            "d_K_auroc": pl.Float64,
            "best_metric": pl.Utf8,
            "best_K": pl.Int64,
            "best_auroc": pl.Float64,
        },
    )


def stratification_table(signals: pl.DataFrame) -> pl.DataFrame:
    """Median and inter-quartile range (linear quantiles) of every signal per (K, group label)."""
    aggs = []
    names = _measured(signals)
    for i, metric in enumerate(names):
        x = pl.col(metric).cast(pl.Float64)
        x = x.filter(x.is_not_nan().fill_null(False))
        aggs += [
            x.len().cast(pl.Int64).alias(f"n{i}"),
            x.median().alias(f"median{i}"),
            x.quantile(0.25, "linear").alias(f"q25{i}"),
            x.quantile(0.75, "linear").alias(f"q75{i}"),
        ]
    # one pass over the groups, all signals at once (no long table of K × 7 × N rows)
    cells = signals.group_by(["K", "label"]).agg(aggs)
    table = pl.concat(
        [
            cells.select(
                "K",
                pl.lit(metric).alias("metric"),
                "label",
                *(pl.col(f"{c}{i}").alias(c) for c in ("n", "median", "q25", "q75")),
            )
            for i, metric in enumerate(names)
        ]
    ).filter(pl.col("n") > 0)
    order = {m: i for i, m in enumerate(names)}
    return (
        table.with_columns(
            _m=pl.col("metric").replace_strict(order, return_dtype=pl.Int64),
            _l=pl.col("label").replace_strict(LABEL_ORDER, return_dtype=pl.Int64),
        )
        .sort(["K", "_m", "_l"])
        .drop(["_m", "_l"])
    )


def modal_prefix(actions: Sequence[Sequence[str]], K: int) -> tuple[str, int]:
    """The most common first-K action prefix of a group (ties: the earliest trajectory's) and how
    many trajectories share it; actions joined by " → "."""
    counts = Counter(tuple(a[:K]) for a in actions)
    prefix = max(counts, key=counts.__getitem__)  # the first maximal key: insertion order
    return " → ".join(prefix), counts[prefix]


def default_gate_cuts(at_K: pl.DataFrame, gate_K: int, d_L: float) -> np.ndarray:
    """bool[N]: the groups of a signals table at one K that the gate R1 (K, d_L) cuts."""
    from srollout.core.gate import GateRule

    return GateRule(rule="r1", K=gate_K, d_L=d_L).decide_arrays(at_K[D_K].to_numpy())


def false_positive_table(buffer: Buffer, gate_K: int, d_L: float) -> pl.DataFrame:
    """Groups the default gate R1 (cut iff d_K < d_L at K = gate_K) cuts although their rewards
    vary — with the group's most common first-K actions when the buffer has steps."""
    at = buffer.signals.filter(pl.col("K") == gate_K)
    fp = at.filter(pl.Series(default_gate_cuts(at, gate_K, d_L)) & ~pl.col("zero_var")).sort(
        "group_id"
    )
    table = fp.select(
        [
            "group_id",
            "task_type",
            "label",
            "reward_var",
            pl.col(D_K).alias("d_K"),
            pl.col(TAU_K).alias("tau_K"),
        ]
    )
    if buffer.trajectories is None or fp.height == 0:
        return table
    acts = (
        buffer.trajectories.filter(pl.col("group_id").is_in(fp["group_id"].to_list()))
        .sort(["group_id", "traj_idx"])
        .group_by("group_id", maintain_order=True)
        .agg(pl.col("actions"), G=pl.len())
    )
    shared = [modal_prefix(a, gate_K) for a in acts["actions"].to_list()]
    prefixes = pl.DataFrame(
        {
            "group_id": acts["group_id"],
            "first_actions": [p for p, _ in shared],
            "n_sharing": [
                f"{c}/{g}" for (_, c), g in zip(shared, acts["G"].to_list(), strict=True)
            ],
        }
    )
    return table.join(prefixes, on="group_id", how="left", maintain_order="left")


def wide_correlation(corr: pl.DataFrame) -> pl.DataFrame:
    """correlation.parquet pivoted for reading: one row per signal, "ρ / AUROC" columns per K."""
    metrics = set(corr["metric"].to_list())
    out = pl.DataFrame({"metric": [m for m in signal_names(metrics) if m in metrics]})
    for K in sorted(corr["K"].unique().to_list()):
        part = corr.filter(pl.col("K") == K).select(
            "metric",
            pl.col("spearman_rho").alias(f"rho K={K}"),
            pl.col("auroc").alias(f"AUROC K={K}"),
        )
        out = out.join(part, on="metric", how="left", maintain_order="left")
    return out


def _label_counts(groups: pl.DataFrame) -> str:
    counts = {lab: int((groups["label"] == lab).sum()) for lab in LABELS}
    n = groups.height
    zv = counts["all_fail"] + counts["all_succeed"]
    return (
        ", ".join(f"{counts[lab]} {lab}" for lab in LABELS)
        + f" ({zv}/{n} = {zv / n:.0%} zero-variance)"
    )


def _stratification_wide(strat: pl.DataFrame, K: int) -> pl.DataFrame:
    part = strat.filter(pl.col("K") == K)
    cells = part.with_columns(
        cell=pl.format(
            "{} [{}, {}]", pl.col("median").round(3), pl.col("q25").round(3), pl.col("q75").round(3)
        )
    )
    wide = cells.pivot(on="metric", index="label", values="cell")
    n = part.group_by("label").agg(pl.col("n").max())
    wide = (
        n.join(wide, on="label")
        .with_columns(_o=pl.col("label").replace_strict(LABEL_ORDER, return_dtype=pl.Int64))
        .sort("_o")
        .drop("_o")
    )
    present = wide.columns
    return wide.select(["label", "n", *[m for m in signal_names(present) if m in present]])


def run_analyze(
    config: AnalyzeConfig, console: Any | None = None, progress: bool = True
) -> AnalyzeResult:
    """Run the analyze stage; returns the tables and the run directory it wrote. progress: show
    bars for the long parts (the signals computed from steps, the statistics)."""
    from srollout.console import make_console
    from srollout.progress import PhaseBars

    console = console or make_console()
    t0 = time.perf_counter()
    with PhaseBars(
        console,
        enabled=progress,
        unit={"read steps": "parts", "signals": "groups", "statistics": "parts"},
    ) as bars:
        buffer = load_buffer(config.input, config.K, default_K=PAPER_K_VALUES, progress=bars.phase)
        t_load = time.perf_counter() - t0

        parts = bars.phase("statistics", info=True)
        # shown only for large buffers: below ~100,000 groups the whole stage takes seconds
        show = parts if buffer.signals.height >= STATISTICS_BAR_FROM else (lambda *a: None)
        show(0, 5, "correlation")
        corr = correlation_table(buffer.signals)
        show(1, 5, "per task type")
        per_type = per_task_type_table(buffer.signals)
        summary = task_type_summary(per_type, config.gate_K)
        show(2, 5, "stratification")
        strat = stratification_table(buffer.signals)
        gate_available = config.gate_K in buffer.Ks
        show(3, 5, "false positives")
        false_pos = (
            false_positive_table(buffer, config.gate_K, config.d_L) if gate_available else None
        )
        fig_K = config.gate_K if gate_available else buffer.Ks[len(buffer.Ks) // 2]

        corr_sub, groups_sub = None, None
        G_values = buffer.groups["G"].drop_nulls()
        can_subsample = (
            buffer.trajectories is not None
            and G_values.len() > 0
            and int(G_values.min()) > SUBSAMPLE_G
        )
        show(4, 5, f"G={SUBSAMPLE_G} sub-samples" if can_subsample else "")
        if can_subsample:
            sub = subsample_trajectories(buffer.trajectories, SUBSAMPLE_G, config.seed)
            groups_sub = groups_from_trajectories(sub, buffer.source)
            corr_sub = correlation_table(signals_from_trajectories(sub, groups_sub, buffer.Ks))
        show(5, 5, "")

    t_compute = time.perf_counter() - t0 - t_load

    # every check passed: only now create the run directory
    run_dir = prepare_run_dir(config.out, "analyze", overwrite=config.overwrite)
    manifest = Manifest(run_dir, "analyze", config)
    manifest.data["timings_s"].update(load=round(t_load, 3), compute=round(t_compute, 3))
    written = (  # (table, file name, the contract it is validated against)
        (buffer.signals if buffer.computed else None, schemas.SIGNALS.filename, schemas.SIGNALS),
        (corr, schemas.CORRELATION.filename, schemas.CORRELATION),
        (per_type, PER_TASK_TYPE_FILE, None),
        (strat, STRATIFICATION_FILE, None),
        (false_pos, FALSE_POSITIVES_FILE, None),
        (corr_sub, CORRELATION_G8_FILE, schemas.CORRELATION),
    )
    outputs = [schemas.write(df, run_dir / f, a) for df, f, a in written if df is not None]

    figures: dict[str, Path] = {}
    if config.figures:
        from srollout.report import figures as figs

        at = buffer.signals.filter(pl.col("K") == fig_K)
        figures["heatmap"] = figs.correlation_heatmap(
            corr, run_dir / "heatmap.png", f"N={buffer.n_groups} groups"
        )
        threshold = config.d_L if gate_available else None
        figures["hist"] = figs.histogram_by_label(
            at[D_K].to_numpy(),
            at["label"].to_list(),
            run_dir / "d_K_by_label.png",
            f"d_K at K={fig_K}",
            threshold,
            f"d_{fig_K} by group label",
        )
        # a million dots draw for tens of seconds and show no more than a seeded sample does
        shown = (
            at.sample(SCATTER_POINTS, seed=config.seed).sort("group_id")
            if at.height > SCATTER_POINTS
            else at
        )
        sampled = (
            f" ({SCATTER_POINTS:,} of {at.height:,} groups, seeded sample)"
            if shown.height < at.height
            else ""
        )
        figures["scatter"] = figs.scatter_by_label(
            shown[D_K].to_numpy(),
            shown["reward_var"].to_numpy(),
            shown["label"].to_list(),
            run_dir / "d_K_vs_reward_var.png",
            f"d_K at K={fig_K}",
            "reward variance σ_r²",
            threshold,
            f"d_{fig_K} against σ_r²{sampled}" if sampled else "",
        )
        if corr_sub is not None:
            G = int(G_values.min())
            curves = {
                f"G={G}": _rho_curve(corr),
                f"G={SUBSAMPLE_G} sub-samples": _rho_curve(corr_sub),
            }
            figures["g8"] = figs.curves_over_K(
                curves, run_dir / "rho_vs_K_by_G.png", "Spearman ρ of d_K vs σ_r²"
            )
        outputs.extend(figures.values())

    sections = _report_sections(
        config,
        buffer,
        corr,
        summary,
        strat,
        false_pos,
        fig_K,
        corr_sub,
        groups_sub,
        figures,
        run_dir,
    )
    outputs.append(write_report(run_dir, "srollout analyze", sections, _preamble(config, buffer)))
    manifest.complete(
        outputs,
        input=str(config.input),
        n_groups=buffer.n_groups,
        K=list(buffer.Ks),
        input_kind=buffer.kind,
    )
    outputs.append(manifest.path)

    _print(console, buffer, corr, summary, false_pos, config, corr_sub, run_dir, outputs)
    return AnalyzeResult(
        run_dir, buffer.signals, corr, per_type, summary, strat, false_pos, corr_sub, tuple(outputs)
    )


def _rho_curve(corr: pl.DataFrame) -> tuple[list[int], list[float]]:
    part = corr.filter(pl.col("metric") == D_K).sort("K")
    return part["K"].to_list(), part["spearman_rho"].to_list()


def _preamble(config: AnalyzeConfig, buffer: Buffer) -> str:
    G = buffer.groups["G"].drop_nulls().unique().sort().to_list()
    lines = [
        f"- input: `{config.input}` "
        f"({buffer.kind}{', signals computed here' if buffer.computed else ''})",
        f"- groups: N = {buffer.n_groups}; {_label_counts(buffer.groups)}",
        f"- group size G: {', '.join(map(str, G)) if G else 'not in the input'}; K = "
        f"{', '.join(map(str, buffer.Ks))}",
    ]
    return "\n".join(lines)


def _report_sections(
    config, buffer, corr, summary, strat, false_pos, fig_K, corr_sub, groups_sub, figures, run_dir
) -> list[Section]:
    def shown(key: str, caption: str) -> str:
        """The figure's markdown; "" when it was not drawn (--no-figures)."""
        return figure(figures[key], run_dir, caption) if key in figures else ""

    sections = [
        Section(
            "Correlation with reward variance",
            "ρ > 0 and AUROC > 0.5 mean the signal works (τ_K's AUROC is raw). The columns, and "
            "the full table `correlation.parquet`: "
            + doc_link("artifacts.md", "correlation.parquet — one row per (K, metric) (analyze)")
            + ".\n\n"
            + to_markdown(wide_correlation(corr))
            + ("\n" if "heatmap" in figures else "")
            + shown("heatmap", "Spearman ρ (left) and AUROC (right) per (signal, K)"),
        )
    ]
    median = summary.select(pl.col("d_K_auroc").median(), pl.col("best_auroc").median()).row(0)
    sections.append(
        Section(
            f"Per task type (d_K AUROC at K={config.gate_K}; best raw AUROC over (metric, K))",
            to_markdown(summary)
            + f"\nMedian over task types: d_K AUROC {num(median[0], 2)}, best AUROC "
            f"{num(median[1], 2)}. Cells with n_zv ≤ 2 rest on one or two positives; read them as "
            "'the gate did not fail', not 'perfect'. All (task type, K, metric) cells: "
            "`per_task_type.parquet`.\n",
        )
    )
    sections.append(
        Section(
            f"Signals by group label at K={fig_K} (median [q25, q75])",
            to_markdown(_stratification_wide(strat, fig_K))
            + "\nEvery K: `stratification.parquet`.\n",
        )
    )
    if false_pos is not None:
        at = buffer.signals.filter(pl.col("K") == config.gate_K)
        cut = at.filter(pl.Series(default_gate_cuts(at, config.gate_K, config.d_L)))
        tp = int(cut["zero_var"].sum())
        body = (
            f"Gate R1 at K={config.gate_K}, d_L={config.d_L:g} (cut iff d_K < d_L): {cut.height} "
            f"groups cut, {tp} true positives (zero variance), {false_pos.height} false positives "
            "(rewards vary).\n\n"
        )
        if false_pos.height > FP_SHOWN_REPORT:
            body += (
                f"The first {FP_SHOWN_REPORT} by group_id; all {false_pos.height}: "
                f"`{FALSE_POSITIVES_FILE}`.\n\n" + to_markdown(false_pos.head(FP_SHOWN_REPORT))
            )
        else:
            body += to_markdown(false_pos) if false_pos.height else "No false positives.\n"
    else:
        body = (
            f"Not computed: K={config.gate_K} is not among the analysed K "
            f"({', '.join(map(str, buffer.Ks))}).\n"
        )
    sections.append(Section("False positives of the default gate", body))
    sampled = buffer.n_groups > SCATTER_POINTS
    sample = f" ({SCATTER_POINTS:,}-group seeded sample)" if sampled else ""
    figure_md = shown("hist", f"d_K at K={fig_K} by group label (dashed: d_L)") + shown(
        "scatter", f"d_K at K={fig_K} against reward variance{sample}"
    )
    if figure_md:
        sections.append(Section("Figures", figure_md))
    if corr_sub is not None:
        G = int(buffer.groups["G"].min())
        both = wide_correlation(corr).filter(pl.col("metric") == D_K)
        sub_rows = wide_correlation(corr_sub).filter(pl.col("metric") == D_K)
        rows = pl.concat(
            [
                both.with_columns(pl.lit(f"G={G}").alias("groups")),
                sub_rows.with_columns(pl.lit(f"G={SUBSAMPLE_G} sub-samples").alias("groups")),
            ]
        )
        body = (
            f"Each G={G} group re-scored on one seeded random subset of {SUBSAMPLE_G} of its "
            f"trajectories (seed {config.seed}); labels and σ_r² recomputed from the subset. "
            f"Labels: G={G}: {_label_counts(buffer.groups)}; G={SUBSAMPLE_G}: "
            f"{_label_counts(groups_sub)}.\n\n"
            + to_markdown(
                rows.select(["groups", *[c for c in rows.columns if c not in ("groups", "metric")]])
            )
            + "\nAll signals: `correlation_g8.parquet`.\n\n"
            + shown("g8", "Spearman ρ of d_K against K, both group sizes")
        )
        sections.append(
            Section(f"G={SUBSAMPLE_G} sub-samples of the G={G} groups (App. G16 panel)", body)
        )
    return sections


def _print(console, buffer, corr, summary, false_pos, config, corr_sub, run_dir, outputs) -> None:
    console.print(f"[bold]analyze[/]: {buffer.n_groups} groups; {_label_counts(buffer.groups)}")
    console.print(
        to_rich(
            wide_correlation(corr), title="Spearman ρ vs σ_r² and AUROC for non-zero variance (raw)"
        )
    )
    console.print(to_rich(summary, title=f"Per task type (d_K AUROC at K={config.gate_K})"))
    if false_pos is not None:
        more = (
            f" (the first {FP_SHOWN_CONSOLE} of {false_pos.height}: {FALSE_POSITIVES_FILE})"
            if false_pos.height > FP_SHOWN_CONSOLE
            else ""
        )
        shown = false_pos.head(FP_SHOWN_CONSOLE)
        shown = shown.drop([c for c in ("first_actions",) if c in false_pos.columns])
        title = f"False positives of R1 at K={config.gate_K}, d_L={config.d_L:g}{more}"
        console.print(to_rich(shown, title=title))
    if corr_sub is not None:
        console.print(to_rich(wide_correlation(corr_sub), title=f"G={SUBSAMPLE_G} sub-samples"))
    console.print(
        f"wrote {len(outputs)} files to [bold]{run_dir}[/] (report: {run_dir / 'report.md'})"
    )
