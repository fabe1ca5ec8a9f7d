"""`srollout ab-rollout`: the matched-seed wall-clock A/B (paper Tier 1)
(parse options -> AbRolloutConfig -> run_ab_rollout)."""

from __future__ import annotations

import dataclasses
from typing import Annotated, Any

import typer

from srollout.cli.rollout_options import config_options, config_values
from srollout.config import AbRolloutConfig, DistConfig

_DEFAULT = AbRolloutConfig()
OPTIONS = tuple(f.name for f in dataclasses.fields(AbRolloutConfig))
# the order `ab-rollout --help` lists its options in
ORDER = (
    *("groups", "env", "tasks", "difficulty", "G", "T_max"),
    *("K", "d_L", "rule", "t_high", "gate", "audit", "audit_floor", "stall", "stall_from", "loop"),
    *("repeats", "blocks", "concurrency", "warmup", "temperature", "top_p", "seed"),
    *("model", "adapter", "backend", "base_url", "policy", "eps", "signal_K", "n_boot", "figures"),
    *("out", "overwrite", "resume", "quick"),
    *("arms", "dapo_max_rounds", "greso_p_explore", "greso_history", "workers"),
)


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
        if values["blocks"] == _DEFAULT.blocks:  # the default never asks for more than --groups
            values["blocks"] = min(values["blocks"], values["groups"])
        config = AbRolloutConfig(**values)
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
