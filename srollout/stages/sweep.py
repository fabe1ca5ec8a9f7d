"""`srollout sweep`: sweep the gate's thresholds on an offline buffer and choose an operating point
under a precision floor (paper §4.4, App. "Setting the precision floor", "Calibration against
random-cut and oracle gates", "Bootstrap confidence intervals", "The OR-rule extension").

Story: read the buffer → for every (rule, K, d_L[, t_high]) cut the groups the rule fires on and
score the cuts (:func:`srollout.core.sweep.evaluate_cuts`; the formulas in
:mod:`srollout.core.sweep`) next to a random-cut baseline with the same number of cuts and the
oracle → choose the row with the largest savings (``--objective``) whose precision clears the floor
→ bootstrap CIs over groups for it → write sweep.parquet, gate.json (only if a row clears the
floor), the Pareto PNG and report.md.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import polars as pl

from srollout import schemas
from srollout.config import GateFitConfig, StallFitConfig, SweepConfig
from srollout.core.gate import GateRule
from srollout.core.sweep import GateOutcome
from srollout.report.markdown import Section, doc_link, figure, write_report
from srollout.report.tables import to_markdown, to_rich
from srollout.rundir import Manifest, _jsonable, prepare_run_dir
from srollout.stages import sweep_gates, sweep_stall
from srollout.stages import sweep_table as table
from srollout.stages.buffer import Buffer
from srollout.stages.sweep_table import D_K, TAU_K, choose, cut_mask, sweep_table

GATE_FILE = "gate.json"
# groups from which sweep shows a bar over its K values (one K of a million groups: ~2 s)
SWEEP_BAR_FROM = 500_000
# columns shown in the console and in report.md (sweep.parquet holds them all): the gate's outcome
# and the random cut's beside it
_SHOWN = ("rule", "K", "d_L", "t_high", *GateOutcome._fields, "random_safe_savings")
_SHOWN += ("random_adv_l2_kept",)


class Interval(NamedTuple):
    """A bootstrap estimate over groups: point estimate and percentile interval."""

    name: str
    estimate: float
    low: float
    high: float


class OperatingPoint(NamedTuple):
    """The chosen row of the sweep and its bootstrap confidence intervals (over groups)."""

    row: int
    rule: str
    K: int
    d_L: float
    t_high: float | None
    intervals: tuple[Interval, ...]
    n_resamples: int
    level: float


class SweepResult(NamedTuple):
    run_dir: Path
    sweep: pl.DataFrame
    chosen: OperatingPoint | None
    outputs: tuple[Path, ...]


def bootstrap_operating_point(
    buffer: Buffer, sweep: pl.DataFrame, index: int, config: SweepConfig
) -> OperatingPoint:
    """Percentile bootstrap over groups (``config.n_boot`` resamples, seeded) of the chosen
    point's safe and raw savings, precision, and measured step savings.

    Each of these depends on the groups only through sums (of TP, cut, saved and real steps), so
    one draw of multinomial counts of the distinct per-group rows
    (:func:`srollout.core.stats.bootstrap_sums`) is the row bootstrap at a cost that does not
    grow with N; all four intervals come from the same resamples."""
    from srollout.core.stats import bootstrap_sums, sums_ci

    row = sweep.row(index, named=True)
    K = row["K"]
    at = buffer.at_K(K)
    cut = cut_mask(
        at[D_K].to_numpy(), at[TAU_K].to_numpy(), row["rule"], K, row["d_L"], row["t_high"]
    )
    tp = cut & at["zero_var"].to_numpy()
    per_step = (config.T_max - K) / config.T_max
    columns = [tp, cut]
    if buffer.has_step_counts:
        columns += [
            np.where(cut, at["remaining_steps"].to_numpy(), 0),
            at["total_steps"].to_numpy(),
        ]
    sums = bootstrap_sums(
        np.column_stack(columns).astype(np.float64), n_resamples=config.n_boot, seed=config.seed
    )
    # the mean of per-group contributions is the savings formula: Σ_g tp_g·(T_max−K)/T_max / N
    statistics = {
        "safe_savings": lambda s, n: s[..., 0] * per_step / n,
        "raw_savings": lambda s, n: s[..., 1] * per_step / n,
    }
    if cut.any():
        statistics["precision"] = lambda s, n: s[..., 0] / s[..., 1]
    if buffer.has_step_counts:
        statistics["measured_step_savings"] = lambda s, n: s[..., 2] / s[..., 3]
    cis = {name: sums_ci(sums, f) for name, f in statistics.items()}
    intervals = tuple(
        Interval(name, float(ci.estimate), float(ci.low), float(ci.high))
        for name, ci in cis.items()
    )
    level = cis["safe_savings"].level
    return OperatingPoint(
        index, row["rule"], K, row["d_L"], row["t_high"], intervals, config.n_boot, level
    )


def run_sweep(
    config: SweepConfig,
    console: Any | None = None,
    gates: GateFitConfig | None = None,
    progress: bool = True,
    stall: StallFitConfig | None = None,
) -> SweepResult:
    """Run the sweep stage; returns the table, the chosen operating point (or None) and the files.
    gates (``--learned`` / ``--adaptive``, :mod:`srollout.stages.sweep_gates`) and stall
    (``--stall``, :mod:`srollout.stages.sweep_stall`) add their tables, gate files and report
    sections; without them the outputs are exactly the plain sweep's. progress: bars for the long
    parts."""
    from srollout.console import make_console
    from srollout.progress import PhaseBars

    console = console or make_console()
    t0 = time.perf_counter()

    bars = PhaseBars(
        console, enabled=progress, unit={"read steps": "parts", "signals": "groups", "sweep": "K"}
    )
    with bars:
        buffer = table.load_run(config.input, config.K, config.T_max, progress=bars.phase)
    t_load = time.perf_counter() - t0
    n_folds = (gates or GateFitConfig()).n_folds
    gates = gates if gates is not None and gates.any else None
    stall = stall if stall is not None and stall.stall else None
    measured = config.objective == "measured"
    if measured:
        table.require_step_counts(buffer, config)

    with bars:
        # a bar over the K values only where one K takes seconds (a million groups)
        sweep = sweep_table(
            buffer,
            config,
            progress=bars.phase("sweep") if buffer.n_groups >= SWEEP_BAR_FROM else None,
        )
    if measured:
        sweep = table.add_columns(sweep, buffer, config)
    index = choose(sweep, config.precision_floor, config.objective)
    chosen = bootstrap_operating_point(buffer, sweep, index, config) if index is not None else None
    sweep = sweep.with_columns(
        chosen=pl.int_range(pl.len()) == (index if index is not None else -1)
    )
    if chosen is not None:
        for iv in chosen.intervals:
            sweep = sweep.with_columns(
                pl.when(pl.col("chosen")).then(iv.low).otherwise(None).alias(f"{iv.name}_ci_low"),
                pl.when(pl.col("chosen")).then(iv.high).otherwise(None).alias(f"{iv.name}_ci_high"),
            )
    schemas.validate(sweep, schemas.SWEEP, "sweep table")
    gate = (
        GateRule(rule=chosen.rule, K=chosen.K, d_L=chosen.d_L, t_high=chosen.t_high)
        if chosen is not None
        else None
    )
    extras = []  # what --learned/--adaptive and --stall add: (manifest key, options, module, out)
    if gates is not None:
        comparison = sweep_gates.compare_gates(config, gates, sweep)
        extras.append(("gates_config", gates, sweep_gates, comparison))
    if stall is not None:
        stalls = sweep_stall.sweep_stall(config, stall, n_folds=n_folds)
        extras.append(("stall_config", stall, sweep_stall, stalls))
    t_compute = time.perf_counter() - t0 - t_load

    # every check passed: only now create the run directory
    run_dir = prepare_run_dir(config.out, "sweep", overwrite=config.overwrite)
    manifest = Manifest(run_dir, "sweep", config)
    manifest.data["timings_s"].update(load=round(t_load, 3), compute=round(t_compute, 3))
    outputs = [schemas.write(sweep, run_dir / schemas.SWEEP.filename, schemas.SWEEP)]
    if gate is not None:
        gate.save(run_dir / GATE_FILE)
        outputs.append(run_dir / GATE_FILE)
    from srollout.report import figures as figs

    pareto = figs.pareto(
        sweep,
        run_dir / "pareto.png",
        config.precision_floor,
        index,
        f"N={buffer.n_groups} groups, {int(sweep['n_zero_var'][0])} zero-variance",
    )
    outputs.append(pareto)
    sections = _report_sections(config, buffer, sweep, chosen, pareto, run_dir)
    if measured:
        sections.insert(2, table.report_section(sweep, index, config))
    for key, options, module, result in extras:
        manifest.data[key] = _jsonable(options)
        outputs.extend(module.write(run_dir, result))
        sections.append(module.report_section(result, config))
    outputs.append(
        write_report(run_dir, "srollout sweep", sections, _preamble(config, buffer, sweep))
    )
    manifest.complete(
        outputs,
        input=str(config.input),
        n_groups=buffer.n_groups,
        chosen=None
        if chosen is None
        else {
            "rule": chosen.rule,
            "K": chosen.K,
            "d_L": chosen.d_L,
            "t_high": chosen.t_high,
            **{iv.name: iv._asdict() for iv in chosen.intervals},
        },
    )
    outputs.append(manifest.path)
    for _, _, module, result in extras:
        module.print_table(console, result, config)
    _print(console, sweep, chosen, config, run_dir, outputs)
    return SweepResult(run_dir, sweep, chosen, tuple(outputs))


def _preamble(config: SweepConfig, buffer: Buffer, sweep: pl.DataFrame) -> str:
    n, zv = buffer.n_groups, int(sweep["n_zero_var"][0])
    steps = (
        "real step counts present: measured savings are real remaining environment steps"
        if buffer.has_step_counts
        else "no step counts in the input: measured savings not available"
    )
    adv = (
        "rewards present: advantage L² share computed"
        if buffer.has_rewards
        else "no per-trajectory rewards: advantage L² share not available"
    )
    return "\n".join(
        [
            f"- input: `{config.input}` ({buffer.kind}); N = "
            f"{n} groups, {zv} zero-variance ({zv / n:.0%})",
            f"- rule {config.rule}; K = {', '.join(map(str, config.K))}; d_L grid "
            f"{', '.join(f'{v:g}' for v in config.d_L_grid)}"
            + (
                f"; t_high grid {', '.join(f'{v:g}' for v in config.t_high_grid)}"
                if config.rule != "r1"
                else ""
            ),
            f"- T_max = {config.T_max}; precision floor {config.precision_floor:g}; "
            f"{config.n_boot} bootstrap resamples; random baseline: the expectation over uniformly "
            f"random cuts (closed form); seed {config.seed}",
            f"- {steps}; {adv}",
        ]
    )


def _report_sections(config, buffer, sweep, chosen, pareto, run_dir) -> list[Section]:
    shown = [c for c in _SHOWN if c in sweep.columns]
    if config.objective == "measured":
        shown += [c for c in table.SHOWN_REPORT if c in sweep.columns]
    bold = [chosen.row] if chosen is not None else []
    sections = [
        Section(
            "Sweep",
            "The chosen row is in bold. The columns, and all of them in `sweep.parquet`: "
            + doc_link("artifacts.md", "sweep.parquet — one row per (rule, K, d_L, t_high) (sweep)")
            + ".\n\n"
            + to_markdown(sweep, columns=shown, bold_rows=bold),
        )
    ]
    if chosen is None:
        sections.append(
            Section(
                "Operating point",
                "**No operating point clears the precision floor "
                f"{config.precision_floor:g}.** No gate.json was written; widen "
                "the grid, try another K or rule, or collect more groups.\n",
            )
        )
    else:
        ivs = pl.DataFrame([iv._asdict() for iv in chosen.intervals])
        rule = f"d_K < {chosen.d_L:g}" + (
            f" or τ_K ≥ {chosen.t_high:g}" if chosen.rule == "r3" else ""
        )
        sections.append(
            Section(
                "Operating point",
                f"Chosen: **{chosen.rule.upper()} at K={chosen.K}: cut iff {rule}** — the largest "
                f"{'measured step' if config.objective == 'measured' else 'safe'} savings with "
                f"precision ≥ {config.precision_floor:g}. Saved to `gate.json` "
                f"(use it with `--gate gate.json`). {chosen.level:.0%} percentile bootstrap "
                f"intervals over groups ({chosen.n_resamples} resamples, seed {config.seed}):\n\n"
                + to_markdown(ivs)
                + (f"\n{_edge_note(chosen, config)}\n" if _edge_note(chosen, config) else ""),
            )
        )
    first = sweep.row(chosen.row if chosen is not None else 0, named=True)
    policies = {  # policy -> the prefix of its columns in the row
        "oracle (cut every zero-variance group)": "oracle_",
        "gate" if chosen is not None else "gate (first row)": "",
        "random cut, same #cuts": "random_",
    }
    calib = pl.DataFrame(
        [
            {
                "policy": name,
                "n_cut": first[f"{p}n_cut" if p == "oracle_" else "n_cut"],
                **{c: first[p + c] for c in ("safe_savings", "measured_step_savings")},
                "adv_l2_kept": 1.0 if p == "oracle_" else first[p + "adv_l2_kept"],
            }
            for name, p in policies.items()
        ],
        strict=False,
    )
    sections.append(Section(f"Calibration at K={first['K']}", to_markdown(calib)))
    sections.append(
        Section(
            "Savings against precision",
            figure(pareto, run_dir, "Safe savings vs precision per swept threshold"),
        )
    )
    return sections


def _edge_note(chosen: OperatingPoint | None, config: SweepConfig) -> str:
    """A hint when the chosen d_L is the grid's largest: a larger d_L might clear the floor too."""
    if chosen is None or len(config.d_L_grid) < 2 or chosen.d_L < max(config.d_L_grid):
        return ""
    return (
        f"The chosen d_L = {chosen.d_L:g} is the largest of the grid; a wider --d-L-grid may find "
        "more savings above the floor."
    )


def _print(console, sweep, chosen, config, run_dir, outputs) -> None:
    shown = [
        c
        for c in _SHOWN
        if c in sweep.columns
        and c != "random_adv_l2_kept"
        and (c != "t_high" or config.rule != "r1")
    ]
    if config.objective == "measured":
        shown += [c for c in table.SHOWN_CONSOLE if c in sweep.columns]
    rich = to_rich(
        sweep,
        title="Gate sweep (savings as shares; meas = real steps; rnd = random cut, same #cuts)",
        columns=shown,
        digits={"t_high": 2},
        headers=table.SHORT,
        highlight_rows=[chosen.row] if chosen is not None else [],
    )
    if chosen is None:
        # the warning row: no row is chosen (the message itself goes in the caption, which may wrap)
        rich.add_row("none", *["—"] * (len(shown) - 1), style="bold yellow")
        rich.caption = (
            f"[bold yellow]no operating point with precision ≥ {config.precision_floor:g}: no "
            "gate.json written[/]"
        )
    console.print(rich)
    if chosen is None:
        console.print(
            "[bold yellow]warning:[/] no operating point clears the precision floor "
            f"{config.precision_floor:g}; no gate.json written"
        )
    else:
        safe = chosen.intervals[0]
        console.print(
            f"chosen: {chosen.rule} K={chosen.K} d_L={chosen.d_L:g}"
            + (f" t_high={chosen.t_high:g}" if chosen.t_high is not None else "")
            + f"; safe savings {safe.estimate:.3f} [{safe.low:.3f}, {safe.high:.3f}] -> "
            f"{run_dir / GATE_FILE}"
        )
        if _edge_note(chosen, config):
            console.print(f"[yellow]note:[/] {_edge_note(chosen, config)}")
        if config.objective == "measured":
            console.print(f"objective measured; {table.console_line(sweep, chosen.row)}")
    console.print(
        f"wrote {len(outputs)} files to [bold]{run_dir}[/] (report: {run_dir / 'report.md'})"
    )
