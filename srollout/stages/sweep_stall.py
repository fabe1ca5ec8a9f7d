"""`srollout sweep --stall`: the trajectory gate's stall rule on an ungated collect (docs/gates.md,
"The trajectory gate").

Story: read the collect's steps and trajectories → each trajectory's ``steps_since_new`` after every
step (recorded, or computed from its observations) → every (W, k0) of the grid scored by the full
outcomes (:func:`srollout.core.stall_sweep.score_stops`) beside the random reference → held out:
each fold stopped by the rule chosen on the others (:func:`~srollout.core.stall_sweep.crossfit`) →
the rule chosen on all groups written as gate-stall.json; stall.parquet, a report section and a
table. The loop detector is scored beside it at each k0 (:mod:`srollout.stages.sweep_loop`, rows
with ``rule = "loop"``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import polars as pl

from srollout.config import StallFitConfig, SweepConfig
from srollout.core.stall_sweep import (
    HeldOut,
    RandomScore,
    StopScore,
    Trajectories,
    choose_rule,
    crossfit,
    random_reference,
    score_stops,
    stall_stops,
)
from srollout.core.trajectory_gate import StallGate
from srollout.core.trajectory_signals import steps_since_new
from srollout.errors import SrolloutError
from srollout.report.markdown import Section, doc_link

STALL_FILE = "stall.parquet"
GATE_FILE = "gate-stall.json"
SINCE_NEW = "steps_since_new"
# the columns the stall sweep reads, and why
NEEDS = {
    "steps.parquet": ("group_id", "traj_idx", "step", "reward", "n_gen_tokens"),
    "trajectories.parquet": ("group_id", "traj_idx", "success", "n_steps", "ended_by"),
}


class StallSweep(NamedTuple):
    """The grid, the held-out result and the rule chosen on all groups."""

    table: pl.DataFrame
    held_out: StopScore
    held_out_random: RandomScore
    crossfit: HeldOut
    gate: StallGate | None
    n_groups: int
    n_trajs: int


def run_dir_of(path: Path | str) -> Path:
    path = Path(path)
    if path.is_file():
        path = path.parent
    for name in NEEDS:
        if not (path / name).is_file():
            raise SrolloutError(f"--stall needs a collect's run directory: no {name} in {path}")
    return path


def load_trajectories(path: Path) -> Trajectories:
    """A complete run's trajectories as :class:`Trajectories` (groups in order of group_id): only
    the columns NEEDS names (and steps_since_new, or what it is computed from), read through the
    contract's validating reader."""
    from srollout import schemas
    from srollout.rundir import require_complete

    run = run_dir_of(path)
    require_complete(run)
    steps_file, trajs_file = run / "steps.parquet", run / "trajectories.parquet"
    since, initial = [SINCE_NEW], []
    if SINCE_NEW not in schemas.column_names(steps_file):
        since, initial = ["observation"], ["initial_observation"]
        missing = [c for c in since if c not in schemas.column_names(steps_file)]
        missing += [c for c in initial if c not in schemas.column_names(trajs_file)]
        if missing:
            raise SrolloutError(
                f"--stall: {run} has neither steps' {SINCE_NEW} nor what it is computed from "
                f"(no column(s) {', '.join(missing)})"
            )
    steps = schemas.read(steps_file, schemas.STEPS, columns=[*NEEDS["steps.parquet"], *since])
    trajs = schemas.read(
        trajs_file, schemas.TRAJECTORIES, columns=[*NEEDS["trajectories.parquet"], *initial]
    )
    trajs = trajs.sort("group_id", "traj_idx")
    steps = steps.sort("group_id", "traj_idx", "step")
    keys = ["group_id", "traj_idx"]
    # named apart from trajectories' own reward and n_gen_tokens, which the join keeps
    per = steps.group_by(keys, maintain_order=True).agg(
        pl.col("reward").alias("step_reward"),
        pl.col("n_gen_tokens").alias("step_tokens"),
        pl.col(SINCE_NEW if SINCE_NEW in steps.columns else "observation").alias("since"),
    )
    joined = trajs.join(per, on=keys, how="left", maintain_order="left")
    N = joined.height
    T = int(joined["n_steps"].max() or 0)
    since = np.full((N, T), -1, dtype=np.int64)
    reward = np.zeros((N, T))
    tokens = np.zeros((N, T), dtype=np.int64)
    initial = joined["initial_observation"] if "initial_observation" in joined.columns else None
    for i, row in enumerate(joined.select("since", "step_reward", "step_tokens").iter_rows()):
        seq, rew, tok = row
        n = len(seq or [])
        if n:
            values = steps_since_new(initial[i], seq) if SINCE_NEW not in steps.columns else seq
            since[i, :n] = values
            reward[i, :n] = rew
            tokens[i, :n] = tok
    group = joined["group_id"].rank("dense").cast(pl.Int64).to_numpy() - 1
    return Trajectories(
        group=group,
        n_steps=joined["n_steps"].to_numpy().astype(np.int64),
        success=joined["success"].to_numpy().astype(bool),
        since_new=since,
        step_reward=reward,
        step_tokens=tokens,
    )


def sweep_stall(
    config: SweepConfig,
    stall: StallFitConfig,
    n_folds: int = 5,
    trajs: Trajectories | None = None,
    loops: bool = True,
) -> StallSweep:
    """Score every rule of the grid, cross-fit the choice, choose on all groups; with ``loops``
    also score the loop detector at each k0 of the grid (rows ``rule = "loop"``)."""
    froms = _from_grid(stall, config.T_max)
    trajs = load_trajectories(config.input) if trajs is None else trajs
    grid = [(W, k0) for W in stall.stall_W_grid for k0 in froms]
    rows, scores = [], {}
    for W, k0 in grid:
        stop = stall_stops(trajs, W, k0)
        s = score_stops(trajs, stop)
        r = random_reference(trajs, stop, seed=config.seed)
        scores[(W, k0)] = s
        rows.append(
            {"W": W, "k0": k0, **s._asdict(), **{f"random_{k}": v for k, v in r._asdict().items()}}
        )
    rows = [{"rule": "stall", **r} for r in rows]
    if loops:
        from srollout.stages.sweep_loop import load_loop_counts, loop_rows

        counts = load_loop_counts(run_dir_of(config.input), trajs.since_new.shape, "--stall")
        rows += loop_rows(trajs, counts, sorted({k0 for _, k0 in grid}), config.seed)
    table = pl.DataFrame(rows)
    held = crossfit(trajs, grid, config.precision_floor, n_folds=n_folds, seed=config.seed)
    chosen = choose_rule(scores, config.precision_floor)
    table = table.with_columns(
        chosen=pl.struct("W", "k0").map_elements(
            lambda r: chosen is not None and (r["W"], r["k0"]) == chosen, return_dtype=pl.Boolean
        )
    )
    return StallSweep(
        table=table,
        held_out=score_stops(trajs, held.stop),
        held_out_random=random_reference(trajs, held.stop, seed=config.seed),
        crossfit=held,
        gate=StallGate(*chosen) if chosen is not None else None,
        n_groups=int(trajs.group.max()) + 1 if len(trajs.group) else 0,
        n_trajs=len(trajs.group),
    )


def _from_grid(stall: StallFitConfig, T_max: int) -> tuple[int, ...]:
    """The k0 grid within T_max: a value of the default grid beyond it is dropped (the user asked
    for none), one the user gave is refused: a rule from a step no trajectory reaches never
    fires, and its rows would only look like a result."""
    froms = stall.stall_from_grid
    if froms == StallFitConfig().stall_from_grid:
        return tuple(k for k in froms if k <= T_max)
    from srollout.core.gate import check_step

    for k in froms:
        why = f"no trajectory reaches step {k}, so a stall rule from there never fires"
        check_step(k, T_max, "stall_from_grid", why=why)
    return froms


def write(run_dir: Path, result: StallSweep) -> list[Path]:
    """stall.parquet (one row per rule) and gate-stall.json (only if a rule cleared the floor)."""
    from srollout import schemas

    out = [schemas.write(result.table, run_dir / STALL_FILE)]
    if result.gate is not None:
        out.append(result.gate.save(run_dir / GATE_FILE))
    return out


def _held_out_line(result: StallSweep, config: SweepConfig) -> str:
    h, r = result.held_out, result.held_out_random
    rules = ", ".join("none" if x is None else f"W {x[0]} k0 {x[1]}" for x in result.crossfit.rules)
    n_folds = len(result.crossfit.rules)
    head = f"held out ({n_folds} folds over {result.n_groups} groups; rules {rules})"
    if not h.n_stops:
        return f"{head}: no stop (no rule cleared precision {config.precision_floor:g} on a fold)"
    return (
        f"{head}: {h.n_stops} stops of {result.n_trajs} trajectories, precision "
        f"{h.precision:.3f} (random {r.precision:.3f}), steps saved {h.step_savings:.1%} "
        f"(random {r.step_savings:.1%}), tokens saved {h.token_savings:.1%}; groups turned "
        f"zero-variance {h.to_zero_var}, turned mixed {h.to_mixed}, advantage L² moved "
        f"{h.adv_l2_moved:.1%}, groups ended earlier {h.groups_ended_early}"
    )


def report_section(result: StallSweep, config: SweepConfig) -> Section:
    from srollout.report.tables import to_markdown

    shown = result.table.select(
        "rule", "W", "k0", "n_stops", "n_false", "precision", "step_savings", "token_savings",
        "random_precision", "random_step_savings", "to_zero_var", "to_mixed", "adv_l2_moved",
    )  # fmt: skip
    gate = result.gate
    chosen = (
        f"chosen on all groups: W {gate.W}, k0 {gate.k0} (`{GATE_FILE}`)"
        if gate is not None
        else f"no rule reaches precision {config.precision_floor:g}: no gate-stall.json"
    )
    body = "\n\n".join(
        [
            "Stops judged by the full outcome (precision: stopped ⇒ would have failed), beside a "
            "random reference; rows `loop`: the loop detector, for comparison ("
            + doc_link("gates.md", "The trajectory gate (`--stall W --stall-from K0`)")
            + ").",
            f"- {_held_out_line(result, config)}\n- {chosen}",
            to_markdown(shown),
        ]
    )
    return Section("Trajectory gate: the stall rule (`--stall`)", body)


def print_table(console: Any, result: StallSweep, config: SweepConfig) -> None:
    from rich.table import Table

    best = result.table.filter(pl.col("rule") == "stall").sort("step_savings", descending=True)
    ok = best.filter(pl.col("precision") >= config.precision_floor).head(8)
    table = Table(title=f"stall rules at precision >= {config.precision_floor:g} (best 8)")
    for c in ("W", "k0", "stops", "prec", "steps", "tokens", "rnd prec", "rnd steps"):
        table.add_column(c, justify="right")
    for r in ok.iter_rows(named=True):
        table.add_row(
            str(r["W"]), str(r["k0"]), str(r["n_stops"]), f"{r['precision']:.3f}",
            f"{r['step_savings']:.1%}", f"{r['token_savings']:.1%}",
            f"{r['random_precision']:.3f}", f"{r['random_step_savings']:.1%}",
        )  # fmt: skip
    console.print(table)
    console.print(_held_out_line(result, config))
    for r in result.table.filter(pl.col("rule") == "loop").iter_rows(named=True):
        precision = "—" if not r["n_stops"] else f"{r['precision']:.3f}"
        console.print(
            f"loop detector from k0 {r['k0']}: {r['n_stops']} stops, precision {precision}, "
            f"steps saved {r['step_savings']:.1%}, tokens saved {r['token_savings']:.1%}",
            highlight=False,
        )
