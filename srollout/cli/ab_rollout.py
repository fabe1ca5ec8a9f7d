"""`srollout ab-rollout`: the matched-seed wall-clock A/B (paper Tier 1): the same tasks and seeds
with and without the gate, and optionally DAPO / GRESO arms (parse options -> AbRolloutConfig ->
run_ab_rollout)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from srollout.cli.rollout_options import (
    ROLLOUT_OPTIONS,
    RUN_OPTIONS,
    config_options,
    config_values,
)
from srollout.config import AbRolloutConfig, DistConfig, help_for, parse_names

_DEFAULT = AbRolloutConfig()
OPTIONS = (*ROLLOUT_OPTIONS, *RUN_OPTIONS)
# the order `ab-rollout --help` lists its options in
ORDER = (
    "groups",
    "env",
    "tasks",
    "difficulty",
    "G",
    "T_max",
    "K",
    "d_L",
    "rule",
    "t_high",
    "gate",
    "audit",
    "audit_floor",
    "stall",
    "stall_from",
    "repeats",
    "blocks",
    "concurrency",
    "warmup",
    "temperature",
    "top_p",
    "seed",
    "model",
    "adapter",
    "backend",
    "base_url",
    "policy",
    "eps",
    "signal_K",
    "n_boot",
    "figures",
    "out",
    "overwrite",
    "resume",
    "quick",
    "arms",
    "dapo_max_rounds",
    "greso_p_explore",
    "greso_history",
    "workers",
)


def _h(name: str) -> str:
    return help_for(AbRolloutConfig, name)


def register(app: typer.Typer) -> None:
    @app.command(
        "ab-rollout",
        help="Matched-seed wall-clock A/B (paper Tier 1): roll the same tasks with the same "
        "per-trajectory seeds through the same batched engine without and with the gate, arms "
        "alternating (ABBA) after a warm-up; report wall-clock, token and step savings with "
        "bootstrap CIs, the cuts judged by the baseline arm, and the seed-match proof. --arms "
        f"adds DAPO / GRESO arms (useful groups per second per arm). Defaults: {_DEFAULT.groups} "
        "eval tasks, G=8, T_max=30, gate r1 (K, d_L) = (10, 0.12).",
    )
    @config_options(AbRolloutConfig, OPTIONS, order=ORDER)
    def ab_rollout(
        options: dict[str, Any],
        repeats: Annotated[int, typer.Option("--repeats", help=_h("repeats"))] = _DEFAULT.repeats,
        blocks: Annotated[int, typer.Option("--blocks", help=_h("blocks"))] = _DEFAULT.blocks,
        warmup: Annotated[
            bool, typer.Option("--warmup/--no-warmup", help=_h("warmup"))
        ] = _DEFAULT.warmup,
        n_boot: Annotated[int, typer.Option("--n-boot", help=_h("n_boot"))] = _DEFAULT.n_boot,
        figures: Annotated[
            bool, typer.Option("--figures/--no-figures", help=_h("figures"))
        ] = _DEFAULT.figures,
        arms: Annotated[str, typer.Option("--arms", help=_h("arms"))] = ",".join(_DEFAULT.arms),
        dapo_max_rounds: Annotated[
            int, typer.Option("--dapo-max-rounds", help=_h("dapo_max_rounds"))
        ] = _DEFAULT.dapo_max_rounds,
        greso_p_explore: Annotated[
            float, typer.Option("--greso-p-explore", help=_h("greso_p_explore"))
        ] = _DEFAULT.greso_p_explore,
        greso_history: Annotated[
            Path | None,
            typer.Option("--greso-history", help=_h("greso_history"), show_default=False),
        ] = None,
        workers: Annotated[
            int,
            typer.Option(
                "--workers",
                help="Parallel rollout workers: 1 runs in this process (no Ray); N > 1 runs every "
                "arm's timed rollouts on N Ray workers (extra 'dist'; each starts, builds its "
                "policy and warms up before the clock). Joins $RAY_ADDRESS, else starts a "
                "local cluster with N CPUs. Not part of --resume's check.",
            ),
        ] = 1,
    ) -> None:
        import polars as pl

        from srollout.console import make_console
        from srollout.report.ab import arms_view, same_work, savings_frame
        from srollout.report.tables import to_rich
        from srollout.stages.ab_rollout import run_ab_rollout

        values = config_values(AbRolloutConfig, options)
        config = AbRolloutConfig(
            **values,
            repeats=repeats,
            blocks=min(blocks, values["groups"]) if blocks == _DEFAULT.blocks else blocks,
            warmup=warmup,
            n_boot=n_boot,
            figures=figures,
            arms=parse_names(arms, "--arms"),
            dapo_max_rounds=dapo_max_rounds,
            greso_p_explore=greso_p_explore,
            greso_history=greso_history,
        )
        dist = DistConfig(workers=workers)
        console = make_console()
        result = run_ab_rollout(config, console=console, dist=dist)
        blocks = pl.read_parquet(result.paths["blocks"])
        if result.arms is not None:
            console.print(
                to_rich(
                    arms_view(result.arms),
                    title=f"ab-rollout: arms, {config.groups} "
                    f"tasks × {config.repeats} repeat(s) (totals)",
                )
            )
            for row in result.arms.filter(pl.col("cap_hits") > 0).iter_rows(named=True):
                console.print(
                    f"[bold yellow]{row['arm']}:[/] {row['cap_hits']} timed block(s) still short "
                    f"of useful groups after --dapo-max-rounds {config.dapo_max_rounds} extra "
                    "round(s); kept what they gathered (see report.md)"
                )
        for c in result.comparisons:
            console.print(
                to_rich(
                    savings_frame(c, blocks),
                    title=f"ab-rollout: {c.arm} vs baseline, "
                    f"{c.n_tasks} tasks × {c.repeats} repeat(s)",
                )
            )
            if same_work(c):
                console.print(
                    "[bold yellow]note:[/] the gate cut no group, so both arms did identical work: "
                    "the wall-clock difference is machine noise (an A/A test)"
                )
            if c.match.mismatches:
                console.print(
                    f"[bold yellow]seed match:[/] {len(c.match.mismatches)} {c.arm} trajectories "
                    "differ from their baseline twin before K (see report.md)"
                )
        console.print(f"[bold]run directory:[/] {result.run_dir}")
        for path in (*result.paths.values(), result.run_dir / "manifest.json"):
            console.print(f"  {path}", highlight=False)
