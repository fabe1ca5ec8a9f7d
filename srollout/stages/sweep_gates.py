"""`srollout sweep --learned / --adaptive`: gates chosen on one set of groups and judged on another,
reported beside R1 and R3 under the same protocol (in-sample and cross-fitted rows), with
bootstrap CIs over groups; the final learned/adaptive gates are fit on every INPUT group and
written as gate-learned.json / gate-adaptive.json. The procedure: docs/gates.md ("Chosen on one
set of groups, judged on another").
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import polars as pl

from srollout.config import GateFitConfig, SweepConfig
from srollout.core.adaptive_gate import AdaptiveGate, evaluate_variable_cuts, fit_adaptive_gate
from srollout.core.gate import GateRule, check_step
from srollout.core.learned_gate import (
    FEATURE_SETS,
    SIGNAL_FIELDS,
    LearnedGate,
    assign_folds,
    fit_learned_gate,
    gate_selector,
    nested_heldout_cuts,
)
from srollout.core.stats import bootstrap_ci, ratio_of_sums
from srollout.core.sweep import GateOutcome, choose_operating_point, evaluate_grid, threshold_cuts
from srollout.errors import SrolloutError
from srollout.report.markdown import Section, doc_link
from srollout.report.tables import to_markdown, to_rich
from srollout.stages.buffer import Buffer
from srollout.stages.sweep_table import (
    SHORT,
    SHOWN_CONSOLE,
    check_folds,
    load_run,
    random_measured_of_cuts,
    require_step_counts,
)

LEARNED_FILE = "gate-learned.json"
ADAPTIVE_FILE = "gate-adaptive.json"
GATES_TABLE = "gates.parquet"

# shown in report.md and the console, with short console headers
_SHOWN = ("gate", "selection", "K", *(f for f in GateOutcome._fields if f != "adv_l2_kept"))
_SHOWN += ("share_of_oracle",)
_CI_FIELDS = (
    "safe_savings",
    "raw_savings",
    "measured_step_savings",
    "precision",
    "recall",
    "share_of_oracle",
)


class GroupData(NamedTuple):
    """Per-group arrays of one buffer at the K values used: signals_by_K[K] [N, S] (S = 7, or 9
    with ``--features all``: :data:`srollout.core.learned_gate.FEATURE_SETS`), zero_var [N],
    remaining_by_K[K] [N] real steps after K (None without step counts), total_steps [N] or None,
    advantages (N arrays) or None; names: the signal of each column of signals_by_K[K]."""

    signals_by_K: Mapping[int, np.ndarray]
    zero_var: np.ndarray
    remaining_by_K: Mapping[int, np.ndarray] | None
    total_steps: np.ndarray | None
    advantages: list[np.ndarray] | None
    names: tuple[str, ...] = ()

    def named(self, K: int, rows: np.ndarray | slice = slice(None)) -> dict[str, np.ndarray]:
        """The signals at K of the groups ``rows``, by name (what ``Gate.decide_batch`` reads)."""
        return dict(zip(self.names, self.signals_by_K[K][rows].T, strict=True))


class GateComparison(NamedTuple):
    """table: one row per (gate, selection); held_out: gate (r1, r3, learned, adaptive) -> its
    held-out decisions (cut [N], cut_K [N]) on the judged groups, in group_id order."""

    table: pl.DataFrame
    learned: LearnedGate | None
    adaptive: AdaptiveGate | None
    protocol: str
    held_out: Mapping[str, tuple[np.ndarray, np.ndarray]] = {}


def group_data(buffer: Buffer, Ks: tuple[int, ...], features: str = "classic") -> GroupData:
    """Arrays of ``buffer`` at every K of ``Ks`` (groups in group_id order at every K); the
    signals of the feature set ``features``. A step signal that ``features`` needs and the buffer
    lacks (absent, or no finite value at these K) is one SrolloutError."""
    fields = FEATURE_SETS[features]
    for name in fields[len(SIGNAL_FIELDS) :]:
        values = (
            buffer.signals.filter(pl.col("K").is_in(list(Ks)))[name].cast(pl.Float64)
            if name in buffer.signals.columns
            else pl.Series([], dtype=pl.Float64)
        )
        if not values.fill_nan(None).drop_nulls().len():
            raise SrolloutError(
                f"{buffer.source}: --features {features} needs the step signal {name}, which this "
                "buffer lacks (a signals table written before it, or steps without the column it "
                "reads); use --features classic"
            )
    signals, remaining = {}, {}
    zero_var = buffer.groups["zero_var"].to_numpy().astype(bool)
    for K in Ks:
        at = buffer.at_K(K)
        signals[K] = at.select(list(fields)).to_numpy().astype(np.float64)
        if buffer.has_step_counts:
            remaining[K] = at["remaining_steps"].to_numpy().astype(np.float64)
    total = (
        buffer.groups["total_steps"].to_numpy().astype(np.float64)
        if buffer.has_step_counts
        else None
    )
    remaining = remaining if buffer.has_step_counts else None
    return GroupData(signals, zero_var, remaining, total, buffer.advantages(), tuple(fields))


# --- selection procedures (Selector: train groups -> decide(test groups) -> (cut, cut_K)) -------


def _threshold_selector(
    data: GroupData, eval_data: GroupData, rule: str, config: SweepConfig
) -> Callable:
    """R1/R3: choose (K, d_L[, t_high]) on the train groups by the sweep's rule (largest safe —
    or, objective measured, measured step — savings with precision ≥ floor), apply it to the
    test groups of ``eval_data``."""

    def fit(train: np.ndarray) -> GateRule | None:
        rows, params = [], []
        t_vals = config.t_high_grid if rule == "r3" else None
        steps = {}
        for K in config.K:
            s = data.named(K, train)
            tau = s["termination_fraction"] if rule == "r3" else None
            cuts = threshold_cuts(s["prefix_edit_distance_mean"], config.d_L_grid, tau, t_vals)
            if config.objective == "measured":
                steps = dict(
                    remaining_steps=data.remaining_by_K[K][train],
                    total_steps=data.total_steps[train],
                )
            grid = evaluate_grid(cuts, data.zero_var[train], K, config.T_max, **steps)
            # the rows of threshold_cuts: d_L outer, t_high inner
            at_K = [(K, d_L, t) for d_L in config.d_L_grid for t in (t_vals or (None,))]
            params += at_K
            rows += [
                {"precision": p, "safe_savings": safe, "measured_step_savings": meas, "d_L": d_L}
                for p, safe, meas, (_, d_L, _) in zip(
                    grid.precision, grid.safe_savings, grid.measured_step_savings, at_K, strict=True
                )
            ]
        i = choose_operating_point(rows, config.precision_floor, config.objective)
        return None if i is None else GateRule(rule, *params[i])

    return gate_selector(fit, _at_own_K(eval_data))


def _at_own_K(data: GroupData) -> Callable:
    """decide(gate, groups) of a fixed-K gate: its (cut, cut_K) on those groups of ``data``
    (a gate None cuts nothing)."""

    def decide(gate: Any, test: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        if gate is None:
            return np.zeros(test.size, dtype=bool), np.zeros(test.size, dtype=np.int64)
        return gate.decide_batch(gate.K, data.named(gate.K, test)), np.full(test.size, gate.K)

    return decide


# --- scoring held-out decisions --------------------------------------------------------------


def score_row(
    gate: str,
    selection: str,
    K_label: int,
    cut: np.ndarray,
    cut_K: np.ndarray,
    data: GroupData,
    K_ref: int,
    config: SweepConfig,
) -> dict[str, Any]:
    """One table row: the outcome of the decisions (cut, cut_K) on the groups of ``data``, the
    oracle at K_ref and bootstrap CIs over groups."""
    T = config.T_max
    zv = data.zero_var
    N = zv.size
    if data.remaining_by_K is not None:
        remaining = np.zeros(N)  # real steps after each cut group's own cut step
        for K in np.unique(cut_K[cut]):
            cut_at_K = cut & (cut_K == K)
            remaining[cut_at_K] = data.remaining_by_K[int(K)][cut_at_K]
        total = data.total_steps
    else:
        remaining = total = None
    out = evaluate_variable_cuts(
        cut, np.where(cut, cut_K, 1), zv, T, remaining, total, data.advantages
    )
    oracle_gain = (T - K_ref) / T
    oracle_safe = float(zv.sum()) * oracle_gain / N
    gain = np.where(cut, (T - cut_K) / T, 0.0)
    tp = cut & zv
    row: dict[str, Any] = {
        "gate": gate,
        "selection": selection,
        "K": K_label,
        **out._asdict(),
        "oracle_K": K_ref,
        "oracle_safe_savings": oracle_safe,
        "share_of_oracle": out.safe_savings / oracle_safe if oracle_safe > 0 else math.nan,
        "n_groups": N,
        "n_zero_var": int(zv.sum()),
    }
    # statistic None: the mean of [N] values; a ratio of sums reads a batch of resamples
    boot = dict(n_resamples=config.n_boot, seed=config.seed, batched=True)
    samples = {
        "safe_savings": (np.where(tp, gain, 0.0), None),
        "raw_savings": (gain, None),
        "precision": (np.column_stack([tp, cut]).astype(float), ratio_of_sums),
        "recall": (np.column_stack([tp, zv]).astype(float), ratio_of_sums),
        "share_of_oracle": (
            np.column_stack([np.where(tp, gain, 0.0), zv * oracle_gain]),
            ratio_of_sums,
        ),
    }
    if remaining is not None:
        samples["measured_step_savings"] = (
            np.column_stack([remaining * cut, total]),
            ratio_of_sums,
        )
    if config.objective == "measured":
        rnd = random_measured_of_cuts(cut, cut_K, data.remaining_by_K, data.total_steps)
        row["random_measured_step_savings"] = rnd
        row["measured_vs_random"] = out.measured_step_savings / rnd if rnd > 0 else math.nan
    for name in _CI_FIELDS:
        low = high = math.nan
        if name in samples and not (name == "precision" and not cut.any()):
            x, stat = samples[name]
            ci = bootstrap_ci(x, statistic=stat, **boot)
            low, high = float(ci.low), float(ci.high)
        row[f"{name}_ci_low"], row[f"{name}_ci_high"] = low, high
    return row


# --- the comparison ---------------------------------------------------------------------------


def compare_gates(config: SweepConfig, gates: GateFitConfig, sweep: pl.DataFrame) -> GateComparison:
    """The gate comparison table (held-out decisions only for learned/adaptive) and the final gates.

    sweep: the plain sweep table of INPUT (its chosen rows give the in-sample R1/R3 reference)."""
    Ks = tuple(sorted(set(config.K) | set(gates.check_K)))
    for k in gates.check_K:
        check_step(k, config.T_max, "check_K")
    buffer = _load(config.input, Ks, config.T_max)
    if config.objective == "measured":
        require_step_counts(buffer, config)
    data = group_data(buffer, Ks, gates.features)
    if gates.eval_buffer is not None:
        eval_data = group_data(_load(gates.eval_buffer, Ks, config.T_max), Ks, gates.features)
        protocol = f"fit on {config.input}, judged on {gates.eval_buffer}"
        selection = "eval buffer"
    else:
        eval_data = data
        protocol = f"{gates.n_folds}-fold cross-fitting over groups (seed {config.seed})"
        selection = "cross-fitted"
    # nested cross-fitting needs each class in every inner training set: >= 3 groups of each
    # (>= 2 when only the inner level runs, with --eval-buffer)
    need = 2 if gates.eval_buffer is not None else 3
    n_zv = int(data.zero_var.sum())
    if min(n_zv, data.zero_var.size - n_zv) < need:
        raise SrolloutError(
            f"{config.input}: {n_zv} zero-variance and {data.zero_var.size - n_zv} other groups; "
            f"the learned/adaptive gates need at least {need} of each to be fit and judged on "
            "different groups (collect more groups)"
        )
    if gates.eval_buffer is None:
        check_folds(gates.n_folds, data.zero_var.size, config.input)
    K_ref = min(config.K)
    folds = assign_folds(data.zero_var, gates.n_folds, config.seed)
    rows: list[dict[str, Any]] = []
    held_out: dict[str, tuple[np.ndarray, np.ndarray]] = {}

    def judge(name: str, select: Callable, fit: Callable | None = None) -> Any:
        """Score ``name``'s held-out decisions (its whole selection rerun without the judged
        groups); return its gate fit on every INPUT group (``fit``; None without)."""
        if gates.eval_buffer is not None:
            cut, cut_K = select(np.arange(data.zero_var.size))(np.arange(eval_data.zero_var.size))
        else:
            cut, cut_K, _ = nested_heldout_cuts(select, folds)
        held_out[name] = (cut, cut_K)
        gate = fit() if fit is not None else None
        if name == "adaptive":
            label_K = min(gates.check_K)
        else:
            label_K = _label_K(cut, cut_K, K_ref if gate is None else gate.K)
        rows.append(score_row(name, selection, label_K, cut, cut_K, eval_data, K_ref, config))
        return gate

    for rule in ("r1", "r3") if config.rule == "both" else (config.rule,):
        # the plain sweep's choice for this rule, scored on the same groups it was chosen on
        part = sweep.filter(pl.col("rule") == rule)
        chosen = choose_operating_point(part.to_dicts(), config.precision_floor, config.objective)
        K_in, cut = K_ref, np.zeros(data.zero_var.size, dtype=bool)
        if chosen is not None:
            point = part.row(chosen, named=True)
            K_in = point["K"]
            gate = GateRule(rule=rule, K=K_in, d_L=point["d_L"], t_high=point["t_high"])
            cut = gate.decide_batch(K_in, data.named(K_in))
        rows.append(
            score_row(rule, "in-sample", K_in, cut, np.full(cut.size, K_in), data, K_ref, config)
        )
        judge(rule, _threshold_selector(data, eval_data, rule, config))

    common = dict(n_folds=gates.n_folds, l2=gates.l2, seed=config.seed, names=data.names)
    if config.objective == "measured":
        common["gain_by_K"] = data.remaining_by_K
    learned = adaptive = None
    args = (data.signals_by_K, data.zero_var)
    if gates.learned:

        def fit_learned(groups: np.ndarray | None = None) -> LearnedGate:
            floor, T_max = config.precision_floor, config.T_max
            return fit_learned_gate(*args, config.K, Ks, T_max, floor, groups=groups, **common).gate

        select = gate_selector(fit_learned, _at_own_K(eval_data))
        learned = judge("learned", select, fit_learned)
    if gates.adaptive:

        def fit_adaptive(groups: np.ndarray | None = None) -> AdaptiveGate:
            floor, T_max = config.precision_floor, config.T_max
            return fit_adaptive_gate(
                *args, gates.check_K, floor, T_max, groups=groups, **common
            ).gate

        def decide_adaptive(gate: AdaptiveGate, test: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
            return gate.decide_matrix({K: eval_data.signals_by_K[K][test] for K in gate.check_K})

        adaptive = judge("adaptive", gate_selector(fit_adaptive, decide_adaptive), fit_adaptive)
    oracle = eval_data.zero_var.copy()
    rows.append(
        score_row(
            "oracle", "labels", K_ref, oracle, np.full(oracle.size, K_ref), eval_data, K_ref, config
        )
    )
    table = pl.DataFrame(rows, infer_schema_length=None)
    return GateComparison(table, learned, adaptive, protocol, held_out)


def _label_K(cut: np.ndarray, cut_K: np.ndarray, default: int) -> int:
    """The K shown for a fixed-K family: the most common cut step (folds may choose differently)."""
    if not cut.any():
        return default
    values, counts = np.unique(cut_K[cut], return_counts=True)
    return int(values[np.argmax(counts)])


def _load(path: Path, Ks: tuple[int, ...], T_max: int) -> Buffer:
    try:
        return load_run(path, Ks, T_max)
    except SrolloutError as err:
        # the buffer names the K it lacks as "--K"; here it may come from --check-K
        raise SrolloutError(str(err).replace("--K ", "--K/--check-K ", 1)) from None


def write(run_dir: Path, comparison: GateComparison) -> list[Path]:
    """gates.parquet and the learned/adaptive gate files."""
    out = [run_dir / GATES_TABLE]
    comparison.table.write_parquet(out[0])
    if comparison.learned is not None:
        out.append(comparison.learned.save(run_dir / LEARNED_FILE))
    if comparison.adaptive is not None:
        out.append(comparison.adaptive.save(run_dir / ADAPTIVE_FILE))
    return out


def report_section(comparison: GateComparison, config: SweepConfig) -> Any:
    t = comparison.table
    ci = t.select(
        "gate",
        "selection",
        *[
            pl.format(
                "[{}, {}]", pl.col(f"{f}_ci_low").round(3), pl.col(f"{f}_ci_high").round(3)
            ).alias(f"{f} CI")
            for f in _CI_FIELDS
        ],
    )
    parts = [
        f"Protocol: {comparison.protocol}; learned and adaptive rows are held-out decisions "
        f"only, R1/R3 also `in-sample`; oracle at K={min(config.K)}; precision floor "
        f"{config.precision_floor:g} enforced on held-out scores ("
        + doc_link("gates.md", "Chosen on one set of groups, judged on another")
        + ").\n",
        to_markdown(t, columns=[c for c in _SHOWN + SHOWN_CONSOLE if c in t.columns]),
        f"\n{round(100 * 0.95)}% percentile bootstrap intervals over groups ({config.n_boot} "
        f"resamples, seed {config.seed}):\n",
        to_markdown(ci),
    ]
    for name, gate in (("learned", comparison.learned), ("adaptive", comparison.adaptive)):
        if gate is None:
            continue
        coef = pl.DataFrame(
            {
                "feature": list(gate.model.feature_names),
                "coef (standardised)": list(gate.model.coef),
                "mean": list(gate.model.mean),
                "std": list(gate.model.std),
            }
        )

        def fmt(t: float | None) -> str:
            return "never" if t is None else f"P ≥ {t:.4f}"

        where = (
            f"K={gate.K}, cut iff {fmt(gate.threshold)}"
            if name == "learned"
            else "; ".join(
                f"K={k}: {fmt(t_)}" for k, t_ in zip(gate.check_K, gate.thresholds, strict=True)
            )
        )
        parts.append(
            f"\n**{name} gate** (`{LEARNED_FILE if name == 'learned' else ADAPTIVE_FILE}`, fit on "
            f"every input group; {where}; intercept {gate.model.intercept:.3f}; positive "
            "coefficients push towards cutting):\n"
        )
        parts.append(to_markdown(coef))
    return Section("Learned and adaptive gates", "\n".join(parts))


def print_table(console: Any, comparison: GateComparison, config: SweepConfig) -> None:
    t = comparison.table
    console.print(
        to_rich(
            t,
            title=f"Gates judged on held-out groups ({comparison.protocol})",
            columns=[c for c in _SHOWN + SHOWN_CONSOLE if c in t.columns],
            headers=SHORT,
        )
    )
