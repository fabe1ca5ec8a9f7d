"""The sweep table of `srollout sweep`: one row per (rule, K, d_L[, t_high]) with the gate's
outcome beside the random-cut baseline and the oracle (:func:`sweep_table`, the formulas in
:mod:`srollout.core.sweep`), the operating point chosen from it (:func:`choose`), and what the
sweep family shares: reading a buffer within T_max (:func:`load_run`), the folds check and the
console headers of every sweep table.

Under ``--objective measured`` only (the default sweep's outputs are unchanged): choose by what a
cut saves (real environment steps, and generated tokens where ``steps.n_gen_tokens`` has no
null), checked against a random cut of the same size (``measured_vs_random``). The definitions:
docs/gates.md ("What the operating point maximises").
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from srollout.config import SweepConfig
from srollout.core.gate import GateRule
from srollout.core.sweep import (
    choose_operating_point,
    evaluate_grid,
    measured_share,
    random_cut_expectation,
    random_measured_share,
)
from srollout.errors import SrolloutError
from srollout.report.markdown import Section, doc_link
from srollout.report.tables import to_markdown
from srollout.stages.buffer import Buffer, load_buffer

D_K = "prefix_edit_distance_mean"
TAU_K = "termination_fraction"
# short console headers of every sweep table: the whole row must fit an ordinary terminal
SHORT = {
    "selection": "judged",
    "n_cut": "cut",
    "tp": "TP",
    "fp": "FP",
    "precision": "prec",
    "safe_savings": "safe",
    "raw_savings": "raw",
    "measured_step_savings": "meas",
    "adv_l2_kept": "L2",
    "share_of_oracle": "of oracle",
    "random_safe_savings": "rnd safe",
    "random_adv_l2_kept": "rnd L2",
    "random_measured_step_savings": "rnd meas",
    "measured_vs_random": "meas/rnd",
    "measured_token_savings": "meas tok",
    "random_measured_token_savings": "rnd tok",
    "n_stops": "stops",
    "step_savings": "steps",
    "token_savings": "tokens",
    "random_precision": "rnd prec",
    "random_step_savings": "rnd steps",
}
# the measured objective's columns, in report.md and in the console
SHOWN_REPORT = (
    "random_measured_step_savings",
    "measured_vs_random",
    "measured_token_savings",
    "random_measured_token_savings",
)
SHOWN_CONSOLE = SHOWN_REPORT[:2]
# the random baseline's columns kept in the table
_RANDOM = ("tp", "precision", "safe_savings", "raw_savings", "measured_step_savings", "adv_l2_kept")
_ORACLE = ("n_cut", "safe_savings", "raw_savings", "measured_step_savings")


def load_run(path: Path, Ks: tuple[int, ...], T_max: int, progress: Callable | None = None):
    """The buffer of ``path`` at ``Ks`` (:func:`srollout.stages.buffer.load_buffer`); one
    SrolloutError when its trajectories run longer than T_max (every saving would be wrong)."""
    buffer = load_buffer(path, Ks, default_K=Ks, progress=progress)
    if buffer.has_step_counts:
        longest = int(buffer.groups["n_steps"].list.max().max())
        if longest > T_max:
            raise SrolloutError(
                f"{path}: trajectories run up to {longest} steps, more than --T-max {T_max}; pass "
                f"--T-max {longest} or more"
            )
    return buffer


def check_folds(n_folds: int, n_groups: int, source: Any) -> None:
    """Cross-fitting holds out each fold once, so a fold needs a group: more folds than groups is
    one SrolloutError (not a silent cap)."""
    if n_folds > n_groups:
        raise SrolloutError(
            f"--n-folds {n_folds} is more than the {n_groups} groups of {source}: each fold holds "
            f"out at least one group; give --n-folds {n_groups} or fewer"
        )


def cut_mask(
    d_K: np.ndarray, tau_K: np.ndarray, rule: str, K: int, d_L: float, t_high: float | None
) -> np.ndarray:
    """bool[N]: the groups the gate (rule, K, d_L[, t_high]) cuts, by
    :meth:`srollout.core.gate.GateRule.decide_arrays`, so the sweep scores exactly the decisions the
    saved gate.json will make."""
    return GateRule(rule=rule, K=K, d_L=d_L, t_high=t_high).decide_arrays(d_K, tau_K)


def sweep_table(buffer: Buffer, config: SweepConfig, progress: Any | None = None) -> pl.DataFrame:
    """One row per (rule, K, d_L[, t_high]) with the gate's outcome, the random-cut baseline with
    the same number of cuts (its expectation over uniformly random cuts, in closed form) and the
    oracle. progress: an optional ``(done, total)`` callback, called after each K."""
    rules = ("r1", "r3") if config.rule == "both" else (config.rule,)
    adv_sq = buffer.advantage_sq_norms()
    rows: list[dict[str, Any]] = []
    if progress is not None:
        progress(0, len(config.K))
    for k_done, K in enumerate(config.K):
        at = buffer.at_K(K)
        zero_var, d_K, tau_K = (at[c].to_numpy() for c in ("zero_var", D_K, TAU_K))
        steps = ("remaining_steps", "total_steps") if buffer.has_step_counts else ()
        common = {c: at[c].to_numpy() for c in steps} | {"adv_sq": adv_sq}
        gates = [
            (rule, d_L, t_high)
            for rule in rules
            for d_L in config.d_L_grid
            for t_high in ((None,) if rule == "r1" else config.t_high_grid)
        ]
        cuts = np.stack([cut_mask(d_K, tau_K, rule, K, d_L, t_high) for rule, d_L, t_high in gates])
        grid = evaluate_grid(cuts, zero_var, K, config.T_max, **common)
        del cuts
        oracle = evaluate_grid(zero_var.astype(bool), zero_var, K, config.T_max, **common).row(0)
        random_by_n: dict[int, Any] = {}  # rows with the same number of cuts share a baseline
        for m, (rule, d_L, t_high) in enumerate(gates):
            outcome = grid.row(m)
            if outcome.n_cut not in random_by_n:
                random_by_n[outcome.n_cut] = random_cut_expectation(
                    outcome.n_cut, zero_var, K, config.T_max, **common
                )
            rnd = random_by_n[outcome.n_cut]
            rows.append(
                {
                    "rule": rule,
                    "K": K,
                    "d_L": float(d_L),
                    "t_high": None if t_high is None else float(t_high),
                    **outcome._asdict(),
                    **{f"random_{f}": float(getattr(rnd, f)) for f in _RANDOM},
                    **{f"oracle_{f}": getattr(oracle, f) for f in _ORACLE},
                    "n_groups": len(zero_var),
                    "n_zero_var": int(zero_var.sum()),
                }
            )
        if progress is not None:
            progress(k_done + 1, len(config.K))
    df = pl.DataFrame(rows, infer_schema_length=None)
    return df.with_columns(
        [pl.col(c).cast(pl.Int64) for c in ("n_cut", "tp", "fp", "oracle_n_cut")]
        + [pl.col("t_high").cast(pl.Float64)]
    )


def choose(sweep: pl.DataFrame, precision_floor: float, objective: str = "safe") -> int | None:
    """Index of the row with the largest safe savings (objective "measured": measured step
    savings) among those with precision ≥ the floor (ties: higher precision, then smaller d_L) —
    :func:`srollout.core.sweep.choose_operating_point`."""
    return choose_operating_point(sweep.to_dicts(), precision_floor, objective)


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
    pairs = zip(sweep["measured_step_savings"], sweep["random_measured_step_savings"], strict=True)
    ratio = pl.Series([_ratio(a, b) for a, b in pairs], dtype=pl.Float64)
    sweep = sweep.with_columns(measured_vs_random=ratio)
    tokens = token_costs(buffer, tuple(config.K))
    if not tokens:
        return sweep
    meas, rnd = [], []
    cache: dict[int, tuple[np.ndarray, np.ndarray]] = {}
    for row in sweep.iter_rows(named=True):
        K = row["K"]
        if K not in cache:
            at = buffer.at_K(K)
            cache[K] = (at[D_K].to_numpy(), at[TAU_K].to_numpy())
        cut = cut_mask(*cache[K], row["rule"], K, row["d_L"], row["t_high"])
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
    return "measured saving — " + "; ".join(
        f"{r['cost']}: gate {r['gate']:.3f} vs random cut {r['random cut, same #cuts']:.3f} "
        f"(× {r['gate / random']:.2f})"
        for r in table.iter_rows(named=True)
    )


def random_measured_of_cuts(
    cut: np.ndarray,
    cut_K: np.ndarray,
    remaining_by_K: Mapping[int, np.ndarray] | None,
    total: np.ndarray | None,
) -> float:
    """A random cut with as many groups cut at each step as the gate's decisions (cut bool[N],
    cut_K int[N]): Σ_K n_cut_at_K/N · Σ remaining_K / Σ total (linearity of expectation)."""
    if remaining_by_K is None or total is None:
        return math.nan
    value = 0.0
    for K in np.unique(cut_K[cut]):
        n = int((cut & (cut_K == K)).sum())
        value += random_measured_share(n, remaining_by_K[int(K)], total)
    return value
