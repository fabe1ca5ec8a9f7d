"""`srollout train-offpolicy BUFFER`: GRPO on a collected buffer, baseline vs gated arm (the paper's
Tier 2).

Parses options into :class:`srollout.config.TrainOffpolicyConfig` and calls the stage."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from srollout.config import TrainOffpolicyConfig, help_for, parse_names

_D = TrainOffpolicyConfig.__dataclass_fields__


def _h(name: str) -> str:
    return help_for(TrainOffpolicyConfig, name)


def _default(name: str):
    return _D[name].default


def register(app: typer.Typer) -> None:
    @app.command(
        "train-offpolicy",
        help="GRPO on a collected buffer, baseline vs gated arm (Tier 2): 20 steps x 4 groups, "
        "LoRA r8/alpha16 on q,v, AdamW lr 5e-5; writes metrics.parquet, the per-step trace figure, "
        "summary.json and report.md.",
    )
    def train_offpolicy(
        buffer: Annotated[Path, typer.Argument(help=_h("buffer"), show_default=False)],
        steps: Annotated[int, typer.Option("--steps", help=_h("steps"))] = _default("steps"),
        groups_per_step: Annotated[
            int, typer.Option("--groups-per-step", help=_h("groups_per_step"))
        ] = _default("groups_per_step"),
        turns_per_traj: Annotated[
            int, typer.Option("--turns-per-traj", help=_h("turns_per_traj"))
        ] = _default("turns_per_traj"),
        max_items: Annotated[int, typer.Option("--max-items", help=_h("max_items"))] = _default(
            "max_items"
        ),
        lr: Annotated[float, typer.Option("--lr", help=_h("lr"))] = _default("lr"),
        lora_r: Annotated[int, typer.Option("--lora-r", help=_h("lora_r"))] = _default("lora_r"),
        lora_alpha: Annotated[int, typer.Option("--lora-alpha", help=_h("lora_alpha"))] = _default(
            "lora_alpha"
        ),
        lora_targets: Annotated[
            str, typer.Option("--lora-targets", help=_h("lora_targets"))
        ] = "q_proj,v_proj",
        denominator: Annotated[
            str, typer.Option("--denominator", help=_h("denominator"))
        ] = _default("denominator"),
        denominator_constant: Annotated[
            float | None,
            typer.Option(
                "--denominator-constant", help=_h("denominator_constant"), show_default=False
            ),
        ] = None,
        clip_eps: Annotated[
            float | None, typer.Option("--clip-eps", help=_h("clip_eps"), show_default=False)
        ] = None,
        kl_coef: Annotated[float, typer.Option("--kl-coef", help=_h("kl_coef"))] = _default(
            "kl_coef"
        ),
        gate: Annotated[
            Path | None, typer.Option("--gate", help=_h("gate"), show_default=False)
        ] = None,
        K: Annotated[int, typer.Option("--K", help=_h("K"))] = _default("K"),
        d_L: Annotated[float, typer.Option("--d-L", help=_h("d_L"))] = _default("d_L"),
        rule: Annotated[str, typer.Option("--rule", help=_h("rule"))] = _default("rule"),
        t_high: Annotated[
            float | None, typer.Option("--t-high", help=_h("t_high"), show_default=False)
        ] = None,
        seed: Annotated[int, typer.Option("--seed", help=_h("seed"))] = _default("seed"),
        model: Annotated[
            Path | None, typer.Option("--model", help=_h("model"), show_default=False)
        ] = None,
        micro_batch: Annotated[
            int, typer.Option("--micro-batch", help=_h("micro_batch"))
        ] = _default("micro_batch"),
        out: Annotated[
            Path | None, typer.Option("--out", help=_h("out"), show_default=False)
        ] = None,
        overwrite: Annotated[bool, typer.Option("--overwrite", help=_h("overwrite"))] = False,
    ) -> None:
        from srollout.console import make_console
        from srollout.report.tables import to_rich
        from srollout.stages.train_offpolicy import run_train_offpolicy, summary_frame

        config = TrainOffpolicyConfig(
            buffer=buffer,
            steps=steps,
            groups_per_step=groups_per_step,
            turns_per_traj=turns_per_traj,
            max_items=max_items,
            lr=lr,
            lora_r=lora_r,
            lora_alpha=lora_alpha,
            lora_targets=parse_names(lora_targets, "--lora-targets"),
            denominator=denominator,
            denominator_constant=denominator_constant,
            clip_eps=clip_eps,
            kl_coef=kl_coef,
            gate=gate,
            K=K,
            d_L=d_L,
            rule=rule,
            t_high=t_high,
            seed=seed,
            model=model,
            micro_batch=micro_batch,
            out=out,
            overwrite=overwrite,
        )
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
