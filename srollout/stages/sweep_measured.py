"""`srollout sweep --objective measured`: choose by what a cut saves (real environment steps, and
generated tokens where ``steps.n_gen_tokens`` has no null), and check it against a random cut of
the same size (``measured_vs_random``). The definitions: docs/gates.md ("What the operating point
maximises"). Everything here is added only under ``--objective measured``: the default sweep's
outputs are unchanged.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from srollout.config import SweepConfig
from srollout.errors import SrolloutError
from srollout.stages.buffer import Buffer

# console headers of the columns added here, and the ones sweep shows under the measured objective
SHORT = {
    "random_measured_step_savings": "rnd meas",
    "measured_vs_random": "meas/rnd",
    "measured_token_savings": "meas tok",
    "random_measured_token_savings": "rnd tok",
}
SHOWN_REPORT = (
    "random_measured_step_savings",
    "measured_vs_random",
    "measured_token_savings",
    "random_measured_token_savings",
)
SHOWN_CONSOLE = ("random_measured_step_savings", "measured_vs_random")


def require_step_counts(buffer: Buffer, config: SweepConfig) -> None:
    """One line and exit 2 when the measured objective has nothing to measure."""
    if not buffer.has_step_counts:
        raise SrolloutError(
            f"{config.input}: --objective measured needs real step counts (a steps.parquet, or a "
            "signals.parquet beside its trajectories.parquet); this input has none"
        )


def token_costs(buffer: Buffer, Ks: tuple[int, ...]) -> Mapping[int, tuple[np.ndarray, np.ndarray]]:
    """K -> (remaining [N], total [N]) generated tokens of every group (groups order): Σ
    n_gen_tokens over the steps t > K, and over all steps. Empty when the buffer was not read
    from steps or its ``n_gen_tokens`` is absent or has a null (a buffer from another tool)."""
    if buffer.kind != "steps":
        return {}
    steps_file = buffer.source / "steps.parquet" if buffer.source.is_dir() else buffer.source
    lazy = pl.scan_parquet(Path(steps_file))
    if "n_gen_tokens" not in lazy.collect_schema().names():
        return {}
    steps = lazy.select("group_id", "step", "n_gen_tokens").collect()
    if steps["n_gen_tokens"].null_count() or steps.height == 0:
        return {}
    tokens = pl.col("n_gen_tokens")
    order = buffer.groups.select("group_id")
    out = {}
    for K in Ks:
        per_group = steps.group_by("group_id").agg(
            remaining=tokens.filter(pl.col("step") > K).sum(), total=tokens.sum()
        )
        joined = order.join(per_group, on="group_id", how="left", maintain_order="left")
        out[K] = (
            joined["remaining"].fill_null(0).to_numpy().astype(np.float64),
            joined["total"].fill_null(0).to_numpy().astype(np.float64),
        )
    return out


def _ratio(a: float | None, b: float | None) -> float:
    if a is None or b is None or math.isnan(a) or math.isnan(b) or b <= 0:
        return math.nan
    return a / b


def add_columns(sweep: pl.DataFrame, buffer: Buffer, config: SweepConfig) -> pl.DataFrame:
    """The sweep table plus measured_vs_random and, where the buffer has generated tokens per
    step, measured_token_savings and random_measured_token_savings (one value per row)."""
    from srollout.core.gate import GateRule
    from srollout.core.sweep import measured_share, random_measured_share

    sweep = sweep.with_columns(
        measured_vs_random=pl.Series(
            [
                _ratio(a, b)
                for a, b in zip(
                    sweep["measured_step_savings"].to_list(),
                    sweep["random_measured_step_savings"].to_list(),
                    strict=True,
                )
            ],
            dtype=pl.Float64,
        )
    )
    tokens = token_costs(buffer, tuple(config.K))
    if not tokens:
        return sweep
    meas, rnd = [], []
    cache: dict[int, tuple[np.ndarray, np.ndarray]] = {}
    for row in sweep.iter_rows(named=True):
        K = row["K"]
        if K not in cache:
            at = buffer.at_K(K)
            cache[K] = (
                at["prefix_edit_distance_mean"].to_numpy(),
                at["termination_fraction"].to_numpy(),
            )
        d_K, tau_K = cache[K]
        # the decisions the sweep scored (stages.sweep.cut_mask; imported here it would loop)
        gate = GateRule(rule=row["rule"], K=K, d_L=row["d_L"], t_high=row["t_high"])
        cut = gate.decide_arrays(d_K, tau_K)
        remaining, total = tokens[K]
        meas.append(float(measured_share(cut, remaining, total)[0]))
        rnd.append(random_measured_share(int(row["n_cut"]), remaining, total))
    return sweep.with_columns(
        measured_token_savings=pl.Series(meas, dtype=pl.Float64),
        random_measured_token_savings=pl.Series(rnd, dtype=pl.Float64),
    )


def comparison(sweep: pl.DataFrame, index: int | None) -> pl.DataFrame | None:
    """For the chosen row: per cost (steps, generated tokens when present) the gate's measured
    saving, a random cut's of the same size, their ratio, and the oracle's (steps)."""
    if index is None:
        return None
    row = sweep.row(index, named=True)
    rows = [
        {
            "cost": "environment steps",
            "gate": row["measured_step_savings"],
            "random cut, same #cuts": row["random_measured_step_savings"],
            "gate / random": row["measured_vs_random"],
            "oracle": row["oracle_measured_step_savings"],
            "paper formula (safe)": row["safe_savings"],
        }
    ]
    if "measured_token_savings" in sweep.columns:
        rows.append(
            {
                "cost": "generated tokens",
                "gate": row["measured_token_savings"],
                "random cut, same #cuts": row["random_measured_token_savings"],
                "gate / random": _ratio(
                    row["measured_token_savings"], row["random_measured_token_savings"]
                ),
                "oracle": None,
                "paper formula (safe)": None,
            }
        )
    return pl.DataFrame(rows, strict=False, infer_schema_length=None)


def report_section(sweep: pl.DataFrame, index: int | None, config: SweepConfig) -> Any:
    from srollout.report.markdown import Section, doc_link
    from srollout.report.tables import to_markdown

    table = comparison(sweep, index)
    head = (
        f"Objective `measured`: the row with the largest measured step savings at precision ≥ "
        f"{config.precision_floor:g}, beside a random cut of the same size ("
        + doc_link(
            "gates.md",
            "What the operating point maximises, and what the gates read (`--objective`, "
            "`--features`)",
        )
        + "); every row's values: `sweep.parquet`.\n\n"
    )
    if table is None:
        body = "No row clears the floor: nothing to compare.\n"
    else:
        body = to_markdown(table)
        if "measured_token_savings" not in sweep.columns:
            body += (
                "\nNo generated-token counts per step in the input (steps.n_gen_tokens): token "
                "savings not measured.\n"
            )
    return Section("Measured saving against a random cut", head + body)


def console_line(sweep: pl.DataFrame, index: int | None) -> str | None:
    """One line for the chosen row: measured vs random-measured (steps, and tokens if present)."""
    table = comparison(sweep, index)
    if table is None:
        return None
    parts = []
    for r in table.iter_rows(named=True):
        parts.append(
            f"{r['cost']}: gate {r['gate']:.3f} vs random cut {r['random cut, same #cuts']:.3f} "
            f"(× {r['gate / random']:.2f})"
        )
    return "measured saving — " + "; ".join(parts)


def random_measured_of_cuts(
    cut: np.ndarray,
    cut_K: np.ndarray,
    remaining_by_K: Mapping[int, np.ndarray] | None,
    total: np.ndarray | None,
) -> float:
    """A random cut with as many groups cut at each step as the gate's decisions (cut bool[N],
    cut_K int[N]): Σ_K n_cut_at_K/N · Σ remaining_K / Σ total (linearity of expectation)."""
    from srollout.core.sweep import random_measured_share

    if remaining_by_K is None or total is None:
        return math.nan
    value = 0.0
    for K in np.unique(cut_K[cut]):
        n = int((cut & (cut_K == K)).sum())
        value += random_measured_share(n, remaining_by_K[int(K)], total)
    return value
