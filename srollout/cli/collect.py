"""`srollout collect`: roll out G trajectories per task with the policy and write
steps/trajectories/groups/signals Parquet (parse options -> CollectConfig -> run_collect)."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from srollout.cli.rollout_options import ROLLOUT_OPTIONS, RUN_OPTIONS, config_options, config_values
from srollout.config import CollectConfig, DistConfig, help_for
from srollout.errors import SrolloutError

OPTIONS = (*ROLLOUT_OPTIONS, "shadow", *RUN_OPTIONS)


def register(app: typer.Typer) -> None:
    @app.command(
        "collect",
        help="Roll out G trajectories per task with the policy and write "
        "steps/trajectories/groups/signals Parquet, a report and a manifest. Paper defaults: 100 "
        "groups of G=8, T_max=30, temperature 0.7, gate off.",
    )
    @config_options(CollectConfig, OPTIONS, order=(*OPTIONS, "workers"))
    def collect(
        options: dict[str, Any],
        workers: Annotated[
            str,
            typer.Option(
                "--workers",
                help=help_for(DistConfig, "workers") + " auto (the default): one Ray worker per "
                "core for the transformers LM when every worker gets >= 16 groups and Ray is "
                "installed, else 1.",
            ),
        ] = "auto",
    ) -> None:
        from srollout.console import make_console
        from srollout.report.tables import to_rich
        from srollout.stages.collect import auto_workers, run_collect, stats_frame
        from srollout.stages.rollout_setup import plan_rollout

        config = CollectConfig(**config_values(CollectConfig, options))
        console = make_console()
        plan = plan_rollout(config)  # the environment, tasks, model and gates, resolved once
        if workers == "auto":
            n, why = auto_workers(config, plan.env)
            console.print(f"--workers auto: {why}", style="dim", highlight=False, markup=False)
        elif workers.isdigit():
            n = int(workers)
        else:
            raise SrolloutError(f"--workers {workers!r}: a number of workers >= 1, or auto")
        dist = DistConfig(workers=n)
        result = run_collect(config, console=console, dist=dist, plan=plan)
        console.print(
            to_rich(stats_frame(result.stats), title=f"collect: {result.stats.n_groups} groups")
        )
        if result.audit is not None:
            from srollout.rollout.audit import AUDITED_GATE_FILE
            from srollout.rollout.stop_audit import AUDITED_STALL_GATE_FILE

            console.print(result.audit.line(), highlight=False)
            for calibrated in (AUDITED_GATE_FILE, AUDITED_STALL_GATE_FILE):
                if (result.run_dir / calibrated).exists():
                    console.print(
                        f"the gate as calibrated: {result.run_dir / calibrated} "
                        "(--gate takes it; docs/gates.md)",
                        highlight=False,
                    )
        if config.shadow:
            from srollout.stages.collect_shadow import shadow_frame, shadow_scores

            console.print(
                to_rich(
                    shadow_frame(shadow_scores(result.paths)),
                    title="what the gates would have done (shadow: nothing was cut)",
                )
            )
        console.print(f"[bold]run directory:[/] {result.run_dir}")
        for path in (
            *result.paths.values(),
            result.run_dir / "report.md",
            result.run_dir / "manifest.json",
        ):
            console.print(f"  {path}", highlight=False)
