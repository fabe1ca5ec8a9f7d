"""`srollout sweep`: sweep gate thresholds, choose an operating point under a precision floor
(parse options -> SweepConfig -> run_sweep)."""

from __future__ import annotations

import dataclasses
from typing import Any

import typer

from srollout.cli.rollout_options import config_options, parse_lists
from srollout.config import GateFitConfig, StallFitConfig, SweepConfig
from srollout.errors import SrolloutError

_GATES = GateFitConfig()

HELP = (
    "Sweep gate thresholds, choose an operating point under a precision floor, write gate.json.\n\n"
    "INPUT is a run directory, a steps.parquet or a signals.parquet. Writes sweep.parquet (one row "
    "per rule, K, d_L[, t_high]), gate.json of the chosen point (only if one clears the floor), "
    "pareto.png and report.md.\n\n"
    "--learned / --adaptive also fit a logistic-regression gate and an adaptive-K gate, judged on "
    "held-out groups (k-fold cross-fitting, or --eval-buffer), reported beside R1/R3 "
    "(gates.parquet, gate-learned.json, gate-adaptive.json).\n\n"
    "--stall also sweeps the trajectory gate's stall rule (W, k0) on an ungated collect, held out "
    "by cross-fitting over groups (stall.parquet, gate-stall.json)."
)


SWEEP = tuple(f.name for f in dataclasses.fields(SweepConfig) if f.name != "input")
GATES = tuple(f.name for f in dataclasses.fields(GateFitConfig))
STALL = tuple(f.name for f in dataclasses.fields(StallFitConfig))
# the order `sweep --help` lists them in
ORDER = (
    "input",
    *("K", "d_L_grid", "rule", "t_high_grid", "T_max", "precision_floor", "n_boot", "seed"),
    *("out", "overwrite", "objective"),
    *GATES,
    *STALL,
)


def register(app: typer.Typer) -> None:
    @app.command("sweep", help=HELP, short_help=HELP.split("\n")[0])
    @config_options(SweepConfig, SWEEP, order=ORDER, argument="input")
    @config_options(GateFitConfig, GATES, order=(*GATES, *STALL), into="gates")
    @config_options(StallFitConfig, STALL, order=STALL, into="stalls")
    def sweep(stalls: dict[str, Any], gates: dict[str, Any], options: dict[str, Any]) -> None:
        from srollout.stages.sweep import run_sweep

        if options["rule"] == "r1":  # r1 reads no t_high
            options["t_high_grid"] = ()
        config = SweepConfig(**parse_lists(SweepConfig, options))
        fit = GateFitConfig(**parse_lists(GateFitConfig, gates))
        if fit.eval_buffer is not None and not fit.any:
            raise SrolloutError(
                "--eval-buffer judges the --learned/--adaptive gates; pass one of them"
            )
        if fit.features != _GATES.features and not fit.any:
            raise SrolloutError(
                "--features chooses the --learned/--adaptive gates' signals; pass one of them"
            )
        stall = StallFitConfig(**parse_lists(StallFitConfig, stalls))
        run_sweep(config, gates=fit, stall=stall if stall.stall else None)
