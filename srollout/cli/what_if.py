"""`srollout what-if`: every method side by side on one run's own groups
(parse options -> WhatIfConfig -> run_what_if)."""

from __future__ import annotations

import dataclasses
from typing import Any

import typer

from srollout.cli.rollout_options import config_options
from srollout.config import WhatIfConfig

HELP = (
    "What would the group gate, the trajectory gate, DAPO and GRESO do on this run?\n\n"
    "INPUT is an ungated run directory (a collect, a shadow collect, or a trainer's log from "
    "GatedRollout(log_dir=...)). Each method is judged by the run's full outcomes: the gates at "
    "operating points held out by cross-fitting over groups, DAPO by what it would discard, GRESO "
    "by what the run's own history would have skipped. Writes what-if.parquet, gate.json, "
    "gate-stall.json, what-if.png and report.md (with TRL and verl settings)."
)


OPTIONS = tuple(f.name for f in dataclasses.fields(WhatIfConfig) if f.name != "input")


def register(app: typer.Typer) -> None:
    @app.command("what-if", help=HELP, short_help=HELP.split("\n")[0])
    @config_options(WhatIfConfig, OPTIONS, argument="input")
    def what_if(options: dict[str, Any]) -> None:
        from srollout.stages.what_if import run_what_if

        run_what_if(WhatIfConfig(**options))
