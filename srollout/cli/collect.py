"""`srollout collect`: roll out G trajectories per task with the policy and write
steps/trajectories/groups/signals Parquet (parse options -> CollectConfig -> run_collect)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from srollout.config import (
    QUICK_GROUPS,
    QUICK_T_MAX,
    CollectConfig,
    DistConfig,
    help_for,
    parse_int_list,
)

_DEFAULT = CollectConfig()
_SIGNAL_K = ",".join(map(str, _DEFAULT.signal_K))


def _h(name: str) -> str:
    return help_for(CollectConfig, name)


def register(app: typer.Typer) -> None:
    @app.command(
        "collect",
        help="Roll out G trajectories per task with the policy and write steps/trajectories/groups/signals "
        "Parquet, a report and a manifest. Paper defaults: 100 groups of G=8, T_max=30, temperature 0.7, gate off.",
    )
    def collect(
        groups: Annotated[int | None, typer.Option("--groups", help=_h("groups") + f"  \\[default: {_DEFAULT.groups}]", show_default=False)] = None,
        G: Annotated[int, typer.Option("--G", help=_h("G"))] = _DEFAULT.G,
        T_max: Annotated[int | None, typer.Option("--T-max", help=_h("T_max") + f"  \\[default: {_DEFAULT.T_max}]", show_default=False)] = None,
        temperature: Annotated[float, typer.Option("--temperature", help=_h("temperature"))] = _DEFAULT.temperature,
        top_p: Annotated[float, typer.Option("--top-p", help=_h("top_p"))] = _DEFAULT.top_p,
        seed: Annotated[int, typer.Option("--seed", help=_h("seed"))] = _DEFAULT.seed,
        model: Annotated[Path | None, typer.Option("--model", help=_h("model"), show_default=False)] = None,
        adapter: Annotated[Path | None, typer.Option("--adapter", help=_h("adapter"), show_default=False)] = None,
        backend: Annotated[str, typer.Option("--backend", help=_h("backend"))] = _DEFAULT.backend,
        base_url: Annotated[str | None, typer.Option("--base-url", help=_h("base_url"))] = None,
        tasks: Annotated[str, typer.Option("--tasks", help=_h("tasks"))] = _DEFAULT.tasks,
        difficulty: Annotated[str, typer.Option("--difficulty", help=_h("difficulty"))] = _DEFAULT.difficulty,
        policy: Annotated[str, typer.Option("--policy", help=_h("policy"))] = _DEFAULT.policy,
        eps: Annotated[float, typer.Option("--eps", help=_h("eps"))] = _DEFAULT.eps,
        gate: Annotated[Path | None, typer.Option("--gate", help=_h("gate"), show_default=False)] = None,
        K: Annotated[int | None, typer.Option("--K", help=_h("K"), show_default=False)] = None,
        d_L: Annotated[float | None, typer.Option("--d-L", help=_h("d_L"), show_default=False)] = None,
        rule: Annotated[str, typer.Option("--rule", help=_h("rule"))] = _DEFAULT.rule,
        t_high: Annotated[float | None, typer.Option("--t-high", help=_h("t_high"), show_default=False)] = None,
        signal_K: Annotated[str, typer.Option("--signal-K", help=_h("signal_K"))] = _SIGNAL_K,
        concurrency: Annotated[int, typer.Option("--concurrency", help=_h("concurrency"))] = _DEFAULT.concurrency,
        out: Annotated[Path | None, typer.Option("--out", help=_h("out"), show_default=False)] = None,
        overwrite: Annotated[bool, typer.Option("--overwrite", help=_h("overwrite"))] = False,
        resume: Annotated[bool, typer.Option("--resume", help=_h("resume"))] = False,
        quick: Annotated[bool, typer.Option("--quick", help=_h("quick"))] = False,
        workers: Annotated[int, typer.Option("--workers", help=help_for(DistConfig, "workers"))] = 1,
    ) -> None:
        from srollout.console import make_console
        from srollout.report.tables import to_rich
        from srollout.stages.collect import run_collect, stats_frame

        config = CollectConfig(
            groups=groups if groups is not None else (QUICK_GROUPS if quick else _DEFAULT.groups),
            G=G,
            T_max=T_max if T_max is not None else (QUICK_T_MAX if quick else _DEFAULT.T_max),
            temperature=temperature,
            top_p=top_p,
            seed=seed,
            model=model,
            adapter=adapter,
            backend=backend,
            base_url=base_url,
            tasks=tasks,
            difficulty=difficulty,
            policy=policy,
            eps=eps,
            gate=gate,
            K=K,
            d_L=d_L,
            rule=rule,
            t_high=t_high,
            signal_K=parse_int_list(signal_K, "--signal-K"),
            concurrency=concurrency,
            out=out,
            overwrite=overwrite,
            resume=resume,
            quick=quick,
        )
        dist = DistConfig(workers=workers)
        console = make_console()
        result = run_collect(config, console=console, dist=dist)
        console.print(to_rich(stats_frame(result.stats), title=f"collect: {result.stats.n_groups} groups"))
        console.print(f"[bold]run directory:[/] {result.run_dir}")
        for path in (*result.paths.values(), result.run_dir / "report.md", result.run_dir / "manifest.json"):
            console.print(f"  {path}", highlight=False)
