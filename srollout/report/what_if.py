"""What ``srollout what-if`` shows: the side-by-side table (console and markdown), its figure and
the settings to paste into TRL and verl."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import polars as pl

from srollout.report.figures import pyplot, save_figure
from srollout.report.tables import pct, to_markdown, to_rich

COLOURS = {
    "group gate": "#1f77b4",
    "trajectory gate": "#2ca02c",
    "loop detector": "#8c564b",
    "DAPO": "#ff7f0e",
}


def _precision(r: dict[str, Any]) -> str:
    if not r["decisions"]:
        return "—"
    return f"{r['precision']:.3f} [{r['precision_low']:.3f}, {r['precision_high']:.3f}]"


def table_view(table: pl.DataFrame) -> pl.DataFrame:
    """The side-by-side table's cells: precision with its interval, savings as percentages."""
    return table.select(
        "method",
        "setting",
        "decisions",
        "right",
        pl.Series("precision [95 % CI]", [_precision(r) for r in table.iter_rows(named=True)]),
        pl.Series("steps saved", [pct(x) for x in table["steps_saved"]], pl.Utf8),
        pl.Series("tokens saved", [pct(x) for x in table["tokens_saved"]], pl.Utf8),
        "note",
    )


def table_markdown(table: pl.DataFrame) -> str:
    return to_markdown(table_view(table))


def print_table(console: Any, table: pl.DataFrame, run_dir: Path) -> None:
    title = "What each method would do on this run (judged by its full outcomes)"
    view = table_view(table)
    console.print(to_rich(view, title, columns=view.columns[:-1]))
    for r in table.iter_rows(named=True):
        console.print(f"  {r['method']}: {r['note']}")
    console.print(f"wrote {run_dir} (report: {run_dir / 'report.md'})")


def bars(table: pl.DataFrame, path: Path, floor: float) -> Path:
    """Steps saved per method (bars) with each one's precision and interval written beside."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6.4, 3.2))
    names = table["method"].to_list()
    saved = [0.0 if math.isnan(x) else 100 * x for x in table["steps_saved"].to_list()]
    ax.barh(names, saved, color=[COLOURS.get(n, "#9467bd") for n in names])
    for i, r in enumerate(table.iter_rows(named=True)):
        label = f"precision {_precision(r)}" if r["decisions"] else "no decision"
        if r["method"] == "DAPO":
            label = "saves none: it filters after the whole rollout"
        ax.text(saved[i] + 0.3, i, label, va="center", fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("environment steps saved (%)")
    ax.set_xlim(0, max(max(saved) * 1.9, 10))
    ax.set_title(f"On this run's groups (gates held out, floor {floor:g})")
    return save_figure(fig, path)


def snippets(group_gate: Any, stall_gate: Any, config: Any) -> str:
    """The chosen settings as a TRL ``GatedRollout`` and a verl agent-loop entry."""
    gate_arg = 'gate=load_gate("gate.json")' if group_gate is not None else "gate=None"
    stall_arg = (
        f"traj_gate=StallGate(W={stall_gate.W}, k0={stall_gate.k0})"
        if stall_gate is not None
        else "traj_gate=None"
    )
    verl = ["srollout:"]
    verl.append("  gate: gate.json" if group_gate is not None else "  # no group gate cleared")
    if stall_gate is not None:
        verl += [f"  stall: {stall_gate.W}", f"  stall_from: {stall_gate.k0}"]
    return (
        "The gates chosen on all of this run's groups (gate.json, gate-stall.json here). Start "
        "in shadow (nothing is cut; each decision is logged and later scored), then let them "
        "act.\n\nTRL:\n\n```python\n"
        "from srollout.core.gate import load_gate\n"
        "from srollout.core.trajectory_gate import StallGate\n"
        'rollout = GatedRollout.from_env(ENV, "train", G=G, T_max='
        f"{config.T_max},\n    {gate_arg},\n    {stall_arg},\n"
        f"    dynamic_sampling=True, greso_p={config.greso_p:g},  # DAPO's refill, GRESO's skip\n"
        '    shadow=True, log_dir="runs/my-trl-log")\n```\n\n'
        "verl (the `srollout_gated` agent loop; DAPO is verl's own "
        "`algorithm.filter_groups.enable=true`):\n\n```yaml\n" + "\n".join(verl) + "\n"
        "  shadow: true\n```\n"
    )
