"""`srollout sweep`: sweep gate thresholds, choose an operating point under a precision floor
(parse options -> SweepConfig -> run_sweep)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from srollout.config import GateFitConfig, StallFitConfig, SweepConfig, help_for
from srollout.errors import SrolloutError

_DEFAULT = SweepConfig()
_GATES = GateFitConfig()
_STALL = StallFitConfig()

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


def _h(name: str) -> str:
    return help_for(SweepConfig, name)


def _g(name: str) -> str:
    return help_for(GateFitConfig, name)


def _s(name: str) -> str:
    return help_for(StallFitConfig, name)


def register(app: typer.Typer) -> None:
    @app.command("sweep", help=HELP, short_help=HELP.split("\n")[0])
    def sweep(
        input: Annotated[Path, typer.Argument(help=_h("input"), show_default=False)],
        K: Annotated[str, typer.Option("--K", help=_h("K"))] = "10",
        d_L_grid: Annotated[
            str, typer.Option("--d-L-grid", help=_h("d_L_grid"))
        ] = "0.05:0.18:0.01",
        rule: Annotated[str, typer.Option("--rule", help=_h("rule"))] = _DEFAULT.rule,
        t_high_grid: Annotated[
            str, typer.Option("--t-high-grid", help=_h("t_high_grid"))
        ] = "0.8:1.0:0.1",
        T_max: Annotated[int | None, typer.Option("--T-max", help=_h("T_max"))] = None,
        precision_floor: Annotated[
            float, typer.Option("--precision-floor", help=_h("precision_floor"))
        ] = _DEFAULT.precision_floor,
        n_boot: Annotated[int, typer.Option("--n-boot", help=_h("n_boot"))] = _DEFAULT.n_boot,
        seed: Annotated[int, typer.Option("--seed", help=_h("seed"))] = _DEFAULT.seed,
        out: Annotated[
            Path | None, typer.Option("--out", help=_h("out"), show_default=False)
        ] = None,
        overwrite: Annotated[bool, typer.Option("--overwrite", help=_h("overwrite"))] = False,
        objective: Annotated[
            str, typer.Option("--objective", help=_h("objective"))
        ] = _DEFAULT.objective,
        learned: Annotated[bool, typer.Option("--learned", help=_g("learned"))] = False,
        adaptive: Annotated[bool, typer.Option("--adaptive", help=_g("adaptive"))] = False,
        check_K: Annotated[str, typer.Option("--check-K", help=_g("check_K"))] = ",".join(
            map(str, _GATES.check_K)
        ),
        n_folds: Annotated[int, typer.Option("--n-folds", help=_g("n_folds"))] = _GATES.n_folds,
        l2: Annotated[float, typer.Option("--l2", help=_g("l2"))] = _GATES.l2,
        eval_buffer: Annotated[
            Path | None, typer.Option("--eval-buffer", help=_g("eval_buffer"), show_default=False)
        ] = None,
        features: Annotated[str, typer.Option("--features", help=_g("features"))] = _GATES.features,
        stall: Annotated[bool, typer.Option("--stall", help=_s("stall"))] = False,
        stall_W_grid: Annotated[str, typer.Option("--stall-W-grid", help=_s("W_grid"))] = ",".join(
            map(str, _STALL.W_grid)
        ),
        stall_from_grid: Annotated[
            str, typer.Option("--stall-from-grid", help=_s("from_grid"))
        ] = ",".join(map(str, _STALL.from_grid)),
    ) -> None:
        from srollout.config import parse_grid, parse_int_list
        from srollout.stages.sweep import run_sweep

        config = SweepConfig(
            input=input,
            K=parse_int_list(K, "--K"),
            d_L_grid=parse_grid(d_L_grid, "--d-L-grid"),
            rule=rule,
            t_high_grid=parse_grid(t_high_grid, "--t-high-grid") if rule != "r1" else (),
            T_max=T_max,
            precision_floor=precision_floor,
            n_boot=n_boot,
            seed=seed,
            out=out,
            overwrite=overwrite,
            objective=objective,
        )
        gates = GateFitConfig(
            learned=learned,
            adaptive=adaptive,
            check_K=parse_int_list(check_K, "--check-K"),
            n_folds=n_folds,
            l2=l2,
            eval_buffer=eval_buffer,
            features=features,
        )
        if eval_buffer is not None and not gates.any:
            raise SrolloutError(
                "--eval-buffer judges the --learned/--adaptive gates; pass one of them"
            )
        if features != _GATES.features and not gates.any:
            raise SrolloutError(
                "--features chooses the --learned/--adaptive gates' signals; pass one of them"
            )
        stalls = StallFitConfig(
            stall=stall,
            W_grid=parse_int_list(stall_W_grid, "--stall-W-grid"),
            from_grid=parse_int_list(stall_from_grid, "--stall-from-grid"),
        )
        run_sweep(config, gates=gates, stall=stalls if stall else None)
