"""`srollout what-if`: every method side by side on one run's own groups
(parse options -> WhatIfConfig -> run_what_if)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from srollout.config import WhatIfConfig, help_for

_DEFAULT = WhatIfConfig()

HELP = (
    "What would the group gate, the trajectory gate, DAPO and GRESO do on this run?\n\n"
    "INPUT is an ungated run directory (a collect, a shadow collect, or a trainer's log from "
    "GatedRollout(log_dir=...)). Each method is judged by the run's full outcomes: the gates at "
    "operating points held out by cross-fitting over groups, DAPO by what it would discard, GRESO "
    "by what the run's own history would have skipped. Writes what-if.parquet, gate.json, "
    "gate-stall.json, what-if.png and report.md (with TRL and verl settings)."
)


def _h(name: str) -> str:
    return help_for(WhatIfConfig, name)


def register(app: typer.Typer) -> None:
    @app.command("what-if", help=HELP, short_help=HELP.split("\n")[0])
    def what_if(
        input: Annotated[Path, typer.Argument(help=_h("input"), show_default=False)],
        K: Annotated[int, typer.Option("--K", help=_h("K"))] = _DEFAULT.K,
        T_max: Annotated[int | None, typer.Option("--T-max", help=_h("T_max"))] = None,
        precision_floor: Annotated[
            float, typer.Option("--precision-floor", help=_h("precision_floor"))
        ] = _DEFAULT.precision_floor,
        greso_p: Annotated[float, typer.Option("--greso-p", help=_h("greso_p"))] = (
            _DEFAULT.greso_p
        ),
        n_folds: Annotated[int, typer.Option("--n-folds", help=_h("n_folds"))] = _DEFAULT.n_folds,
        n_boot: Annotated[int, typer.Option("--n-boot", help=_h("n_boot"))] = _DEFAULT.n_boot,
        seed: Annotated[int, typer.Option("--seed", help=_h("seed"))] = _DEFAULT.seed,
        out: Annotated[
            Path | None, typer.Option("--out", help=_h("out"), show_default=False)
        ] = None,
        overwrite: Annotated[bool, typer.Option("--overwrite", help=_h("overwrite"))] = False,
    ) -> None:
        from srollout.stages.what_if import run_what_if

        config = WhatIfConfig(
            input=input,
            K=K,
            T_max=T_max,
            precision_floor=precision_floor,
            greso_p=greso_p,
            n_folds=n_folds,
            n_boot=n_boot,
            seed=seed,
            out=out,
            overwrite=overwrite,
        )
        run_what_if(config)
