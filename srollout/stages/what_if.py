"""`srollout what-if RUN`: would selective rollout, DAPO or GRESO save anything on *this* run, and
how often would each be wrong? Every method on the run's own groups, side by side.

RUN is a complete run (:func:`srollout.rundir.require_complete`: no gate acted on it), so every
group's full outcome is known: a collect, a shadow collect, or a trainer's log
(``GatedRollout(log_dir=...)``). Each method is judged by those outcomes:

- **group gate** (R1 at K): the operating point chosen at the precision floor on the other folds
  decides each held-out fold (k-fold cross-fitting over groups,
  :func:`srollout.stages.sweep_gates.compare_gates`); a cut is right iff the group was
  zero-variance; saved: the steps and tokens the cut groups took after K.
- **trajectory gate** (stall W from k0): the same protocol over the stall grid
  (:func:`srollout.stages.sweep_stall.sweep_stall`); a stop is right iff the trajectory failed.
- **loop detector** (from k0 = --loop-from): the field's fixed rule (gate kind ``loop``,
  :func:`srollout.stages.sweep_stall.loop_rows`), nothing fitted, so its stops on every group are
  scored as they are; judged as the trajectory gate's.
- **DAPO** (filter and refill): it sees rewards, so it is never wrong, and saves nothing: it
  discards the zero-variance groups after their whole rollout and rolls more to refill. Shown:
  the steps spent on discarded groups and the extra groups per useful group.
- **GRESO** (p): the run's groups replayed in order (a trainer log: by trainer step), each task
  skipped where GRESO's history would have skipped it; a skip is right iff the group was
  zero-variance; saved: the skipped groups' steps and tokens. A collect plays each task once,
  so there GRESO has no history and skips nothing.

Precision intervals are exact (Clopper–Pearson, 95 %, two-sided). Writes what-if.parquet,
gate.json / gate-stall.json (the gates chosen on all groups), what-if.png and report.md with the
settings to paste into TRL and verl.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, NamedTuple

import polars as pl

from srollout import schemas
from srollout.config import GateFitConfig, StallFitConfig, SweepConfig, WhatIfConfig
from srollout.core.arms import GresoSkipper
from srollout.core.audit import clopper_pearson_lower, clopper_pearson_upper
from srollout.core.gate import GateRule
from srollout.core.grpo import is_zero_variance
from srollout.errors import SrolloutError
from srollout.report.markdown import Section, figure, write_report
from srollout.report.what_if import bars, print_table, snippets, table_markdown
from srollout.rundir import Manifest, prepare_run_dir, require_complete
from srollout.stages.buffer import load_buffer
from srollout.stages.sweep_gates import compare_gates
from srollout.stages.sweep_stall import (
    load_loop_counts,
    load_trajectories,
    loop_rows,
    run_dir_of,
    sweep_stall,
)
from srollout.stages.sweep_table import check_folds, choose, sweep_table, token_costs

TABLE = "what-if.parquet"
FIGURE = "what-if.png"


class WhatIfResult(NamedTuple):
    run_dir: Path
    table: pl.DataFrame
    outputs: tuple[Path, ...]


def _interval(right: int, n: int) -> tuple[float, float]:

    if n == 0:
        return math.nan, math.nan
    return clopper_pearson_lower(right, n, 0.975), clopper_pearson_upper(right, n, 0.975)


def _row(method: str, setting: str, n: int, right: int, steps: float, tokens: float, note: str):
    low, high = _interval(right, n)
    return {
        "method": method,
        "setting": setting,
        "decisions": n,
        "right": right,
        "precision": right / n if n else math.nan,
        "precision_low": low,
        "precision_high": high,
        "steps_saved": steps,
        "tokens_saved": tokens,
        "note": note,
    }


GROUP_NEEDS = ("group_id", "task_id", "reward", "n_steps", "n_gen_tokens")


def _groups(run: Path) -> pl.DataFrame:
    """One row per group, in play order (a trainer log: by trainer step; a collect: by group
    index): task, zero-variance (its rewards), and the steps and tokens it took."""
    trajs_file = run / "trajectories.parquet"
    missing = [c for c in GROUP_NEEDS if c not in schemas.column_names(trajs_file)]
    if missing:
        raise SrolloutError(
            f"what-if: {trajs_file} has no column(s) {', '.join(missing)} "
            "(DAPO and GRESO need each group's task, rewards, steps and tokens)"
        )
    trajs = schemas.read(trajs_file, schemas.TRAJECTORIES, columns=GROUP_NEEDS)
    per = trajs.group_by("group_id", maintain_order=True).agg(
        pl.col("task_id").first(),
        pl.col("reward").alias("rewards"),
        pl.col("n_steps").sum().alias("steps"),
        pl.col("n_gen_tokens").sum().alias("tokens"),
    )
    per = per.with_columns(
        zero_var=pl.col("rewards").map_elements(
            lambda r: bool(is_zero_variance(r.to_list())), return_dtype=pl.Boolean
        )
    ).drop("rewards")
    order: list[str] = []
    groups_file = run / "groups.parquet"
    if groups_file.exists():
        names = schemas.column_names(groups_file)
        order = [c for c in ("trainer_step", "group_index") if c in names]
        if order:
            per = per.join(
                schemas.read(groups_file, schemas.GROUPS, columns=["group_id", *order]),
                on="group_id",
            )
    return per.sort(order or "group_id")


def _group_gate(config: WhatIfConfig, sweep_config: SweepConfig) -> tuple[dict, Any]:

    K = config.K
    buffer = load_buffer(config.input, (K,), default_K=(K,))
    sweep = sweep_table(buffer, sweep_config)
    index = choose(sweep, config.precision_floor, "safe")
    gate = None
    if index is not None:
        point = sweep.row(index, named=True)
        gate = GateRule(rule="r1", K=K, d_L=point["d_L"])
    setting = f"R1 K {K}" + (f", d_L {gate.d_L:g}" if gate is not None else "")
    n_zv = int(sweep["n_zero_var"][0]) if sweep.height else 0
    if min(n_zv, buffer.n_groups - n_zv) < 3:
        note = (
            f"not judged: held out it needs >= 3 zero-variance and >= 3 other groups, this run "
            f"has {n_zv} and {buffer.n_groups - n_zv}"
        )
        return _row("group gate", setting, 0, 0, math.nan, math.nan, note), gate
    try:
        comparison = compare_gates(
            sweep_config, GateFitConfig(n_folds=config.n_folds, check_K=(K,)), sweep
        )
    except SrolloutError as err:
        return _row("group gate", setting, 0, 0, math.nan, math.nan, str(err)), gate
    cut, _ = comparison.held_out["r1"]
    row = comparison.table.filter(
        (pl.col("gate") == "r1") & (pl.col("selection") == "cross-fitted")
    ).row(0, named=True)
    remaining, total = token_costs(buffer, (K,)).get(K, (None, None))
    tokens = (
        math.nan if total is None or not total.sum() else float(remaining[cut].sum() / total.sum())
    )
    note = "held out" if cut.any() else "held out: no threshold cleared the floor on every fold"
    steps = float(row["measured_step_savings"])
    return _row("group gate", setting, int(cut.sum()), int(row["tp"]), steps, tokens, note), gate


def _stop_row(method: str, setting: str, score: Any, note: str) -> dict:
    """The row of a trajectory rule from its stops' score (a StopScore, or a stall.parquet row)."""
    s = score if isinstance(score, dict) else score._asdict()
    right = s["n_stops"] - s["n_false"]
    return _row(method, setting, s["n_stops"], right, s["step_savings"], s["token_savings"], note)


def _trajectory_gate(
    config: WhatIfConfig, sweep_config: SweepConfig, trajs: Any
) -> tuple[dict, Any]:

    # the grids within T_max (a rule beyond it never fires, and sweep refuses it)
    froms = tuple(k for k in (5, 8, 10, 12, 15) if k <= config.T_max) or (1,)
    Ws = tuple(w for w in range(2, 13) if w <= config.T_max) or (1,)
    stall = StallFitConfig(stall=True, stall_W_grid=Ws, stall_from_grid=froms)
    result = sweep_stall(sweep_config, stall, n_folds=config.n_folds, trajs=trajs, loops=False)
    gate = result.gate
    setting = f"stall W {gate.W} from {gate.k0}" if gate is not None else "stall (no rule)"
    note = "held out" if result.held_out.n_stops else "held out: no rule cleared the floor"
    return _stop_row("trajectory gate", setting, result.held_out, note), gate


def _loop_detector(config: WhatIfConfig, run: Path, trajs: Any) -> dict:

    counts = load_loop_counts(run, trajs.since_new.shape, "what-if")
    row = loop_rows(trajs, counts, (config.loop_from,), config.seed)[0]
    note = "a fixed rule (nothing fitted): its stops on every group"
    return _stop_row("loop detector", f"loop from {config.loop_from}", row, note)


def _dapo(groups: pl.DataFrame) -> dict:
    zv = groups["zero_var"].to_numpy().astype(bool)
    steps = groups["steps"].to_numpy().astype(float)
    n_zv, n = int(zv.sum()), len(zv)
    spent = float(steps[zv].sum() / steps.sum()) if steps.sum() else math.nan
    extra = n_zv / (n - n_zv) if n > n_zv else math.inf
    note = (
        f"discards {n_zv} of {n} groups after their whole rollout ({spent:.1%} of the steps); "
        f"refilling rolls {extra:.2f} more groups per useful group"
    )
    return _row("DAPO", "filter and refill", n_zv, n_zv, 0.0, 0.0, note)


def _greso(groups: pl.DataFrame, p: float, seed: int) -> dict:

    skipper = GresoSkipper(p, seed)
    by_step = "trainer_step" in groups.columns
    n = right = 0
    steps = tokens = 0.0
    for i, g in enumerate(groups.iter_rows(named=True)):
        it = int(g["trainer_step"]) if by_step else i + 1
        if skipper.should_skip(g["task_id"], it):
            n += 1
            right += int(g["zero_var"])
            steps += float(g["steps"])
            tokens += float(g["tokens"])
        else:
            skipper.record(g["task_id"], it, bool(g["zero_var"]))
    repeats = groups.height - groups["task_id"].n_unique()
    note = "replayed in play order" if repeats else "each task played once: no history to skip by"
    total_steps, total_tokens = float(groups["steps"].sum()), float(groups["tokens"].sum())
    return _row(
        "GRESO",
        f"p {p:g}",
        n,
        right,
        steps / total_steps if total_steps else math.nan,
        tokens / total_tokens if total_tokens else math.nan,
        note,
    )


def _merge_if_trainer_log(path: Path) -> None:
    """A trainer's log whose parts were not merged yet (verl's, or a run stopped midway): merge
    them first, so its tables hold every part written."""
    import json

    manifest = path / "manifest.json"
    if path.is_dir() and manifest.exists() and (path / "parts").exists():
        from srollout.rollout.trainer_log import STAGE, merge_log

        if json.loads(manifest.read_text()).get("stage") == STAGE:
            merge_log(path)


def run_what_if(config: WhatIfConfig, console: Any | None = None) -> WhatIfResult:
    """Judge every method on ``config.input``'s groups; write the run directory."""
    from srollout.console import make_console

    console = console or make_console()
    _merge_if_trainer_log(Path(config.input))
    run = run_dir_of(config.input)
    require_complete(run)
    sweep_config = SweepConfig(
        input=run,
        K=(config.K,),
        T_max=config.T_max,
        precision_floor=config.precision_floor,
        n_boot=config.n_boot,
        seed=config.seed,
    )
    with console.status("judging the group gate, the trajectory gate, DAPO and GRESO"):
        groups = _groups(run)  # names the columns a table lacks, before any long work
        check_folds(config.n_folds, groups.height, run)
        trajs = load_trajectories(run)  # refuses a gated run; read once for both rules
        stall_row, stall_gate = _trajectory_gate(config, sweep_config, trajs)
        loop_row = _loop_detector(config, run, trajs)  # names the steps column it lacks (valid)
        group_row, group_gate = _group_gate(config, sweep_config)
        rows = [group_row, stall_row, loop_row, _dapo(groups)]
        rows.append(_greso(groups, config.greso_p, config.seed))
    table = pl.DataFrame(rows)
    run_dir = prepare_run_dir(config.out, "what-if", overwrite=config.overwrite)
    manifest = Manifest(run_dir, "what-if", config)
    outputs = [schemas.write(table, run_dir / TABLE)]
    if group_gate is not None:
        outputs.append(group_gate.save(run_dir / "gate.json"))
    if stall_gate is not None:
        outputs.append(stall_gate.save(run_dir / "gate-stall.json"))
    fig = bars(table, run_dir / FIGURE, config.precision_floor)
    outputs.append(fig)
    preamble = (
        f"Input: `{run}` ({groups.height} groups, T_max {config.T_max}). Every decision is "
        f"judged by the run's full outcomes; gates chosen at precision ≥ "
        f"{config.precision_floor:g} on {config.n_folds - 1} of {config.n_folds} folds of the "
        "groups and scored on the fold held out; intervals exact 95 %.\n"
    )
    sections = [
        Section("Side by side", table_markdown(table)),
        Section("Steps saved and precision", figure(fig, run_dir, "steps saved per method")),
        Section("Settings", snippets(group_gate, stall_gate, config)),
    ]
    outputs.append(write_report(run_dir, "srollout what-if", sections, preamble))
    manifest.complete(outputs, input=str(run), n_groups=groups.height)
    print_table(console, table, run_dir)
    return WhatIfResult(run_dir, table, tuple(outputs))
