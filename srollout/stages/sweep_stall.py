"""`srollout sweep --stall`: the trajectory gate's stall rule on an ungated collect (docs/gates.md,
"The trajectory gate").

Story: read the collect's steps and trajectories → each trajectory's ``steps_since_new`` after every
step (recorded, or computed from its observations) → every (W, k0) of the grid scored by the full
outcomes (:func:`srollout.core.stall_sweep.score_stops`) beside the random reference → held out:
each fold stopped by the rule chosen on the others (:func:`~srollout.core.stall_sweep.crossfit`) →
the rule chosen on all groups written as gate-stall.json; stall.parquet, a report section and a
table. The loop detector (gate kind ``loop``; docs/gates.md, "The loop detector") is scored beside
it at each k0 as the stall rule is (rows ``rule = "loop"``, W null; what-if shows one row): nothing
is fitted, so its stops on every group are already "held out".
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import polars as pl

from srollout import schemas
from srollout.config import StallFitConfig, SweepConfig
from srollout.core.gate import check_step
from srollout.core.stall_sweep import (
    HeldOut,
    RandomScore,
    StopScore,
    Trajectories,
    choose_rule,
    crossfit,
    loop_stops,
    random_reference,
    score_stops,
    stall_stops,
)
from srollout.core.trajectory_gate import StallGate
from srollout.core.trajectory_signals import LoopCounts, loop_counts, steps_since_new
from srollout.errors import SrolloutError
from srollout.report.markdown import Section, doc_link
from srollout.report.tables import to_markdown, to_rich
from srollout.rundir import require_complete
from srollout.stages.sweep_table import SHORT, check_folds

STALL_FILE = "stall.parquet"
GATE_FILE = "gate-stall.json"
SINCE_NEW = "steps_since_new"
KEYS = ("group_id", "traj_idx")
# the columns the stall sweep reads besides KEYS (and steps_since_new, or what it comes from)
STEP_COLUMNS = ("reward", "n_gen_tokens")
TRAJ_COLUMNS = ("success", "n_steps", "ended_by")
# the columns the loop detector reads, and why
LOOP_NEEDS = {
    "action": "the pairs it compares",
    "observation": "the pairs it compares",
    "valid": "its rule on rejected actions",
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
    for name in ("steps.parquet", "trajectories.parquet"):
        if not (path / name).is_file():
            raise SrolloutError(f"--stall needs a collect's run directory: no {name} in {path}")
    return path


def _per_trajectory(run: Path, steps: Sequence[str], trajs: Sequence[str]) -> pl.DataFrame:
    """One row per trajectory of ``run`` in (group_id, traj_idx) order: its columns ``trajs`` and
    each of the step columns ``steps`` as the list of its values in step order (null without
    steps); only these columns, read through the contract's validating reader."""
    per = (
        schemas.read(run / "steps.parquet", schemas.STEPS, columns=[*KEYS, "step", *steps])
        .sort(*KEYS, "step")
        .group_by(list(KEYS), maintain_order=True)
        .agg(pl.col(*steps))
    )
    file = run / "trajectories.parquet"
    keys = schemas.read(file, schemas.TRAJECTORIES, columns=[*KEYS, *trajs]).sort(*KEYS)
    return keys.join(per, on=list(KEYS), how="left", maintain_order="left")


def load_trajectories(path: Path) -> Trajectories:
    """A complete run's trajectories as :class:`Trajectories` (groups in order of group_id), from
    the columns STEP_COLUMNS and TRAJ_COLUMNS name (and steps_since_new, or what it is computed
    from)."""
    run = run_dir_of(path)
    require_complete(run)
    steps_file, trajs_file = run / "steps.parquet", run / "trajectories.parquet"
    since, initial = SINCE_NEW, []
    if SINCE_NEW not in schemas.column_names(steps_file):
        since, initial = "observation", ["initial_observation"]
        missing = [c for c in [since] if c not in schemas.column_names(steps_file)]
        missing += [c for c in initial if c not in schemas.column_names(trajs_file)]
        if missing:
            raise SrolloutError(
                f"--stall: {run} has neither steps' {SINCE_NEW} nor what it is computed from "
                f"(no column(s) {', '.join(missing)})"
            )
    joined = _per_trajectory(run, [*STEP_COLUMNS, since], [*TRAJ_COLUMNS, *initial])
    N = joined.height
    T = int(joined["n_steps"].max() or 0)
    since_new = np.full((N, T), -1, dtype=np.int64)
    reward = np.zeros((N, T))
    tokens = np.zeros((N, T), dtype=np.int64)
    for i, (seq, rew, tok) in enumerate(joined.select(since, *STEP_COLUMNS).iter_rows()):
        n = len(seq or [])
        if n:
            since_new[i, :n] = steps_since_new(joined[initial[0]][i], seq) if initial else seq
            reward[i, :n] = rew
            tokens[i, :n] = tok
    group = joined["group_id"].rank("dense").cast(pl.Int64).to_numpy() - 1
    return Trajectories(
        group=group,
        n_steps=joined["n_steps"].to_numpy().astype(np.int64),
        success=joined["success"].to_numpy().astype(bool),
        since_new=since_new,
        step_reward=reward,
        step_tokens=tokens,
    )


def stop_row(rule: str, W: int | None, k0: int, trajs: Trajectories, stop, seed: int) -> dict:
    """One stall.parquet row: the stops ``stop`` [N] of rule (W, k0) scored by the full outcomes
    (:class:`~srollout.core.stall_sweep.StopScore`'s fields) and the random reference's
    (``random_*``)."""
    score = score_stops(trajs, stop)
    rnd = random_reference(trajs, stop, seed=seed)
    return {
        "rule": rule,
        "W": W,
        "k0": k0,
        **score._asdict(),
        **{f"random_{k}": v for k, v in rnd._asdict().items()},
    }


def loop_rows(trajs: Trajectories, counts: LoopCounts, k0s: Sequence[int], seed: int) -> list[dict]:
    """One row per k0: the loop detector's stops (:func:`~srollout.core.stall_sweep.loop_stops`)
    as :func:`stop_row` scores them, ``rule = "loop"`` and ``W`` None."""
    return [
        stop_row("loop", None, k0, trajs, loop_stops(counts, trajs.n_steps, k0), seed) for k0 in k0s
    ]


def sweep_stall(
    config: SweepConfig,
    stall: StallFitConfig,
    n_folds: int = 5,
    trajs: Trajectories | None = None,
    loops: bool = True,
) -> StallSweep:
    """Score every rule of the grid, cross-fit the choice, choose on all groups; with ``loops``
    also score the loop detector at each k0 of the grid (rows ``rule = "loop"``)."""
    Ws, froms = _grids(stall, config.T_max)
    trajs = load_trajectories(config.input) if trajs is None else trajs
    n_groups = int(trajs.group.max()) + 1 if len(trajs.group) else 0
    check_folds(n_folds, n_groups, config.input)
    grid = [(W, k0) for W in Ws for k0 in froms]
    stops = {(W, k0): stall_stops(trajs, W, k0) for W, k0 in grid}
    rows = [stop_row("stall", W, k0, trajs, stops[W, k0], config.seed) for W, k0 in grid]
    if loops:
        counts = load_loop_counts(run_dir_of(config.input), trajs.since_new.shape, "--stall")
        rows += loop_rows(trajs, counts, sorted(set(froms)), config.seed)
    table = pl.DataFrame(rows)
    held = crossfit(trajs, grid, config.precision_floor, n_folds=n_folds, seed=config.seed)
    scores = {rule: score_stops(trajs, stop) for rule, stop in stops.items()}
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
        n_groups=n_groups,
        n_trajs=len(trajs.group),
    )


def _grids(stall: StallFitConfig, T_max: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The W and k0 grids checked against T_max: a value the user gave beyond it is refused (a
    rule from a step no trajectory reaches, or waiting longer than any trajectory runs, never
    fires, and its rows would only look like a result). Of the default k0 grid, the values beyond
    T_max are dropped (the user asked for none); the default W grid is kept as it is."""

    default = StallFitConfig()
    Ws, froms = stall.stall_W_grid, stall.stall_from_grid
    if froms == default.stall_from_grid:
        froms = tuple(k for k in froms if k <= T_max)
    for k in Ws if Ws != default.stall_W_grid else ():
        why = f"no trajectory runs {k} steps, so it never goes {k} steps without news"
        check_step(k, T_max, "stall_W_grid", why=why)
    for k in froms:
        why = f"no trajectory reaches step {k}, so a stall rule from there never fires"
        check_step(k, T_max, "stall_from_grid", why=why)
    return Ws, froms


def load_loop_counts(run: Path, shape: tuple[int, int], source: str) -> LoopCounts:
    """[N, T] loop counts of the collect in ``run`` (0 past each trajectory's end), trajectories
    in order of (group_id, traj_idx) as :func:`load_trajectories` holds them; ``shape`` is that
    table's (N, T). A missing column is one SrolloutError naming it."""
    file = run / "steps.parquet"
    names = schemas.column_names(file)
    missing = [c for c in (*KEYS, "step", *LOOP_NEEDS) if c not in names]
    if missing:
        why = "; ".join(f"{c}: {LOOP_NEEDS[c]}" for c in missing if c in LOOP_NEEDS)
        raise SrolloutError(
            f"{source}: {file} has no column(s) {', '.join(missing)}, which the loop detector "
            f"needs" + (f" ({why})" if why else "")
        )
    joined = _per_trajectory(run, list(LOOP_NEEDS), [])
    N, T = shape
    if joined.height != N:
        raise SrolloutError(f"{source}: {run} holds {joined.height} trajectories, expected {N}")
    out = np.zeros((3, N, T), dtype=np.int64)
    for i, (actions, observations, valid) in enumerate(joined.select(*LOOP_NEEDS).iter_rows()):
        if actions:
            n = min(len(actions), T)
            counts = loop_counts(actions[:n], observations[:n], [bool(v) for v in valid[:n]])
            out[:, i, :n] = np.array(counts, dtype=np.int64).T
    return LoopCounts(*out)


def write(run_dir: Path, result: StallSweep) -> list[Path]:
    """stall.parquet (one row per rule) and gate-stall.json (only if a rule cleared the floor)."""
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

    best = result.table.filter(pl.col("rule") == "stall").sort("step_savings", descending=True)
    ok = best.filter(pl.col("precision") >= config.precision_floor).head(8)
    shown = ("W", "k0", "n_stops", "precision", "step_savings", "token_savings")
    title = f"stall rules at precision >= {config.precision_floor:g} (best 8)"
    rnd = ("random_precision", "random_step_savings")
    console.print(to_rich(ok, title=title, columns=shown + rnd, headers=SHORT))
    console.print(_held_out_line(result, config))
    for r in result.table.filter(pl.col("rule") == "loop").iter_rows(named=True):
        precision = "—" if not r["n_stops"] else f"{r['precision']:.3f}"
        console.print(
            f"loop detector from k0 {r['k0']}: {r['n_stops']} stops, precision {precision}, "
            f"steps saved {r['step_savings']:.1%}, tokens saved {r['token_savings']:.1%}",
            highlight=False,
        )
