"""`srollout train-offpolicy BUFFER`: GRPO on a collected buffer, baseline vs gated arm (the paper's
Tier 2) (parse options -> TrainOffpolicyConfig -> run_train_offpolicy)."""

from __future__ import annotations

import dataclasses
from typing import Any

import typer

from srollout.cli.rollout_options import config_options, parse_lists
from srollout.config import TrainOffpolicyConfig

OPTIONS = tuple(f.name for f in dataclasses.fields(TrainOffpolicyConfig) if f.name != "buffer")


def register(app: typer.Typer) -> None:
    @app.command(
        "train-offpolicy",
        help="GRPO on a collected buffer, baseline vs gated arm (Tier 2): 20 steps x 4 groups, "
        "LoRA r8/alpha16 on q,v, AdamW lr 5e-5; writes metrics.parquet, the per-step trace figure, "
        "summary.json and report.md.",
    )
    @config_options(TrainOffpolicyConfig, OPTIONS, argument="buffer")
    def train_offpolicy(options: dict[str, Any]) -> None:
        from srollout.console import make_console
        from srollout.report.tables import to_rich
        from srollout.stages.train_offpolicy import run_train_offpolicy, summary_frame

        config = TrainOffpolicyConfig(**parse_lists(TrainOffpolicyConfig, options))
        console = make_console()
        _threads()
        result = run_train_offpolicy(config, console=console)
        console.print(
            to_rich(summary_frame(result.summary), title="train-offpolicy: baseline vs gated")
        )
        console.print(
            f"wrote {result.run_dir}/ (metrics.parquet, "
            "offpolicy_trace.png, summary.json, report.md)"
        )


def _threads() -> None:
    """Respect OMP_NUM_THREADS when set (shared CPU machines); torch's default otherwise."""
    import os

    n = os.environ.get("OMP_NUM_THREADS")
    if n and n.isdigit() and int(n) > 0:
        import torch

        torch.set_num_threads(int(n))
