"""`srollout ab-rollout`: the matched-seed wall-clock A/B (paper Tier 1): the same tasks and seeds
with and without the gate, and optionally DAPO / GRESO arms (parse options -> AbRolloutConfig ->
run_ab_rollout)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from srollout.config import (
    QUICK_GROUPS,
    QUICK_T_MAX,
    AbRolloutConfig,
    DistConfig,
    help_for,
    parse_int_list,
    parse_names,
)

_DEFAULT = AbRolloutConfig()
_SIGNAL_K = ",".join(map(str, _DEFAULT.signal_K))


def _h(name: str) -> str:
    return help_for(AbRolloutConfig, name)


def register(app: typer.Typer) -> None:
    @app.command(
        "ab-rollout",
        help="Matched-seed wall-clock A/B (paper Tier 1): roll the same tasks with the same per-trajectory seeds "
        "through the same batched engine without and with the gate, arms alternating (ABBA) after a warm-up; "
        "report wall-clock, token and step savings with bootstrap CIs, the cuts judged by the baseline arm, and "
        f"the seed-match proof. --arms adds DAPO / GRESO arms (useful groups per second per arm). "
        f"Defaults: {_DEFAULT.groups} eval tasks, G=8, T_max=30, gate r1 (K, d_L) = (10, 0.12).",
    )
    def ab_rollout(
        groups: Annotated[int | None, typer.Option("--groups", help=_h("groups") + f"  \\[default: {_DEFAULT.groups}]", show_default=False)] = None,
        tasks: Annotated[str, typer.Option("--tasks", help=_h("tasks"))] = _DEFAULT.tasks,
        difficulty: Annotated[str, typer.Option("--difficulty", help=_h("difficulty"))] = _DEFAULT.difficulty,
        G: Annotated[int, typer.Option("--G", help=_h("G"))] = _DEFAULT.G,
        T_max: Annotated[int | None, typer.Option("--T-max", help=_h("T_max") + f"  \\[default: {_DEFAULT.T_max}]", show_default=False)] = None,
        K: Annotated[int | None, typer.Option("--K", help=_h("K"), show_default=False)] = None,
        d_L: Annotated[float | None, typer.Option("--d-L", help=_h("d_L"), show_default=False)] = None,
        rule: Annotated[str, typer.Option("--rule", help=_h("rule"))] = _DEFAULT.rule,
        t_high: Annotated[float | None, typer.Option("--t-high", help=_h("t_high"), show_default=False)] = None,
        gate: Annotated[Path | None, typer.Option("--gate", help=_h("gate"), show_default=False)] = None,
        repeats: Annotated[int, typer.Option("--repeats", help=_h("repeats"))] = _DEFAULT.repeats,
        blocks: Annotated[int, typer.Option("--blocks", help=_h("blocks"))] = _DEFAULT.blocks,
        concurrency: Annotated[int, typer.Option("--concurrency", help=_h("concurrency"))] = _DEFAULT.concurrency,
        warmup: Annotated[bool, typer.Option("--warmup/--no-warmup", help=_h("warmup"))] = _DEFAULT.warmup,
        temperature: Annotated[float, typer.Option("--temperature", help=_h("temperature"))] = _DEFAULT.temperature,
        top_p: Annotated[float, typer.Option("--top-p", help=_h("top_p"))] = _DEFAULT.top_p,
        seed: Annotated[int, typer.Option("--seed", help=_h("seed"))] = _DEFAULT.seed,
        model: Annotated[Path | None, typer.Option("--model", help=_h("model"), show_default=False)] = None,
        adapter: Annotated[Path | None, typer.Option("--adapter", help=_h("adapter"), show_default=False)] = None,
        backend: Annotated[str, typer.Option("--backend", help=_h("backend"))] = _DEFAULT.backend,
        base_url: Annotated[str | None, typer.Option("--base-url", help=_h("base_url"))] = None,
        policy: Annotated[str, typer.Option("--policy", help=_h("policy"))] = _DEFAULT.policy,
        eps: Annotated[float, typer.Option("--eps", help=_h("eps"))] = _DEFAULT.eps,
        signal_K: Annotated[str, typer.Option("--signal-K", help=_h("signal_K"))] = _SIGNAL_K,
        n_boot: Annotated[int, typer.Option("--n-boot", help=_h("n_boot"))] = _DEFAULT.n_boot,
        figures: Annotated[bool, typer.Option("--figures/--no-figures", help=_h("figures"))] = _DEFAULT.figures,
        out: Annotated[Path | None, typer.Option("--out", help=_h("out"), show_default=False)] = None,
        overwrite: Annotated[bool, typer.Option("--overwrite", help=_h("overwrite"))] = False,
        resume: Annotated[bool, typer.Option("--resume", help=_h("resume"))] = False,
        quick: Annotated[bool, typer.Option("--quick", help=_h("quick"))] = False,
        arms: Annotated[str, typer.Option("--arms", help=_h("arms"))] = ",".join(_DEFAULT.arms),
        dapo_max_rounds: Annotated[int, typer.Option("--dapo-max-rounds", help=_h("dapo_max_rounds"))] = _DEFAULT.dapo_max_rounds,
        greso_p_explore: Annotated[float, typer.Option("--greso-p-explore", help=_h("greso_p_explore"))] = _DEFAULT.greso_p_explore,
        greso_history: Annotated[Path | None, typer.Option("--greso-history", help=_h("greso_history"), show_default=False)] = None,
        workers: Annotated[int, typer.Option("--workers", help="Parallel rollout workers: 1 runs in this process (no Ray); N > 1 runs every arm's timed rollouts on N Ray workers (extra 'dist'; each starts, builds its policy and warms up before the clock). Joins $RAY_ADDRESS, else starts a local cluster with N CPUs. Not part of --resume's check.")] = 1,
    ) -> None:
        import polars as pl

        from srollout.console import make_console
        from srollout.report.ab import arms_view, same_work, savings_frame
        from srollout.report.tables import to_rich
        from srollout.stages.ab_rollout import run_ab_rollout

        n_groups = groups if groups is not None else (QUICK_GROUPS if quick else _DEFAULT.groups)
        config = AbRolloutConfig(
            groups=n_groups,
            tasks=tasks,
            difficulty=difficulty,
            G=G,
            T_max=T_max if T_max is not None else (QUICK_T_MAX if quick else _DEFAULT.T_max),
            temperature=temperature,
            top_p=top_p,
            seed=seed,
            model=model,
            adapter=adapter,
            backend=backend,
            base_url=base_url,
            policy=policy,
            eps=eps,
            gate=gate,
            K=K,
            d_L=d_L,
            rule=rule,
            t_high=t_high,
            repeats=repeats,
            blocks=min(blocks, n_groups) if blocks == _DEFAULT.blocks else blocks,
            concurrency=concurrency,
            warmup=warmup,
            signal_K=parse_int_list(signal_K, "--signal-K"),
            n_boot=n_boot,
            figures=figures,
            out=out,
            overwrite=overwrite,
            resume=resume,
            quick=quick,
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
            console.print(to_rich(arms_view(result.arms), title=f"ab-rollout: arms, {config.groups} tasks × {config.repeats} repeat(s) (totals)"))
            for row in result.arms.filter(pl.col("cap_hits") > 0).iter_rows(named=True):
                console.print(f"[bold yellow]{row['arm']}:[/] {row['cap_hits']} timed block(s) still short of useful groups after "
                              f"--dapo-max-rounds {config.dapo_max_rounds} extra round(s); kept what they gathered (see report.md)")
        for c in result.comparisons:
            console.print(to_rich(savings_frame(c, blocks), title=f"ab-rollout: {c.arm} vs baseline, {c.n_tasks} tasks × {c.repeats} repeat(s)"))
            if same_work(c):
                console.print("[bold yellow]note:[/] the gate cut no group, so both arms did identical work: the wall-clock difference is machine noise (an A/A test)")
            if c.match.mismatches:
                console.print(f"[bold yellow]seed match:[/] {len(c.match.mismatches)} {c.arm} trajectories differ from their baseline twin before K (see report.md)")
        console.print(f"[bold]run directory:[/] {result.run_dir}")
        for path in (*result.paths.values(), result.run_dir / "manifest.json"):
            console.print(f"  {path}", highlight=False)
