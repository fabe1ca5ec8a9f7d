"""`srollout what-if`: every method side by side on one run's own groups
(parse options -> WhatIfConfig -> run_what_if)."""

import typer

from srollout.cli.rollout_options import input_command
from srollout.config import WhatIfConfig

HELP = (
    "What would the group gate, the trajectory gate, DAPO and GRESO do on this run?\n\n"
    "INPUT is an ungated run directory (a collect, a shadow collect, or a trainer's log from "
    "GatedRollout(log_dir=...)). Each method is judged by the run's full outcomes: the gates at "
    "operating points held out by cross-fitting over groups, DAPO by what it would discard, GRESO "
    "by what the run's own history would have skipped. Writes what-if.parquet, gate.json, "
    "gate-stall.json, what-if.png and report.md (with TRL and verl settings)."
)


def register(app: typer.Typer) -> None:
    input_command(app, "what-if", WhatIfConfig, HELP, "srollout.stages.what_if:run_what_if")
