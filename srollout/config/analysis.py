"""The configs of the offline stages: ``analyze``, ``sweep`` and the gates ``sweep`` fits."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from srollout.config.common import (
    PAPER_D_L,
    PAPER_K,
    PAPER_PRECISION_FLOOR,
    PAPER_T_MAX,
    _check_choice,
    _check_K,
    _check_seed,
    _check_unit,
    check_at_least,
    doc,
)
from srollout.core.gate import check_step
from srollout.errors import SrolloutError


@dataclass(frozen=True)
class AnalyzeConfig:
    """`srollout analyze`: how well mid-rollout divergence predicts zero-variance groups."""

    input: Path = doc(
        Path("."), "A run directory, a steps.parquet or a signals.parquet (made by anyone)."
    )
    K: tuple[int, ...] | None = doc(
        None,
        "Steps K at which to compute the signals (comma list); "
        "default 5,10,15,20, or every K present in a signals table.",
    )
    gate_K: int = doc(
        PAPER_K, "Step K of the gate used for the false-positive listing and the d_K figures."
    )
    d_L: float = doc(
        PAPER_D_L, "Threshold d_L in [0, 1] of that gate (rule r1: cut iff d_K < d_L)."
    )
    seed: int = doc(0, "Seed of the G=8 sub-samples drawn from larger groups (App. G16 panel).")
    figures: bool = doc(
        True, "Save the PNG figures (heatmap, d_K histogram by label, d_K vs reward variance)."
    )
    out: Path | None = doc(None, "Run directory to write (default runs/analyze-<UTC timestamp>).")
    overwrite: bool = doc(False, "Replace --out if it already exists.")

    def __post_init__(self) -> None:
        _check_seed(self.seed)
        if self.K is not None:
            _check_K(tuple(self.K), "--K")
        _check_K((self.gate_K,), "--gate-K")
        _check_unit((self.d_L,), "--d-L")


SWEEP_RULES = ("r1", "r3", "both")
SWEEP_OBJECTIVES = ("safe", "measured")
GATE_FEATURES = ("classic", "all")


def run_T_max(path: Path) -> int | None:
    """The T_max a run was collected with, from the manifest.json of ``path`` (a run directory,
    or a table inside one); None when there is none to read."""
    import json

    path = Path(path)
    manifest = (path if path.is_dir() else path.parent) / "manifest.json"
    try:
        value = json.loads(manifest.read_text())["config"]["T_max"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 1 else None


@dataclass(frozen=True)
class SweepConfig:
    """`srollout sweep`: sweep gate thresholds; choose an operating point with a precision floor."""

    input: Path = doc(
        Path("."), "A run directory, a steps.parquet or a signals.parquet (made by anyone)."
    )
    K: tuple[int, ...] = doc((PAPER_K,), "Gate step(s) K to sweep (one or a comma list).")
    d_L_grid: tuple[float, ...] = doc(
        tuple(round(0.05 + 0.01 * i, 10) for i in range(14)),
        "Grid of d_L thresholds: start:stop:step (stop included) or a comma list.",
    )
    rule: str = doc("r1", "Gate rule: r1 (d_K < d_L), r3 (d_K < d_L or tau_K >= t_high) or both.")
    t_high_grid: tuple[float, ...] = doc(
        (0.8, 0.9, 1.0), "Grid of t_high for r3: start:stop:step (stop included) or a comma list."
    )
    T_max: int | None = doc(
        None,
        "Rollout horizon T_max (steps) of the savings formulas; default: the T_max the run was "
        f"collected with (its manifest.json), else the paper's {PAPER_T_MAX}.",
    )
    precision_floor: float = doc(
        PAPER_PRECISION_FLOOR,
        "Smallest precision (TP / cuts, in [0, 1]) an operating point may have.",
    )
    n_boot: int = doc(
        10_000, "Bootstrap resamples (over groups) for the chosen point's confidence intervals."
    )
    seed: int = doc(0, "Seed of the bootstrap (and of the --learned/--adaptive folds).")
    out: Path | None = doc(None, "Run directory to write (default runs/sweep-<UTC timestamp>).")
    overwrite: bool = doc(False, "Replace --out if it already exists.")
    objective: str = doc(
        "safe",
        "What the operating point maximises at precision >= the floor: safe (the paper's "
        "TP·(T_max−K)/(N·T_max)) or measured (the real environment steps the cut groups would "
        "still have spent, from the ungated outcome; needs step counts). Also reported: the "
        "measured saving against a random cut of the same size.",
    )

    def __post_init__(self) -> None:
        _check_seed(self.seed)
        _check_K(tuple(self.K), "--K")
        _check_choice(self.objective, SWEEP_OBJECTIVES, "--objective")
        _check_unit(tuple(self.d_L_grid), "--d-L-grid")
        _check_choice(self.rule, SWEEP_RULES, "--rule")
        if self.rule != "r1":
            _check_unit(tuple(self.t_high_grid), "--t-high-grid")
        if self.T_max is None:
            object.__setattr__(self, "T_max", run_T_max(self.input) or PAPER_T_MAX)
        check_at_least(self, T_max=1)
        for k in self.K:
            check_step(k, self.T_max)
        _check_unit((self.precision_floor,), "--precision-floor")
        check_at_least(self, n_boot=1)


@dataclass(frozen=True)
class GateFitConfig:
    """`srollout sweep --learned/--adaptive`: gates fit on one set of groups, judged on another."""

    learned: bool = doc(
        False,
        "Also fit the learned gate (logistic regression on the seven "
        "signals, or more with --features all) and report it cross-fitted.",
    )
    adaptive: bool = doc(
        False,
        "Also fit the adaptive-K gate (cut at the first confident check "
        "step) and report it cross-fitted.",
    )
    check_K: tuple[int, ...] = doc(
        (5, 10, 15),
        "Check steps of the adaptive gate; the learned model is also trained on rows at these K.",
    )
    n_folds: int = doc(
        5,
        "Folds (>= 2) of the cross-fitting over groups: every reported number is "
        "a decision on a group nothing was fit on.",
    )
    l2: float = doc(
        1.0,
        "L2 penalty λ (>= 0) of the logistic model, on standardised features with "
        "the intercept unpenalised.",
    )
    eval_buffer: Path | None = doc(
        None,
        "Judge the gates on this second buffer (fit on INPUT) instead of k-fold cross-fitting.",
    )
    features: str = doc(
        "classic",
        "Signals the learned/adaptive gates read: classic (the seven agreement signals) or all "
        "(also action_logprob_mean and invalid_action_rate; the buffer must have them).",
    )

    def __post_init__(self) -> None:
        _check_K(tuple(self.check_K), "--check-K")
        _check_choice(self.features, GATE_FEATURES, "--features")
        object.__setattr__(self, "check_K", tuple(sorted(set(self.check_K))))
        if isinstance(self.n_folds, bool) or not isinstance(self.n_folds, int) or self.n_folds < 2:
            raise SrolloutError(f"--n-folds must be an integer >= 2, got {self.n_folds!r}")
        if not (self.l2 >= 0 and self.l2 < float("inf")):
            raise SrolloutError(f"--l2 must be a finite number >= 0, got {self.l2}")

    @property
    def any(self) -> bool:
        return self.learned or self.adaptive


@dataclass(frozen=True)
class StallFitConfig:
    """`srollout sweep --stall`: the trajectory gate's stall rule over a grid, held out."""

    stall: bool = doc(
        False,
        "Also sweep the trajectory gate's stall rule (end a trajectory once its last W "
        "observations were all seen before, from step k0) on an ungated collect: held out by "
        "cross-fitting over groups (--n-folds), chosen at --precision-floor; writes stall.parquet "
        "and gate-stall.json.",
    )
    stall_W_grid: tuple[int, ...] = doc(
        tuple(range(4, 13)), "Grid of the stall rule's W (steps without news): a comma list."
    )
    stall_from_grid: tuple[int, ...] = doc(
        (1, 5, 8, 10, 12, 15), "Grid of the stall rule's k0 (first step it may fire): a comma list."
    )

    def __post_init__(self) -> None:
        grids = {"--stall-W-grid": self.stall_W_grid, "--stall-from-grid": self.stall_from_grid}
        for name, grid in grids.items():
            if not grid:
                raise SrolloutError(f"{name}: the grid is empty")
            bad = [v for v in grid if isinstance(v, bool) or not isinstance(v, int) or v < 1]
            if bad:
                raise SrolloutError(f"{name}: every value must be an integer >= 1, got {bad[0]!r}")


@dataclass(frozen=True)
class WhatIfConfig:
    """`srollout what-if`: every method side by side on one run's own groups."""

    input: Path = doc(
        Path("."),
        "An ungated run directory: a collect, a shadow collect, or a trainer's log "
        "(GatedRollout(log_dir=...)).",
    )
    K: int = doc(PAPER_K, "Step K of the group gate (R1: cut iff d_K < d_L).")
    T_max: int | None = doc(
        None, "Rollout horizon T_max; default: the run's (its manifest.json), else the paper's."
    )
    precision_floor: float = doc(
        0.90, "Smallest precision (right decisions / decisions) a gate may be chosen at."
    )
    greso_p: float = doc(
        0.5,
        "GRESO's exploration probability p: a task with z zero-variance groups in a row is "
        "still rolled out with probability p^z.",
    )
    loop_from: int = doc(
        1,
        "First step k0 at which the loop detector (gate kind loop: 4 identical (action, "
        "observation) pairs, 3 identical rejected actions, or 6 pairs alternating A, B) may stop "
        "a trajectory; a fixed rule shown beside the fitted trajectory gate.",
    )
    n_folds: int = doc(5, "Folds of the cross-fitting over groups (held-out operating points).")
    n_boot: int = doc(2000, "Bootstrap resamples (over groups) of the group gate's intervals.")
    seed: int = doc(0, "Seed of the folds, the bootstrap and GRESO's draws.")
    out: Path | None = doc(None, "Run directory to write (default runs/what-if-<UTC timestamp>).")
    overwrite: bool = doc(False, "Replace --out if it already exists.")

    def __post_init__(self) -> None:
        _check_seed(self.seed)
        _check_K((self.K,), "--K")
        _check_unit((self.precision_floor,), "--precision-floor")
        _check_unit((self.greso_p,), "--greso-p")
        if self.T_max is None:
            object.__setattr__(self, "T_max", run_T_max(self.input) or PAPER_T_MAX)
        check_step(self.K, self.T_max)
        check_at_least(self, n_folds=2, loop_from=1)
        check_step(
            self.loop_from, self.T_max, "loop_from", why="the loop detector would never fire"
        )
