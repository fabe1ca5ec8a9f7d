"""What `srollout ab-rollout` shows (docs/ab-rollout.md, "What the report says"): the per-arm,
savings, confusion and timed-run tables, the seed-match proof, and the figures (matplotlib
imported inside the figure functions)."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from srollout.report.figures import pyplot, save_figure
from srollout.report.markdown import Section, doc_link, figure, write_report
from srollout.report.palette import arm_color
from srollout.report.tables import num, pct, to_markdown

# The sections of docs/ab-rollout.md that explain what the report shows
NOISE = "Noise the task bootstrap does not see"
ARMS_DOC = "DAPO and GRESO arms (rollout-only)"
AUDIT_DOC = "`--audit F`: the audited arms"
REPORT_DOC = "What the report says (`report.md`, console table, `manifest.json` → `comparisons`)"
COMPARED_DOC = "What is compared"
ATTRIBUTION_DOC = "Per-task wall-clock: attribution inside a batched run"

# Where a wall-clock saving comes from: Comparison.decomposition's key, in the text, in the figure
SOURCES = (
    ("generation", "generation", "generation", "#1f77b4"),
    ("environment", "environment steps and resets", "environment (steps + resets)", "#2ca02c"),
    ("overhead", "overhead", "overhead", "#ff7f0e"),
)


def _judged(n: int, tp: int, fp: int) -> str:
    """A count with its TP / FP: ``5 (3 / 2)``."""
    return f"{n} ({tp} / {fp})"


def savings_frame(c: Any, blocks: pl.DataFrame | None = None) -> pl.DataFrame:
    """The headline table of one comparison: metric, baseline, arm, saving, 95 % CI (strings);
    with ``blocks`` (blocks.parquet) also the range of the per-block wall-clock savings."""
    rows = []

    def row(metric: str, saving: str = "", ci: str = "", base: str = "", arm: str = "") -> None:
        rows.append((metric, base, arm, saving, ci))

    for key, s in c.savings.items():
        digits = 2 if key == "wall_s" else 0  # seconds; counts of tokens and steps
        ci = f"[{pct(s.low)}, {pct(s.high)}] ({s.ci_over})"
        row(s.metric, pct(s.saving), ci, num(s.baseline, digits), num(s.arm, digits))
        if key == "wall_s":
            base, arm = (num(x / c.n_tasks, 2) for x in (s.baseline, s.arm))
            row("mean per-task wall-clock (s)", f"{c.task_diff.diff:+.2f} s", "", base, arm)
    if blocks is not None:
        saving = block_savings_frame(blocks, c.arm)["saving"]
        spread = f"{pct(float(saving.min()))} … {pct(float(saving.max()))}"
        row("wall-clock saving per timed block", spread, f"{saving.len()} block(s)")
    est, low, high = c.ratio
    ci = f"[{num(low, 2)}, {num(high, 2)}] (target ≥ 0.9)"
    row("wall-clock saving ÷ token saving", num(est, 2), ci)
    k = c.confusion
    row("groups cut (TP / FP by baseline)", base="0", arm=_judged(k.cut, k.tp, k.fp))
    row("precision / recall (baseline-judged)", f"{num(k.precision, 2)} / {num(k.recall, 2)}")
    row("paper step-based safe / raw saving", f"{pct(k.safe)} / {pct(k.raw)}")
    row("seed match up to K", pct(c.match.share), arm=f"{c.match.n_match}/{c.match.n_traj}")
    names = ("metric", "baseline", c.arm, "saving", "95% CI (over)")
    return pl.DataFrame(rows, schema={n: pl.Utf8 for n in names}, orient="row")


def block_savings_frame(blocks: pl.DataFrame, arm: str) -> pl.DataFrame:
    """Per (repeat, block): the baseline's and ``arm``'s measured wall-clock of the same groups and
    the share saved. The task bootstrap does not see drift that hits a whole timed run; the
    spread of these per-block savings does."""

    def runs(name: str, *more: str) -> pl.DataFrame:
        return blocks.filter(pl.col("arm") == name).select(
            "repeat",
            "block",
            pl.col("wall_s").alias(f"{name}_s"),
            pl.col("order").alias(f"{name}_order"),
            *more,
        )

    both = runs("baseline").join(runs(arm, "n_cut"), on=["repeat", "block"]).sort("repeat", "block")
    return both.with_columns((1.0 - pl.col(f"{arm}_s") / pl.col("baseline_s")).alias("saving"))


def drift_text(c: Any, per_block: pl.DataFrame) -> str:
    """The spread of the per-block savings and the wall-clock interval, with a link to why."""
    lo, hi = float(per_block["saving"].min()), float(per_block["saving"].max())
    w = c.savings["wall_s"]
    text = (
        f"Wall-clock saving per timed block ranges from {pct(lo)} to {pct(hi)}. Wall-clock "
        f"interval: [{pct(w.low)}, {pct(w.high)}] over {w.ci_over}; why over the pairs: "
        + doc_link("ab-rollout.md", NOISE)
        + "."
    )
    if same_work(c):
        text += (
            "\n\n**The gate cut no group**: both arms did identical work "
            f"({num(c.savings['n_gen_tokens'].baseline, 0)} generated tokens, the same "
            "environment steps): an A/A test, whose wall-clock difference is this machine's noise."
        )
    return text


def same_work(c: Any) -> bool:
    """The arm cut nothing and took the baseline's environment steps (no GRESO skip either): an
    A/A test."""
    return c.confusion.cut == 0 and c.savings["n_steps"].arm == c.savings["n_steps"].baseline


def confusion_frame(c: Any) -> pl.DataFrame:
    k = c.confusion
    rows = [
        ("(task, repeat) pairs", str(k.n)),
        ("zero-variance groups in the baseline arm", str(k.zero_var)),
        ("groups cut", str(k.cut)),
        ("TP (cut, baseline zero-variance)", str(k.tp)),
        ("FP (cut, baseline has variance)", str(k.fp)),
        ("precision TP / cut", num(k.precision, 3)),
        ("recall TP / zero-variance", num(k.recall, 3)),
        (
            "precision by the arm's own truncated rewards (wrong; for contrast)",
            num(k.own_precision, 3),
        ),
        ("paper safe saving TP·(T−K)/(N·T)", pct(k.safe)),
        ("paper raw saving cut·(T−K)/(N·T)", pct(k.raw)),
        ("measured env-step saving", pct(c.savings["n_steps"].saving)),
    ]
    return pl.DataFrame(rows, schema={"metric": pl.Utf8, "value": pl.Utf8}, orient="row")


# blocks.parquet: the schedule's columns, then the optional ones present (--audit's last, the
# group gate's before the trajectory gate's)
_BLOCK_COLUMNS = (
    "order arm repeat block groups wall_s gen_s env_s reset_s overhead_s ticks mean_batch "
    "n_gen_tokens n_cut"
).split()
_BLOCK_EXTRA = "n_useful n_skipped n_extra extra_rounds hit_cap workers".split()
_BLOCK_DIGITS = {s: 2 for s in ("wall_s", "gen_s", "env_s", "reset_s", "overhead_s")}
_BLOCK_DIGITS["mean_batch"] = 1


def blocks_frame(blocks: pl.DataFrame) -> pl.DataFrame:
    """The timed runs in schedule order (``groups``: groups rolled out, DAPO's extra rounds
    included)."""
    audit = [
        c for c in blocks.columns if c.startswith(("audit", "stop_", "stall_W", "next_stall_W"))
    ]
    return blocks.select(*_BLOCK_COLUMNS, *[c for c in _BLOCK_EXTRA if c in blocks.columns], *audit)


def _audit_cell(r: dict[str, Any]) -> str:
    """``--audit``: audited cuts (TP / FP), the last bound, the threshold the audit ended on; and
    the same for the trajectory gate's stops and W."""
    parts = []
    if r.get("audited") is not None:
        parts.append(
            f"{_judged(r['audited'], r['audit_tp'], r['audit_fp'])}, bound "
            f"{num(r['audit_precision_lb'], 2)}, "
            f"threshold {r['audit_threshold']:.3g} → {r['audit_next_threshold']:.3g}"
        )
    if r.get("stop_audited") is not None:
        parts.append(
            f"stops {_judged(r['stop_audited'], r['stop_audit_tp'], r['stop_audit_fp'])}, bound "
            f"{num(r['stop_precision_lb'], 2)}, W {r['stall_W']} → {r['next_stall_W']}"
        )
    return "; ".join(parts) or "—"


def _stall_cell(r: dict) -> str:
    """An arm's trajectory-gate stops judged by their baseline twins: count (TP / FP), precision."""
    if not r["stalls"]:
        return "—"
    judged = r["stall_tp"] + r["stall_fp"]
    precision = f"{r['stall_tp'] / judged:.2f}" if judged else "—"
    return f"{_judged(r['stalls'], r['stall_tp'], r['stall_fp'])}, {precision}"


def arms_view(arms: pl.DataFrame) -> pl.DataFrame:
    """arms.parquet as strings for the console and report.md: one row per arm (with ``--audit``,
    the audit's totals of each gated arm)."""
    stalled = "stalls" in arms.columns and bool(arms["stalls"].sum())
    rows = []
    for r in arms.iter_rows(named=True):
        vs = f"{num(r['useful_per_s_vs_baseline'], 2)}× / {num(r['wall_vs_baseline'], 2)}×"
        dapo = f"{r['extra_rounds']} / {r['extra_groups']}, {r['cap_hits']}"
        matched = f"{r['traj_matched']}/{r['traj_compared']}"
        row = {
            "arm": r["arm"],
            "wall-clock (s)": num(r["wall_s"], 2),
            "gen. tokens": f"{r['gen_tokens']:,}",
            "groups": str(r["groups"]),
            "useful": str(r["useful_groups"]),
            "useful/s": num(r["useful_per_s"], 3),
            "vs baseline: useful/s, wall": "" if r["arm"] == "baseline" else vs,
            "cuts (TP/FP)": _judged(r["cuts"], r["cut_tp"], r["cut_fp"]) if r["gate"] else "—",
            "skips (TP/FP)": _judged(r["skipped"], r["skip_tp"], r["skip_fp"])
            if r["greso"]
            else "—",
            "DAPO extra rounds/groups, caps": dapo if r["dapo"] else "—",
            "seed match": "" if r["traj_compared"] is None else matched,
        }
        if stalled:
            row["trajectories stopped (TP/FP by twin), precision"] = _stall_cell(r)
        if "audited" in arms.columns:
            row["audit (TP/FP), last bound, threshold last run → next"] = _audit_cell(r)
        rows.append(row)
    return pl.DataFrame(rows, schema={n: pl.Utf8 for n in rows[0]} if rows else None)


def arms_text(config: Any, arms: pl.DataFrame) -> str:
    """The arms' settings and what only this run tells (cap hits, a GRESO without history); the
    numbers are in the table, what each column counts in the doc linked."""
    text = (
        f"Totals over {config.repeats} repeat(s) of {config.groups} tasks per arm; cuts and skips "
        "judged by the baseline arm. What each column counts: "
        + doc_link("ab-rollout.md", ARMS_DOC)
        + "."
    )
    for r in arms.filter(pl.col("dapo")).iter_rows(named=True):
        text += (
            f"\n\n**{r['arm']}**: DAPO, at most {config.dapo_max_rounds} extra round(s) a block."
        )
        if r["cap_hits"]:
            text += (
                f" **{r['cap_hits']} timed block(s) hit the cap** (`--dapo-max-rounds "
                f"{config.dapo_max_rounds}`) and kept what they gathered."
            )
    if any("greso" in str(a).split("+") for a in arms["arm"]):
        history = config.greso_history
        text += f"\n\n**GRESO**: p = {config.greso_p_explore}, seed {config.seed}, " + (
            f"history `{history}`."
            if history
            else "no `--greso-history`: an optimistic GRESO (the doc above says why)."
        )
    if "audited" in arms.columns and config.audit > 0:
        text += (
            f"\n\n**Audited gate** (`--audit {config.audit:g} --audit-floor "
            f"{config.audit_floor:g}`): each gated arm audited a share of its cuts, each stall arm "
            "of its stops; " + doc_link("ab-rollout.md", AUDIT_DOC) + "."
        )
    return text


def dapo_frame(blocks: pl.DataFrame, arm: str) -> pl.DataFrame:
    """Per timed run of a DAPO arm: groups rolled, useful ones, extra rounds and groups, cap hit."""
    columns = "order repeat block groups n_useful extra_rounds n_extra hit_cap wall_s n_gen_tokens"
    return blocks.filter(pl.col("arm") == arm).sort("order").select(columns.split())


def stops_figure(tables: dict, arms: Sequence[str], path: Path) -> Path | None:
    """Where the stall arms stopped trajectories (repeat 0; repeats share their seeds): stops per
    step, right (the baseline twin failed) and wrong (it won) stacked; None without a stop."""
    base = pl.read_parquet(tables[("baseline", 0)]["trajectories"]).select(
        "group_id", "traj_idx", "success"
    )
    stops = {}
    for arm in arms:
        trajs = pl.read_parquet(tables[(arm, 0)]["trajectories"])
        stalled = trajs.filter(pl.col("ended_by") == "stalled").select(
            "group_id", "traj_idx", "n_steps"
        )
        stops[arm] = stalled.join(base, on=["group_id", "traj_idx"], how="inner")
    if not any(df.height for df in stops.values()):
        return None
    plt = pyplot()
    fig, axes = plt.subplots(1, len(stops), figsize=(5.5 * len(stops), 3.4), squeeze=False)
    for ax, (arm, df) in zip(axes[0], stops.items(), strict=True):
        steps = sorted(set(df["n_steps"].to_list())) or [0]
        right = [df.filter((pl.col("n_steps") == t) & ~pl.col("success")).height for t in steps]
        wrong = [df.filter((pl.col("n_steps") == t) & pl.col("success")).height for t in steps]
        ax.bar(steps, right, color=arm_color(arm), label="right (twin failed)")
        ax.bar(steps, wrong, bottom=right, color="#d62728", label="wrong (twin won)")
        n = df.height
        ax.set_title(f"{arm}: {n} stops, precision {sum(right) / n:.2f}" if n else arm)
        ax.set_xlabel("step of the stop")
        ax.set_ylabel("trajectories stopped")
        ax.legend(fontsize=8)
    return save_figure(fig, path)


def task_time_figure(table: pl.DataFrame, path: Path, arms: Sequence[str]) -> Path:
    """Per-task wall-clock (attributed, mean over repeats) by arm; tasks in baseline-time order,
    cut tasks of the gated arm hatched."""
    plt = pyplot()
    means = (
        table.group_by("group_index", "arm")
        .agg(pl.col("wall_s").mean(), pl.col("cut").any())
        .sort("group_index")
    )
    base = means.filter(pl.col("arm") == arms[0]).sort("wall_s", descending=True)
    order = base["group_index"].to_list()
    n = len(order)
    fig, ax = plt.subplots(figsize=(max(6.0, 0.28 * n * len(arms) + 2), 3.8))
    width = 0.8 / len(arms)
    for j, arm in enumerate(arms):
        rows = {
            r["group_index"]: r for r in means.filter(pl.col("arm") == arm).iter_rows(named=True)
        }
        xs = np.arange(n) + (j - (len(arms) - 1) / 2) * width
        ys = [rows[i]["wall_s"] for i in order]
        bars = ax.bar(xs, ys, width=width, color=arm_color(arm), label=arm)
        for bar, i in zip(bars, order, strict=True):
            if rows[i]["cut"]:
                bar.set_hatch("///")
                bar.set_edgecolor("black")
    from matplotlib.patches import Patch

    handles, _ = ax.get_legend_handles_labels()
    handles.append(
        Patch(facecolor="white", edgecolor="black", hatch="///", label="cut by the gate")
    )
    ax.set_xticks(range(n), [f"g{i}" for i in order], rotation=90, fontsize=6)
    ax.set_xlabel("task (group index), by baseline time")
    ax.set_ylabel("wall-clock per task (s, attributed)")
    ax.set_title("Per-task rollout time by arm (same tasks, same seeds)", fontsize=10)
    ax.legend(handles=handles, fontsize=8)
    return save_figure(fig, path, tight=True)


def decomposition_figure(comparisons: Sequence[Any], path: Path) -> Path:
    """For each compared arm, the wall-clock saving as % of the baseline wall-clock, stacked by
    where it came from (generation, environment steps + resets, overhead), beside the measured
    generated-token and env-step savings."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(3.0 + 2.4 * len(comparisons), 3.8))
    ticks, labels = [], []
    for i, c in enumerate(comparisons):
        d = c.decomposition
        total = d["baseline_wall"] or math.nan
        pos = neg = 0.0
        x = i * 3.5
        for key, _, name, color in SOURCES:
            v = 100 * d[key] / total
            ax.bar(
                x,
                v,
                bottom=pos if v >= 0 else neg,
                color=color,
                label=name if i == 0 else None,
                width=0.8,
            )
            pos, neg = (pos + v, neg) if v >= 0 else (pos, neg + v)
        ax.bar(x + 1, 100 * c.savings["n_gen_tokens"].saving, color="#9467bd", width=0.8)
        ax.bar(x + 2, 100 * c.savings["n_steps"].saving, color="#8c564b", width=0.8)
        ticks += [x, x + 1, x + 2]
        labels += [f"{c.arm}:\nwall-clock", "generated\ntokens", "env\nsteps"]
    ax.axhline(0, color="black", linewidth=0.8)
    ax.set_xticks(ticks, labels, fontsize=8)
    ax.set_ylabel("saving vs baseline (%)")
    ax.set_title("Wall-clock saving by source, beside token and step savings", fontsize=9)
    ax.legend(fontsize=7, loc="lower left", bbox_to_anchor=(0.0, 1.08), ncol=3, frameon=False)
    ax.grid(alpha=0.3, axis="y")
    return save_figure(fig, path, tight=True)


def _mismatch_text(c: Any) -> str:
    m = c.match
    if m.n_traj == 0:
        return "No gated trajectories to compare."
    what = (
        "actions, raw responses and token ids"
        if m.tokens_checked
        else "actions and raw responses (this policy records no token ids)"
    )
    text = (
        f"{m.n_match} of {m.n_traj} {c.arm}-arm trajectories ({pct(m.share)}) are identical to "
        f"their baseline twin up to step K in {what}: "
        + doc_link("ab-rollout.md", REPORT_DOC)
        + "."
    )
    if m.mismatches:
        rows = ", ".join(
            f"{x.group_id}/{x.traj_idx} (repeat {x.repeat}, step "
            f"{x.step if x.step is not None else 'tokens only'})"
            for x in m.mismatches[:10]
        )
        text += f"\n\n**{len(m.mismatches)} differ** — first: {rows}."
    return text


def method_text(config: Any, blocks: pl.DataFrame, env: Any = None) -> str:
    """The report's method paragraph. env: ``--env``'s EnvSpec (the plan's; resolved here when
    None)."""
    from srollout.envs.registry import resolve_env
    from srollout.envs.tasks import rooms_note

    env = env if env is not None else resolve_env(config.env)

    n_arms = blocks["arm"].n_unique()
    runs = blocks.sort("order")["arm"].to_list()
    order = " ".join(a[0].upper() for a in runs) if n_arms == 2 else ", ".join(runs)
    workers = int(blocks["workers"].max()) if "workers" in blocks.columns else 1
    ray = (
        f" Every timed run went through {workers} Ray workers (`--workers {workers}`): "
        + doc_link("ab-rollout.md", "`--workers N`: the timed runs on Ray")
        + "."
    )
    return (
        f"{'Both' if n_arms == 2 else f'All {n_arms}'} arms roll the same {config.groups} tasks of "
        f"`{config.tasks}`"
        + (
            rooms_note(config.tasks, config.difficulty)
            if "difficulty" in env.task_options
            else f" of environment `{config.env}`"
        )
        + f" (G={config.G}, T_max={config.T_max}, temperature {config.temperature}, seed "
        f"{config.seed}) through the same batched engine at concurrency {config.concurrency} "
        f"trajectories.{ray if workers > 1 else ''} "
        + ("A warm-up ran before any clock. " if config.warmup else "No warm-up (--no-warmup). ")
        + f"{config.repeats} repeat(s) × {config.blocks} block(s) of tasks; run order: {order} "
        f"(ABBA over blocks). Token and step CIs: a bootstrap over tasks ({config.n_boot} "
        "resamples). How the tasks are matched, the wall-clock attributed and the intervals "
        "computed: "
        + ", ".join(doc_link("ab-rollout.md", h) for h in (COMPARED_DOC, ATTRIBUTION_DOC, NOISE))
        + "."
    )


def write_ab_outputs(
    run_dir: Path,
    config: Any,
    table: pl.DataFrame,
    blocks: pl.DataFrame,
    comparisons: Sequence[Any],
    tables: dict,
    arms: pl.DataFrame | None = None,
    env: Any = None,
) -> dict[str, Path]:
    """ab.parquet, blocks.parquet, arms.parquet (when ``arms`` is given), the figures and report.md;
    returns name -> path. env: ``--env``'s EnvSpec as the stage's plan resolved it."""
    from srollout.schemas import AB, AB_ARMS
    from srollout.schemas import write as write_parquet

    run_dir = Path(run_dir)
    paths = {
        "ab": write_parquet(table, run_dir / "ab.parquet", AB),
        "blocks": write_parquet(blocks_frame(blocks), run_dir / "blocks.parquet"),
    }
    if arms is not None:
        paths["arms"] = write_parquet(arms, run_dir / "arms.parquet", AB_ARMS)
    names = list(dict.fromkeys(blocks.sort("order")["arm"].to_list()))
    names = ["baseline", *[a for a in names if a != "baseline"]]
    if config.figures:
        paths["task_time"] = task_time_figure(
            table.filter(pl.col("dapo_round") == 0) if "dapo_round" in table.columns else table,
            run_dir / "figures" / "ab_task_time.png",
            names,
        )
        if comparisons:
            paths["decomposition"] = decomposition_figure(
                comparisons, run_dir / "figures" / "ab_saving_decomposition.png"
            )
        stall_arms = [] if arms is None else arms.filter(pl.col("stall"))["arm"].to_list()
        if stall_arms:
            stops = stops_figure(tables, stall_arms, run_dir / "figures" / "ab_stops.png")
            if stops is not None:
                paths["stops"] = stops
    sections = []
    if arms is not None:
        view = to_markdown(arms_view(arms)) + "\n" + arms_text(config, arms)
        sections.append(Section("Arms", view))
        for arm in arms.filter(pl.col("dapo"))["arm"]:
            rounds = to_markdown(dapo_frame(blocks, arm), digits={"wall_s": 2})
            sections.append(Section(f"DAPO rounds ({arm})", rounds))
    for c in comparisons:
        per_block = block_savings_frame(blocks, c.arm)
        noise = to_markdown(per_block, digits={"baseline_s": 2, f"{c.arm}_s": 2, "saving": 3})
        d = c.decomposition
        total = d["baseline_wall"] or math.nan
        saved = [f"{d[key]:.1f} s of {what} ({pct(d[key] / total)})" for key, what, *_ in SOURCES]
        body = (
            f"Of the baseline's {d['baseline_wall']:.1f} s, the {c.arm} arm saved {saved[0]}, "
            f"{saved[1]} and {saved[2]}."
        )
        if "decomposition" in paths:
            body += "\n\n" + figure(paths["decomposition"], run_dir, "Wall-clock saving by source")
        sections += [
            Section(
                f"{c.arm} vs baseline",
                f"Gate: `{json.dumps(c.gate)}`\n\n" + to_markdown(savings_frame(c, blocks)),
            ),
            Section(
                f"Cuts of the {c.arm} arm judged by the baseline arm",
                to_markdown(confusion_frame(c)),
            ),
            Section(f"Seed match ({c.arm})", _mismatch_text(c)),
            Section(f"Run-to-run noise ({c.arm})", noise + "\n" + drift_text(c, per_block)),
            Section(f"Where the saving comes from ({c.arm})", body),
        ]
    if "stops" in paths:
        stops = figure(paths["stops"], run_dir, "Stops by step, judged by the baseline twin")
        why = "A stop is right when its baseline twin failed: " + doc_link(
            "ab-rollout.md", COMPARED_DOC
        )
        sections.append(
            Section("Trajectories stopped by the trajectory gate", f"{stops}\n\n{why}.")
        )
    if "task_time" in paths:
        caption = "Per-task wall-clock by arm (attributed, mean over repeats)"
        sections.append(Section("Per-task time", figure(paths["task_time"], run_dir, caption)))
    timed = to_markdown(blocks_frame(blocks), digits=_BLOCK_DIGITS)
    sections.append(Section("Timed runs (schedule order)", timed))
    sections.append(Section("Method", method_text(config, blocks, env)))
    files = [p for p in paths.values()] + [p for t in tables.values() for p in t.values()]
    sections.append(
        Section("Files", "\n".join(f"- `{Path(p).relative_to(run_dir)}`" for p in files))
    )
    paths["report"] = write_report(run_dir, "srollout ab-rollout", sections)
    return paths
