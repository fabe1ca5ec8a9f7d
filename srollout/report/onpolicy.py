"""Tier-3 outputs of ``srollout train-onpolicy``: numbers per seed and per arm (mean ± sample std
over seeds), the paired tests over (seed, task) outcomes, the 4-panel, mechanism and audit figures.
What each number means: docs/training.md (Tier 3) and docs/artifacts.md."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import polars as pl

from srollout.report.palette import ARM_COLORS, arm_color, arm_order
from srollout.report.tables import mean_pm


def _arms_in(frame: pl.DataFrame) -> list[str]:
    """The arms present in ``frame``, in the pages' order (baseline, gated first, as before)."""
    return arm_order(set(frame["arm"].to_list()) if "arm" in frame.columns else set())


class PairedTest(NamedTuple):
    """b - a over n paired (seed, task) outcomes: success rates, their difference with a
    bootstrap CI and p-value, and McNemar's discordant counts and exact p-value."""

    what: str
    n: int
    rate_a: float
    rate_b: float
    diff: float
    ci_low: float
    ci_high: float
    p_bootstrap: float
    b01: int
    b10: int
    p_mcnemar: float


def _mean(values: Any) -> float:
    v = pl.Series(values, dtype=pl.Float64).drop_nulls().drop_nans()
    return float(v.mean()) if v.len() else float("nan")


def _of(frame: pl.DataFrame, seed: int, arm: str) -> pl.DataFrame:
    """The rows of one (seed, arm)."""
    return (
        frame.filter((pl.col("seed") == seed) & (pl.col("arm") == arm)) if frame.height else frame
    )


def _seed_arm(m: pl.DataFrame, e: pl.DataFrame, last_eval: int) -> dict[str, Any]:
    """One (seed, arm)'s numbers from its metrics rows ``m`` and eval rows ``e``: totals over its
    iterations, the mean gradient L2 (stepped iterations) and zero-advantage fraction, the
    zero-variance rate of the kept groups, held-out success at iteration 0 and at the last
    evaluation (0 or NaN where ``m`` has no such column or no row)."""
    from srollout.core.arms import arm_summary

    nan = float("nan")

    def total(col: str) -> int:
        return int(m[col].sum()) if col in m.columns else 0

    def mean(col: str, rows: pl.DataFrame = m) -> float:
        return _mean(rows[col]) if col in m.columns and m.height else nan

    stepped = m.filter(pl.col("train/stepped")) if "train/stepped" in m.columns else m
    # wall-clock, tokens and useful groups per second as ab-rollout's arms table counts them
    useful = pl.col("gate/useful") if "gate/useful" in m.columns else pl.lit(0)
    per_iteration = m.select(
        pl.col("time/iter_s").alias("iter_s"),
        pl.col("rollout/gen_tokens").alias("n_gen_tokens"),
        useful.alias("n_useful"),
    )
    summary = arm_summary(per_iteration.to_dicts())
    return {
        "wall_s": summary["wall_s"] if m.height else nan,
        "cuts": total("gate/cuts"),
        "groups": total("rollout/groups"),
        "gen_tokens": summary["gen_tokens"],
        **(
            {"cut_tp": total("gate/cut_tp"), "cut_fp": total("gate/cut_fp")}
            if "gate/cut_tp" in m.columns  # --judge-cuts
            else {}
        ),
        "grad_l2": mean("train/grad_l2", stepped),
        "zero_adv": mean("train/zero_adv_frac"),
        "zero_var_rate": total("gate/zero_var_kept") / max(total("gate/kept"), 1)
        if m.height
        else nan,
        "eval0": _success_at(e, 0),
        "eval_last": _success_at(e, last_eval),
        "useful_groups": summary["useful"],
        "useful_per_s": summary["useful_per_s"],
        "skipped": total("gate/skipped"),
        "stalled": total("gate/stalled"),
        "extra_rounds": total("gate/dapo_rounds") - m.height,
        "cap_hits": total("gate/dapo_hit_cap"),
    }


# summary_per_seed.parquet's numbers of each of the two arms, in column order
_PER_SEED = (
    "wall_s cuts groups gen_tokens cut_tp cut_fp grad_l2 zero_adv zero_var_rate eval0 eval_last"
).split()


def per_seed(metrics: pl.DataFrame, evals: pl.DataFrame) -> pl.DataFrame:
    """One row per seed with both arms' numbers (columns suffixed _baseline / _gated)."""
    rows = []
    last_eval = int(evals["iteration"].max()) if evals.height else 0
    nan = float("nan")
    for seed in sorted(set(metrics["seed"].to_list())):
        row: dict[str, Any] = {"seed": seed}
        for arm in ("baseline", "gated"):
            got = _seed_arm(_of(metrics, seed, arm), _of(evals, seed, arm), last_eval)
            row.update({f"{q}_{arm}": got[q] for q in _PER_SEED if q in got})
        base, gated = row["wall_s_baseline"], row["wall_s_gated"]
        row["wall_saving"] = (base - gated) / base if base == base and base > 0 else nan
        tok_base = row["gen_tokens_baseline"]
        row["token_saving"] = 1 - row["gen_tokens_gated"] / tok_base if tok_base > 0 else nan
        if "cut_tp_gated" in row:
            judged = row["cut_tp_gated"] + row["cut_fp_gated"]
            row["cut_precision"] = row["cut_tp_gated"] / judged if judged else nan
        grad_base = row["grad_l2_baseline"]
        row["grad_l2_ratio"] = row["grad_l2_gated"] / grad_base if grad_base > 0 else nan
        z_base, z_gated = row["zero_adv_baseline"], row["zero_adv_gated"]
        row["dilution_prediction"] = (1 - z_gated) / (1 - z_base) if z_base < 1 else nan
        row["eval_last_delta"] = row["eval_last_gated"] - row["eval_last_baseline"]
        rows.append(row)
    return pl.DataFrame(rows)


def success_by_eval(evals: pl.DataFrame) -> pl.DataFrame:
    """Held-out success (%) at every evaluated iteration: per arm, one row per seed, then (with
    more than one seed) a row ``mean ± std`` over the seeds. Columns ``arm``, ``seed`` and one
    ``it <i>`` per iteration."""
    if not evals.height:
        return pl.DataFrame({"arm": [], "seed": []}, schema={"arm": pl.Utf8, "seed": pl.Utf8})
    rates = evals.group_by("arm", "seed", "iteration").agg(
        (pl.col("success").cast(pl.Float64).mean() * 100).alias("rate")
    )
    iterations = sorted(rates["iteration"].unique().to_list())
    rows: list[dict[str, str]] = []
    for arm in _arms_in(evals):
        of_arm = rates.filter(pl.col("arm") == arm)
        seeds = sorted(of_arm["seed"].unique().to_list())
        by = {(r["seed"], r["iteration"]): r["rate"] for r in of_arm.iter_rows(named=True)}
        for seed in seeds:
            cells = {
                f"it {i}": f"{by[(seed, i)]:.1f}" if (seed, i) in by else "—" for i in iterations
            }
            rows.append({"arm": arm, "seed": str(seed), **cells})
        if len(seeds) > 1:
            cells = {}
            for i in iterations:
                m, sd = mean_std([by[(seed, i)] for seed in seeds if (seed, i) in by])
                cells[f"it {i}"] = f"{m:.1f} ± {sd:.1f}"
            rows.append({"arm": arm, "seed": "mean ± std", **cells})
    return pl.DataFrame(rows)


def _success_at(evals: pl.DataFrame, iteration: int) -> float:
    """Held-out success rate of ``evals`` at ``iteration`` (NaN when nothing was evaluated)."""
    if not evals.height:
        return float("nan")
    return _mean(evals.filter(pl.col("iteration") == iteration)["success"].cast(pl.Float64))


def paired_test(
    evals: pl.DataFrame, a: tuple[str, int], b: tuple[str, int], what: str, seed: int = 0
) -> PairedTest | None:
    """Compare (arm, iteration) ``a`` with ``b`` over the (seed, task) pairs both have."""
    from srollout.core.stats import mcnemar, paired_bootstrap

    def pick(arm: str, it: int) -> pl.DataFrame:
        return evals.filter((pl.col("arm") == arm) & (pl.col("iteration") == it)).select(
            "seed", "task_id", "success"
        )

    joined = pick(*a).join(pick(*b), on=["seed", "task_id"], suffix="_b").sort("seed", "task_id")
    if joined.height == 0:
        return None
    xa = joined["success"].to_numpy().astype(bool)
    xb = joined["success_b"].to_numpy().astype(bool)
    boot = paired_bootstrap(xa.astype(float), xb.astype(float), seed=seed)
    mc = mcnemar(xa, xb)
    boots = (float(x) for x in (boot.diff, boot.low, boot.high, boot.p_value))
    stats = (*boots, int(mc.b01), int(mc.b10), float(mc.p_value))
    return PairedTest(what, joined.height, float(xa.mean()), float(xb.mean()), *stats)


def mean_std(values: Any) -> tuple[float, float]:
    """Mean and sample std (ddof=1; 0 for one seed) over the finite values."""
    v = np.asarray([x for x in values if x == x], dtype=float)
    if v.size == 0:
        return float("nan"), float("nan")
    return float(v.mean()), float(v.std(ddof=1)) if v.size > 1 else 0.0


# aggregate_frame's rows: quantity, column stem (``<stem>_baseline``, ``<stem>_gated``), scale,
# digits, and the delta cell with ``{<column>[:scale:digits]}`` fields
_AGGREGATE = (
    ("training wall-clock (s)", "wall_s", 1, 1, "saving {wall_saving:100:1} %"),
    ("groups cut by the gate", "cuts", 1, 1, "of {groups_gated:1:0} groups"),
    ("generated tokens", "gen_tokens", 1, 0, "saving {token_saving:100:1} %"),
    ("gradient L2 norm", "grad_l2", 1, 4, "x {grad_l2_ratio}"),
    ("zero-advantage fraction", "zero_adv", 1, 3, "dilution prediction x {dilution_prediction}"),
    ("held-out success, iteration 0", "eval0", 100, 1, "same policy"),
    ("held-out success, last eval", "eval_last", 100, 1, "{eval_last_delta:100:1} pp"),
)
_JUDGED = (  # with --judge-cuts, after the generated tokens
    "cuts judged by full outcome: TP / FP",
    "—",
    "{cut_tp_gated:1:1} / {cut_fp_gated:1:1}",
    "precision {cut_precision:1:2}",
)


def aggregate_frame(seeds: pl.DataFrame) -> pl.DataFrame:
    """The paper's Table "Tier 3": quantity, baseline, gated, delta — mean ± std over seeds."""
    import re

    def ms(col: str, scale: float = 1.0, digits: int = 3) -> str:
        m, s = mean_std(seeds[col].to_list()) if col in seeds.columns else (math.nan, math.nan)
        return mean_pm(m, s, scale, digits)

    def fill(template: str) -> str:
        def cell(match: re.Match) -> str:
            col, *fmt = match.group(1).split(":")
            return ms(col, float(fmt[0]), int(fmt[1])) if fmt else ms(col)

        return re.sub(r"\{([^}]+)\}", cell, template)

    rows = [
        (name, ms(f"{stem}_baseline", scale, digits), ms(f"{stem}_gated", scale, digits), fill(d))
        for name, stem, scale, digits, d in _AGGREGATE
    ]
    if "cut_tp_gated" in seeds.columns:
        rows.insert(3, tuple(fill(c) for c in _JUDGED))
    return pl.DataFrame(
        rows,
        schema={"quantity": pl.Utf8, "baseline": pl.Utf8, "gated": pl.Utf8, "delta": pl.Utf8},
        orient="row",
    )


# summary_arms.parquet's quantities (each with its ``_std``), in column order
ARM_QUANTITIES = (
    "wall_s gen_tokens useful_groups useful_per_s groups cuts skipped stalled extra_rounds "
    "cap_hits eval0 eval_last wall_saving token_saving eval_delta"
).split()


def arms_frame(metrics: pl.DataFrame, evals: pl.DataFrame, order: Any = None) -> pl.DataFrame:
    """One row per arm: for each quantity q of :data:`ARM_QUANTITIES`, ``q`` = the mean over seeds
    of the per-seed value and ``q_std`` its sample std (0 for one seed); the quantities are those
    of docs/artifacts.md's arms table (wall_s = Σ iter_s: rollout + update + sync; savings and
    eval_delta against the baseline arm of the same seed, NaN without one). ``order``: the arms'
    order (default: ARM_COLORS order)."""
    last_eval = int(evals["iteration"].max()) if evals.height else 0
    arms = (
        [a for a in (order or _arms_in(metrics)) if a in set(metrics["arm"].to_list())]
        if metrics.height
        else []
    )
    seeds = sorted(set(metrics["seed"].to_list())) if metrics.height else []
    per = {
        (arm, seed): _seed_arm(_of(metrics, seed, arm), _of(evals, seed, arm), last_eval)
        for seed in seeds
        for arm in arms
        if _of(metrics, seed, arm).height
    }
    for (_arm, seed), row in per.items():
        b = per.get(("baseline", seed))
        nan = float("nan")
        row["wall_saving"] = 1 - row["wall_s"] / b["wall_s"] if b and b["wall_s"] > 0 else nan
        row["token_saving"] = (
            1 - row["gen_tokens"] / b["gen_tokens"] if b and b["gen_tokens"] > 0 else nan
        )
        row["eval_delta"] = row["eval_last"] - b["eval_last"] if b else nan
    rows = []
    for arm in arms:
        seeds = [r for (a, _), r in per.items() if a == arm]
        out: dict[str, Any] = {"arm": arm, "n_seeds": len(seeds)}
        for q in ARM_QUANTITIES:
            out[q], out[f"{q}_std"] = mean_std([r[q] for r in seeds])
        rows.append(out)
    schema = {
        "arm": pl.Utf8,
        "n_seeds": pl.Int64,
        **{c: pl.Float64 for q in ARM_QUANTITIES for c in (q, f"{q}_std")},
    }
    return pl.DataFrame(rows, schema=schema)


def arms_markdown_view(arms: pl.DataFrame) -> pl.DataFrame:
    """The per-arm table as text cells 'mean ± std' for report.md and the console."""

    def ms(row: dict[str, Any], q: str, scale: float = 1.0, digits: int = 1) -> str:
        return mean_pm(row[q], row[f"{q}_std"], scale, digits)

    stalled = any((x["stalled"] or 0) > 0 for x in arms.iter_rows(named=True))
    rows = [
        {
            "arm": r["arm"],
            "wall-clock (s)": ms(r, "wall_s"),
            "saving vs baseline (%)": ms(r, "wall_saving", 100),
            "generated tokens": ms(r, "gen_tokens", digits=0),
            "useful groups": ms(r, "useful_groups"),
            "useful groups / s": ms(r, "useful_per_s", digits=3),
            "cut / skipped": f"{r['cuts']:.1f} / {r['skipped']:.1f}",
            **({"trajectories stopped": ms(r, "stalled")} if stalled else {}),
            "DAPO extra rounds (cap hits)": f"{r['extra_rounds']:.1f} ({r['cap_hits']:.1f})",
            "held-out success, last (%)": ms(r, "eval_last", 100),
            "vs baseline (pp)": ms(r, "eval_delta", 100),
        }
        for r in arms.iter_rows(named=True)
    ]
    return pl.DataFrame(rows) if rows else pl.DataFrame({"arm": []}, schema={"arm": pl.Utf8})


def tests_frame(tests: list[PairedTest | None]) -> pl.DataFrame:
    rows = [t._asdict() for t in tests if t is not None]
    return (
        pl.DataFrame(rows)
        if rows
        else pl.DataFrame({"what": [], "n": []}, schema={"what": pl.Utf8, "n": pl.Int64})
    )


def _band(ax: Any, frame: pl.DataFrame, x: str, y: str, arm: str, rolling: int = 1) -> None:
    """Mean over seeds with a ±1 std band, optionally smoothed by a rolling mean per seed."""
    d = frame.filter(pl.col("arm") == arm)
    if d.height == 0:
        return
    if rolling > 1:
        d = d.sort("seed", x).with_columns(
            pl.col(y).rolling_mean(rolling, min_samples=1).over("seed")
        )
    agg = (
        d.group_by(x)
        .agg(pl.col(y).mean().alias("m"), pl.col(y).std(ddof=1).fill_null(0.0).alias("s"))
        .sort(x)
    )
    xs, m, s = agg[x].to_numpy(), agg["m"].to_numpy(), agg["s"].fill_nan(0.0).to_numpy()
    ax.plot(xs, m, marker="o", ms=3, color=arm_color(arm), label=arm)
    ax.fill_between(xs, m - s, m + s, color=arm_color(arm), alpha=0.2)


def _iteration_panels(
    arms: list[str], panels: list, title: str, path: Path, label_size: Any = "medium", extra=None
) -> Path:
    """A 2×2 figure over iterations. ``panels``, row by row: (frame, column, y label, rolling),
    each drawn as every arm's mean ± 1 std band (:func:`_band`); a panel whose frame is None is
    drawn by ``extra(ax)``."""
    from srollout.report.figures import pyplot, save_figure

    fig, axes = pyplot().subplots(2, 2, figsize=(11, 7.5))
    for ax, (frame, y, label, rolling) in zip(axes.flat, panels, strict=True):
        if frame is None:
            extra(ax)
        else:
            for arm in arms:
                _band(ax, frame, "iteration", y, arm, rolling)
        ax.set_xlabel("iteration")
        ax.set_ylabel(label, fontsize=label_size)
        ax.grid(alpha=0.3)
    axes[0][0].legend()
    fig.suptitle(title)
    fig.tight_layout()
    return save_figure(fig, path)


def onpolicy_figure(metrics: pl.DataFrame, evals: pl.DataFrame, path: Path) -> Path:
    """The paper's 4-panel Tier-3 figure: held-out success, cumulative wall-clock, training reward
    (5-iteration rolling; the gated arm over uncut groups only), gradient L2 norm."""
    ev = evals.group_by("arm", "seed", "iteration").agg(
        pl.col("success").cast(pl.Float64).mean().alias("success")
    )
    panels = [
        (ev, "success", "held-out success (greedy)", 1),
        (metrics, "time/cum_s", "cumulative training wall-clock (s)", 1),
        (metrics, "train/reward", "training reward (uncut groups, 5-iter rolling)", 5),
        (metrics.filter(pl.col("train/stepped")), "train/grad_l2", "gradient L2 norm", 1),
    ]
    n = metrics["seed"].n_unique()
    title = f"On-policy GRPO A/B, mean ± 1 std over {n} seed(s)"
    return _iteration_panels(_arms_in(metrics), panels, title, path)


def mechanism_figure(metrics: pl.DataFrame, path: Path) -> Path:
    """App. "Mechanism evolution": zero-variance rate (gated: uncut groups), cut rate vs the
    baseline arm's zero-variance rate, gradient L2, zero-advantage fraction; per iteration."""
    m = metrics.with_columns(
        # an iteration whose groups were all cut has no zero-variance rate (not 0)
        pl.when(pl.col("gate/kept") > 0)
        .then(pl.col("gate/zero_var_kept") / pl.col("gate/kept"))
        .otherwise(None)
        .alias("zv_rate"),
        (pl.col("gate/cuts") / pl.col("rollout/groups")).alias("cut_rate"),
    )

    def cut_rate(ax: Any) -> None:
        lines = (("baseline", "zv_rate", "zero-variance rate"), ("gated", "cut_rate", "cut rate"))
        for arm, col, what in lines:
            by_it = m.filter(pl.col("arm") == arm).group_by("iteration").agg(pl.col(col).mean())
            by_it = by_it.sort("iteration")
            ax.plot(
                by_it["iteration"].to_list(), by_it[col].to_list(), color=ARM_COLORS[arm],
                label=f"{arm} {what}",
            )  # fmt: skip
        ax.legend()

    panels = [
        (m, "zv_rate", "zero-variance rate (gated: uncut groups)", 5),
        (None, "", "cut rate vs baseline zero-variance rate", 1),
        (m.filter(pl.col("train/stepped")), "train/grad_l2", "gradient L2 norm", 1),
        (m, "train/zero_adv_frac", "zero-advantage fraction of the batch", 1),
    ]
    title = "Mechanism: zero-variance groups, cuts and dilution over training"
    return _iteration_panels(_arms_in(m), panels, title, path, 8, cut_rate)


def audit_figure(metrics: pl.DataFrame, floor: float, path: Path) -> Path:
    """``--audit``: per gated (seed, arm), the d_L each iteration ran with, the Clopper-Pearson
    bound on the gate's precision against the floor, and the audited cuts' TP / FP."""
    from srollout.report.figures import pyplot, save_figure

    plt = pyplot()
    m = metrics.filter(pl.col("gate/threshold").is_not_nan()).sort("iteration")
    fig, axes = plt.subplots(1, 3, figsize=(14, 4))
    seeds = sorted(set(m["seed"].to_list()))  # an arm's colour, a seed's line style and marker
    for (arm, seed), part in m.group_by(["arm", "seed"], maintain_order=True):
        label, x = f"{arm} seed {seed}", part["iteration"].to_list()
        i = seeds.index(seed)
        look = dict(color=arm_color(str(arm)), ls=("-", "--", ":", "-.")[i % 4], label=label)
        axes[0].step(x, part["gate/threshold"].to_list(), where="post", **look)
        axes[1].plot(x, part["gate/precision_lb"].to_list(), marker="o^sDv"[i % 5], ms=3, **look)
    totals = (
        m.group_by("iteration")
        .agg(pl.col("gate/audit_tp").sum(), pl.col("gate/audit_fp").sum())
        .sort("iteration")
    )
    it, tp = totals["iteration"].to_list(), totals["gate/audit_tp"].to_list()
    axes[2].bar(it, tp, color="tab:green", label="TP (zero-variance)")
    axes[2].bar(it, totals["gate/audit_fp"].to_list(), bottom=tp, color="tab:red", label="FP")
    axes[1].axhline(floor, color="black", ls="--", lw=1, label=f"floor {floor:g}")
    from matplotlib.ticker import MaxNLocator

    titles = ("gate threshold each iteration ran with", "precision lower bound (95 %)", "audits")
    for ax, title in zip(axes, titles, strict=True):
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_xlabel("iteration")
        ax.set_title(title, fontsize=9)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle("Audited gate: threshold, precision bound and audits over training")
    fig.tight_layout()
    return save_figure(fig, path)


def audit_frame(metrics: pl.DataFrame) -> pl.DataFrame:
    """``--audit``: per audited (arm, seed), the audits' totals, the last precision bound and
    how the threshold moved (first and last value it ran with)."""
    m = metrics.filter(pl.col("gate/threshold").is_not_nan()).sort("iteration")
    return m.group_by(["arm", "seed"], maintain_order=True).agg(
        pl.col("gate/cuts").sum().alias("cuts"),
        pl.col("gate/audited").sum().alias("audited"),
        pl.col("gate/audit_tp").sum().alias("audit_tp"),
        pl.col("gate/audit_fp").sum().alias("audit_fp"),
        pl.col("gate/precision_lb").last().alias("last_precision_lb"),
        pl.col("gate/threshold").first().alias("first_threshold"),
        pl.col("gate/threshold").last().alias("last_threshold"),
        pl.col("gate/audit_steps").sum().alias("audit_steps"),
        pl.col("rollout/env_steps").sum().alias("env_steps"),
    )


def stops_frame(metrics: pl.DataFrame) -> pl.DataFrame:
    """The trajectory gate, per (arm, seed) of an arm that stopped or audited a trajectory:
    stops (trajectories ended), judged TP / FP and precision (``--judge-cuts``: a stop is right
    iff its twin failed; nan when not judged), audited stops with their TP / FP, the W the arm
    ran with first and last (``--audit``), and the last bound on stop precision."""
    cols = set(metrics.columns)
    judged, audited = "gate/stop_tp" in cols, "gate/stall_W" in cols
    active = pl.col("gate/stalled") > 0
    if audited:
        active = active | (pl.col("gate/stall_W") > 0)
    arms = sorted(set(metrics.filter(active)["arm"].to_list())) if metrics.height else []

    def col(name: str, how: str, default: float) -> pl.Expr:
        return getattr(pl.col(name), how)() if name in cols else pl.lit(default)

    out = (
        metrics.filter(pl.col("arm").is_in(arms))
        .sort("iteration")
        .group_by(["arm", "seed"], maintain_order=True)
        .agg(
            pl.col("gate/stalled").sum().alias("stops"),
            col("gate/stop_tp", "sum", 0).alias("stop_tp"),
            col("gate/stop_fp", "sum", 0).alias("stop_fp"),
            col("gate/stop_audited", "sum", 0).alias("audited"),
            col("gate/stop_audit_tp", "sum", 0).alias("audit_tp"),
            col("gate/stop_audit_fp", "sum", 0).alias("audit_fp"),
            col("gate/stall_W", "first", 0).alias("first_W"),
            col("gate/stall_W", "last", 0).alias("last_W"),
            col("gate/stop_precision_lb", "last", float("nan")).alias("last_precision_lb"),
        )
    )
    n = pl.col("stop_tp") + pl.col("stop_fp")
    precision = (
        pl.when(pl.lit(judged) & (n > 0)).then(pl.col("stop_tp") / n).otherwise(float("nan"))
    )
    return out.with_columns(precision.alias("stop_precision"))
