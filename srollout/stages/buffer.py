"""The offline rollout buffer read by `analyze` and `sweep`: a run directory, a ``steps.parquet`` or
a ``signals.parquet`` made by anyone (docs/artifacts.md). From **steps** the trajectories are
rebuilt and the signals computed here at the requested K
(:func:`srollout.core.signals.compute_signals`); a trajectory's reward is the sum of its step
rewards and σ_r² the population variance of the G rewards. From **signals** the table is used as it
is (its K values are the ones available), with ``trajectories.parquet`` beside it adding rewards and
step counts. The observation acted on at step t is the previous step's ``observation``; o_1 is
:data:`INITIAL_OBSERVATION`.

Every check happens here, before a stage writes anything, each one line: a wrong file or column
(``SchemaError``), a group with fewer than 2 trajectories, a K outside the data, a run that is not
complete (:func:`srollout.rundir.require_complete`).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import islice
from pathlib import Path

import numpy as np
import polars as pl

from srollout import schemas
from srollout.core.step_signals import STEP_COLUMNS
from srollout.errors import SchemaError, SrolloutError
from srollout.rundir import require_complete
from srollout.schemas import SIGNAL_NAMES, STEP_SIGNAL_NAMES

INITIAL_OBSERVATION = "<o_1>"

# A signals table states only σ_r², so zero variance is σ_r² <= this (rewards are 0/1 or similar;
# float noise in a variance of equal rewards is far below it).
ZERO_VAR_ATOL = 1e-12


@dataclass(frozen=True)
class Buffer:
    """Groups, their signals at each available K, and the trajectories when the input has them.

    groups: one row per group, sorted by group_id — group_id, task_type, G (null if unknown),
        reward_var (σ_r², population), label, zero_var, rewards (list of G final rewards or null),
        n_steps (list of G real step counts or null), total_steps (sum of n_steps or null).
    signals: one row per (group_id, K), the columns of ``schemas.SIGNALS`` plus zero_var.
    trajectories: one row per trajectory (group_id, traj_idx, task_type, actions, observations,
        reward, n_steps) when the input had steps, else None. Read for the signals only: actions
        after the largest K are null (each list keeps the trajectory's length) and the
        observations acted on are kept at the steps K only ("" elsewhere).
    computed: the signals were computed here from steps (analyze then writes signals.parquet).
    Ks: the K values the signals table holds, ascending.
    """

    source: Path
    kind: str
    groups: pl.DataFrame
    signals: pl.DataFrame
    trajectories: pl.DataFrame | None
    computed: bool
    Ks: tuple[int, ...]

    @property
    def n_groups(self) -> int:
        return self.groups.height

    @property
    def has_step_counts(self) -> bool:
        return self.groups["n_steps"].null_count() == 0

    @property
    def has_rewards(self) -> bool:
        return self.groups["rewards"].null_count() == 0

    def at_K(self, K: int) -> pl.DataFrame:
        """One row per group (groups order) with its signals at K, plus remaining_steps =
        Σ_i max(n_i − K, 0), the real environment steps its trajectories took after step K
        (null without step counts), and total_steps."""
        sig = self.signals.filter(pl.col("K") == K).drop(
            ["task_type", "reward_var", "label", "zero_var"]
        )
        remaining = pl.col("n_steps").list.eval((pl.element() - K).clip(lower_bound=0)).list.sum()
        return self.groups.join(sig, on="group_id", how="left", maintain_order="left").with_columns(
            remaining_steps=pl.when(pl.col("n_steps").is_null())
            .then(None)
            .otherwise(remaining)
            .cast(pl.Int64)
        )

    def advantages(self) -> list[np.ndarray] | None:
        """GRPO advantages A_i = (r_i − r̄)/(σ_r + ε) of every group (groups order), or None
        without per-trajectory rewards."""
        if not self.has_rewards:
            return None
        from srollout.core.grpo import group_advantages

        return [
            group_advantages(np.asarray(r, dtype=float)) for r in self.groups["rewards"].to_list()
        ]

    def advantage_sq_norms(self, eps: float = 1e-6) -> np.ndarray | None:
        """‖A_g‖² of every group's GRPO advantages (groups order), or None without per-trajectory
        rewards: Σ_i (r_i − r̄)² / (σ_r + ε)², 0 for a group with σ_r = 0 (as
        :func:`srollout.core.grpo.group_advantages`), in one vectorised pass."""
        if not self.has_rewards:
            return None
        r = pl.col("rewards")
        sums = self.groups.select(
            ss=r.list.eval(((pl.element() - pl.element().mean()) ** 2).sum()).list.first(),
            G=r.list.len(),
        )
        ss = sums["ss"].to_numpy().astype(np.float64)
        std = np.sqrt(ss / sums["G"].to_numpy())
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(std > 0, ss / (std + eps) ** 2, 0.0)


def load_buffer(
    path: str | Path,
    K: Sequence[int] | None,
    default_K: Sequence[int],
    progress: Callable[..., Callable[..., None]] | None = None,
) -> Buffer:
    """Read and check the input of `analyze`/`sweep`; compute the signals at K from steps.

    progress: ``PhaseBars.phase``: from a large steps table, phase "read steps" reports
    ``(done, 2, what)`` over trajectories and groups, phase "signals" ``(groups done,
    groups)`` while the signals are computed.
    K: the K values wanted (None: ``default_K`` from steps, every K present in a signals table).
    Raises SrolloutError (one line) on a missing file, wrong schema, empty table, a group with
    G < 2, a K outside the data or a run that is not complete (a gate acted on it).
    """
    path = Path(path)
    if not path.exists():
        raise SrolloutError(f"{path}: no such file or directory")
    # a steps or signals file of a run is judged with the run's trajectories and groups
    require_complete(path if path.is_dir() else path.parent)
    trajectories_file = None
    if path.is_dir():
        steps_file, signals_file = path / "steps.parquet", path / "signals.parquet"
        if (path / "trajectories.parquet").exists():
            trajectories_file = path / "trajectories.parquet"
        if steps_file.exists():
            with schemas.reading(steps_file):
                return _from_steps(path, steps_file, K, default_K, progress)
        if signals_file.exists():
            return _from_signals(path, signals_file, trajectories_file, K)
        raise SrolloutError(f"{path}: no steps.parquet or signals.parquet in this directory")
    try:
        columns = pl.read_parquet_schema(path)
    except Exception as err:  # polars raises several error types for a non-Parquet file
        raise SchemaError(f"{path}: not a readable Parquet file ({type(err).__name__})") from err
    if path.name == "steps.parquet" or ("action" in columns and "step" in columns):
        with schemas.reading(path):
            return _from_steps(path, path, K, default_K, progress)
    return _from_signals(path, path, None, K)


def _check_no_nulls(df: pl.DataFrame | pl.LazyFrame, columns: Sequence[str], source: Path) -> None:
    nulls = df.lazy().select([pl.col(c).null_count() for c in columns]).collect().row(0)
    for col, n_null in zip(columns, nulls, strict=True):
        if n_null:
            raise SchemaError(f"{source}: column '{col}' has {n_null} missing value(s)")


# --- from steps -------------------------------------------------------------------------------


def trajectories_from_steps(
    steps: pl.DataFrame | pl.LazyFrame,
    source: Path,
    keep_actions_to: int | None = None,
    observations_at: Sequence[int] | None = None,
) -> pl.DataFrame:
    """One row per trajectory from a validated steps table (eager or lazy): actions and
    observations-acted-on in step order, the reward (sum over steps), the real step count. Steps
    must be 1..n per trajectory.

    To read only what the signals at K need (a_1..a_K and o_K) from a large lazy table:
    keep_actions_to = the largest K (later actions become null; the list keeps its length, so
    a trajectory's length still says when it ended), observations_at = the K values (o_t is
    kept at those t only, "" elsewhere). None keeps everything.
    """
    lazy = steps.lazy()
    names = lazy.collect_schema().names()
    _check_no_nulls(lazy, ("group_id", "traj_idx", "step", "action", "reward", "task_type"), source)
    if "arm" in names:
        arms = lazy.select(pl.col("arm").unique().sort()).collect()["arm"]
        if arms.len() > 1:
            raise SrolloutError(
                f"{source}: holds several arms ({', '.join(map(str, arms.to_list()))}); "
                "analyze/sweep need one un-gated arm's rows"
            )
    keys = ["group_id", "traj_idx", "step"]
    dup = lazy.select(keys).filter(pl.struct(keys).is_duplicated()).head(1).collect()
    if dup.height:
        row = dup.row(0, named=True)
        raise SchemaError(
            f"{source}: duplicate row for group {row['group_id']} trajectory {row['traj_idx']} "
            f"step {row['step']}"
        )
    by_step = pl.col("step")

    def kept(column: str) -> pl.Expr:
        """The column, null after step keep_actions_to."""
        if keep_actions_to is None:
            return pl.col(column)
        return pl.when(by_step <= keep_actions_to).then(pl.col(column)).alias(column)

    observation = pl.col("observation").fill_null("")
    if observations_at is not None:
        # o_t is the observation recorded at step t − 1 (module docstring)
        observation = (
            pl.when(by_step.is_in([t - 1 for t in observations_at]))
            .then(observation)
            .otherwise(pl.lit(""))
        )
    # the per-step values the step signals read (core.step_signals), when the table has them
    step_cols = [c for c in STEP_COLUMNS if c in names]
    trajs = (
        lazy.select(
            "group_id",
            "traj_idx",
            "step",
            "task_type",
            "reward",
            kept("action"),
            observation.alias("observation"),
            *map(kept, step_cols),
        )
        .group_by(["group_id", "traj_idx"])
        .agg(
            task_type=pl.col("task_type").sort_by(by_step).first(),
            actions=pl.col("action").sort_by(by_step),
            # o_t = the answer to a_{t-1}; o_1 is the initial observation (see module docstring)
            observations=pl.col("observation")
            .sort_by(by_step)
            .shift(1)
            .fill_null(INITIAL_OBSERVATION),
            # the trajectory's reward is the sum of its step rewards (as the rollout engine
            # records it); in ALFWorld only the winning last step pays, so it is the final reward
            reward=pl.col("reward").sort_by(by_step).sum(),
            n_steps=pl.len().cast(pl.Int64),
            **{c: pl.col(c).sort_by(by_step) for c in step_cols},
            first_step=by_step.min(),
            last_step=by_step.max(),
        )
        .sort(["group_id", "traj_idx"])
        .collect()
    )
    gaps = trajs.filter((pl.col("first_step") != 1) | (pl.col("last_step") != pl.col("n_steps")))
    if gaps.height:
        row = gaps.row(0, named=True)
        raise SchemaError(
            f"{source}: group {row['group_id']} trajectory {row['traj_idx']} "
            f"has steps {row['first_step']}..{row['last_step']} in "
            f"{row['n_steps']} rows; expected 1..n without gaps"
        )
    return trajs.drop(["first_step", "last_step"])


def groups_from_trajectories(trajs: pl.DataFrame, source: Path) -> pl.DataFrame:
    """One row per group (sorted by group_id): G, final rewards, σ_r², label, zero_var, step
    counts."""
    groups = (
        trajs.sort(["group_id", "traj_idx"])
        .group_by("group_id", maintain_order=True)
        .agg(
            task_type=pl.col("task_type").first()
            if "task_type" in trajs.columns
            else pl.lit(None, pl.Utf8),
            G=pl.len().cast(pl.Int64),
            rewards=pl.col("reward"),
            n_steps=pl.col("n_steps"),
            **({"success": pl.col("success")} if "success" in trajs.columns else {}),
        )
        .sort("group_id")
    )
    small = groups.filter(pl.col("G") < 2)
    if small.height:
        row = small.row(0, named=True)
        raise SrolloutError(
            f"{source}: group {row['group_id']} has {row['G']} trajectory; a group needs G >= 2 to "
            "have a reward variance"
        )
    success = groups["success"] if "success" in groups.columns else None
    reward_var, label, zero_var = _group_outcomes(
        groups["rewards"], groups["G"].to_numpy(), success
    )
    return groups.with_columns(
        reward_var=pl.Series(reward_var, dtype=pl.Float64),
        label=pl.Series(label, dtype=pl.Utf8),
        zero_var=pl.Series(zero_var, dtype=pl.Boolean),
        total_steps=pl.col("n_steps").list.sum().cast(pl.Int64),
    ).select(GROUP_OUTCOME_COLUMNS)


GROUP_OUTCOME_COLUMNS = ["group_id", "task_type", "G", "reward_var", "label", "zero_var"]
GROUP_OUTCOME_COLUMNS += ["rewards", "n_steps", "total_steps"]


def _group_outcomes(
    rewards: pl.Series, G: np.ndarray, success: pl.Series | None = None
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """σ_r², label and zero_var of every group from its list of G rewards (and successes, when
    the table has them): the groups of each size as one [M, G] array through
    :func:`srollout.core.grpo.group_outcomes`."""
    from srollout.core.grpo import group_outcomes

    flat = rewards.explode().to_numpy().astype(np.float64)
    won = None if success is None else success.explode().to_numpy().astype(bool)
    starts = np.cumsum(G) - G
    var = np.empty(G.size)
    label = np.empty(G.size, dtype=object)
    zero = np.empty(G.size, dtype=bool)
    for size in np.unique(G):
        rows = np.flatnonzero(G == size)
        at = starts[rows][:, None] + np.arange(size)
        out = group_outcomes(flat[at], success=None if won is None else won[at])
        var[rows], zero[rows], label[rows] = out.reward_var, out.zero_var, out.label
    return var, label, zero


# Groups per unit of work handed to a signal worker; from PARALLEL_FROM (group, K) cells on,
# the signals are computed in worker processes, one per core (below, start-up costs more).
SIGNALS_CHUNK = 2_000
PARALLEL_FROM = 40_000


def signals_from_trajectories(
    trajs: pl.DataFrame,
    groups: pl.DataFrame,
    Ks: Sequence[int],
    progress: Callable[[int, int], None] | None = None,
) -> pl.DataFrame:
    """The signals table (``schemas.SIGNALS`` + zero_var) of every group at every K in ``Ks``.

    Groups go in chunks of SIGNALS_CHUNK to one worker process per core when there are at least
    PARALLEL_FROM (group, K) cells (:func:`srollout.core.signals.compute_signals` is pure, so the
    table is the same either way). progress: ``(groups done, groups)`` after each chunk (only
    from PARALLEL_FROM cells on; below, the work takes a second or two)."""
    step_cols = [c for c in STEP_COLUMNS if c in trajs.columns]
    per_group = (
        trajs.sort(["group_id", "traj_idx"])
        .group_by("group_id", maintain_order=True)
        .agg(pl.col("actions"), pl.col("observations"), *map(pl.col, step_cols))
        .sort("group_id")
    )
    n = per_group.height
    Ks = tuple(int(k) for k in Ks)
    chunks = [(start, min(n, start + SIGNALS_CHUNK)) for start in range(0, n, SIGNALS_CHUNK)]

    def payload(start: int, stop: int) -> tuple[pl.DataFrame, tuple[int, ...]]:
        # a Polars slice pickles as Arrow, cheaply; the worker makes the Python lists itself
        return per_group.slice(start, stop - start), Ks

    workers = min(usable_cores(), len(chunks)) if n * len(Ks) >= PARALLEL_FROM else 1
    if n * len(Ks) < PARALLEL_FROM:
        progress = None  # a second or two: no bar
    if progress is not None:
        progress(0, n)  # the bar (and its clock) starts with the work
    values: list[np.ndarray] = []
    if workers <= 1:
        for start, stop in chunks:
            values.append(_signals_chunk(*payload(start, stop)))
            if progress is not None:
                progress(stop, n)
    else:
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor

        # spawn, not fork: a forked copy of a process running Polars' thread pool can deadlock
        with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as pool:
            pending = iter(chunks)
            in_flight = [
                pool.submit(_signals_chunk, *payload(*c)) for c in islice(pending, 2 * workers)
            ]
            done_groups = 0
            while in_flight:
                first = in_flight.pop(0)
                values.append(first.result())  # in order: the table keeps group order
                done_groups += values[-1].shape[0] // len(Ks)
                in_flight += [pool.submit(_signals_chunk, *payload(*c)) for c in islice(pending, 1)]
                if progress is not None:
                    progress(done_groups, n)
    names = SIGNAL_NAMES + STEP_SIGNAL_NAMES
    table = np.concatenate(values) if values else np.empty((0, len(names)))
    meta = groups.select(["group_id", "task_type", "reward_var", "label", "zero_var"])
    rows = meta[np.repeat(np.arange(meta.height), len(Ks))]
    out = rows.with_columns(
        K=pl.Series(np.tile(np.asarray(Ks, dtype=np.int64), meta.height)),
        **{name: pl.Series(table[:, i]) for i, name in enumerate(names)},
    )
    schema = {**schemas.SIGNALS.columns, **schemas.SIGNALS.optional, "zero_var": pl.Boolean}
    return out.select(list(schema)).cast(schema)


def usable_cores() -> int:
    """The cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def _signals_chunk(part: pl.DataFrame, Ks: tuple[int, ...]) -> np.ndarray:
    """[groups · len(Ks), 7] signal values of the groups of ``part`` (columns actions and
    observations: per group its trajectories' lists), group-major (all K of group 0, then 1)."""
    from srollout.core.signals import compute_signals
    from srollout.core.step_signals import step_signals

    actions = part["actions"].to_list()
    observations = part["observations"].to_list()
    step_cols = [c for c in STEP_COLUMNS if c in part.columns]
    per_step = {c: part[c].to_list() for c in step_cols}
    out = np.empty((len(actions) * len(Ks), len(SIGNAL_NAMES + STEP_SIGNAL_NAMES)), np.float64)
    row = 0
    for g, (acts, obs) in enumerate(zip(actions, observations, strict=True)):
        group_steps = {c: per_step[c][g] for c in step_cols}
        for K in Ks:
            s = compute_signals(acts, K, obs)
            extra = step_signals(group_steps, K)
            # the seven in SIGNAL_NAMES order (as_dict's), then the step signals
            out[row] = (*s.as_dict().values(), *(extra[name] for name in STEP_SIGNAL_NAMES))
            row += 1
    return out


def _wanted_K(
    K: Sequence[int] | None, default_K: Sequence[int], max_steps: int, source: Path
) -> tuple[int, ...]:
    if K is None:
        # defaults beyond the longest trajectory are dropped, not an error: the user asked for none
        wanted = tuple(sorted(k for k in default_K if k <= max_steps))
        if not wanted:
            raise SrolloutError(
                f"{source}: the longest trajectory has {max_steps} steps, fewer than every default "
                f"K ({', '.join(map(str, default_K))}); pass --K"
            )
        return wanted
    wanted = tuple(sorted(K))
    outside = [k for k in wanted if k > max_steps]
    if outside:
        raise SrolloutError(
            f"--K {outside[0]} is outside the data: the longest trajectory in {source} has "
            f"{max_steps} steps"
        )
    return wanted


# steps rows from which reading them shows a bar (a million rows: a few seconds)
READ_BAR_FROM = 1_000_000


def _from_steps(
    source: Path,
    steps_file: Path,
    K: Sequence[int] | None,
    default_K: Sequence[int],
    progress: Callable[..., Callable[..., None]] | None,
) -> Buffer:
    # lazily, and only the columns (and the steps) the signals at K need: a buffer of 100,000
    # groups is ~12 million rows, whose texts would not fit in memory whole
    steps = schemas.scan(steps_file, schemas.STEPS)
    names = steps.collect_schema().names()
    wanted = ["group_id", "traj_idx", "step", "task_type", "action", "observation", "reward"] + [
        c for c in ("arm", *STEP_COLUMNS) if c in names and c not in ("step",)
    ]
    steps = schemas.check_rules_lazy(steps.select(wanted), schemas.STEPS, steps_file)
    longest, n_rows = (
        steps.select(pl.col("step").max(), pl.len()).collect().row(0)
    )  # longest = the longest trajectory once steps are 1..n
    Ks = _wanted_K(K, default_K, int(longest), steps_file)
    read = (
        progress("read steps", info=True)
        if progress is not None and n_rows >= READ_BAR_FROM
        else None
    )
    if read is not None:
        read(0, 2, f"{n_rows:,} rows: trajectories")
    trajs = trajectories_from_steps(steps, steps_file, keep_actions_to=max(Ks), observations_at=Ks)
    if read is not None:
        read(1, 2, "groups")
    groups = groups_from_trajectories(trajs, steps_file)
    if read is not None:
        read(2, 2, "")
    signals = signals_from_trajectories(
        trajs, groups, Ks, progress("signals") if progress is not None else None
    )
    return Buffer(source, "steps", groups, signals, trajs, True, Ks)


# --- from signals -----------------------------------------------------------------------------


def read_signals(signals_file: Path) -> pl.DataFrame:
    """A validated signals table made by anyone, plus zero_var (σ_r² <= ZERO_VAR_ATOL)."""
    # the contract's rules (schemas.SIGNALS) already refused a missing or bad K, d_K, reward_var
    # or label
    df = schemas.read(signals_file, schemas.SIGNALS)
    _check_no_nulls(df, ("group_id", "task_type"), signals_file)
    dup = df.select(["group_id", "K"]).is_duplicated()
    if dup.any():
        row = df.filter(dup).row(0, named=True)
        raise SchemaError(f"{signals_file}: two rows for group {row['group_id']} at K={row['K']}")
    if "G" in df.columns and (df["G"] < 2).any():
        gid = df.filter(pl.col("G") < 2)["group_id"][0]
        raise SrolloutError(
            f"{signals_file}: group {gid} has G < 2; a group needs G >= 2 to have a reward variance"
        )
    df = df.with_columns(zero_var=pl.col("reward_var") <= ZERO_VAR_ATOL)
    clash = df.filter(pl.col("zero_var") == (pl.col("label") == "mixed"))
    if clash.height:
        row = clash.row(0, named=True)
        raise SchemaError(
            f"{signals_file}: group {row['group_id']} has label {row['label']!r} but reward_var "
            f"{row['reward_var']:g}; 'mixed' must have reward_var > 0, the others 0"
        )
    varying = (
        df.group_by("group_id")
        .agg(pl.col("reward_var").n_unique().alias("n"))
        .filter(pl.col("n") > 1)
    )
    if varying.height:
        raise SchemaError(
            f"{signals_file}: group {varying['group_id'][0]} "
            "has different reward_var at different K"
        )
    return df


def _from_signals(
    source: Path, signals_file: Path, trajectories_file: Path | None, K: Sequence[int] | None
) -> Buffer:
    signals = read_signals(signals_file)
    present = tuple(sorted(signals["K"].unique().to_list()))
    if K is not None:
        missing = [k for k in K if k not in present]
        if missing:
            raise SrolloutError(
                f"--K {missing[0]} is outside the data: {signals_file} has K = "
                f"{', '.join(map(str, present))}"
            )
        Ks = tuple(sorted(K))
    else:
        Ks = present
    signals = signals.filter(pl.col("K").is_in(list(Ks))).sort(["group_id", "K"])
    groups = (
        signals.group_by("group_id")
        .agg(pl.col("task_type", "reward_var", "label", "zero_var").first())
        .sort("group_id")
    )
    incomplete = signals.group_by("group_id").len().filter(pl.col("len") != len(Ks))
    if incomplete.height:
        raise SrolloutError(
            f"{signals_file}: group {incomplete['group_id'][0]} lacks a row at some K of "
            f"{', '.join(map(str, Ks))}"
        )
    if trajectories_file is not None:
        groups = _attach_trajectories(groups, trajectories_file)
    else:
        groups = groups.with_columns(
            G=pl.lit(None, pl.Int64),
            rewards=pl.lit(None, pl.List(pl.Float64)),
            n_steps=pl.lit(None, pl.List(pl.Int64)),
            total_steps=pl.lit(None, pl.Int64),
        )
    return Buffer(source, "signals", groups.select(GROUP_OUTCOME_COLUMNS), signals, None, False, Ks)


def _attach_trajectories(groups: pl.DataFrame, trajectories_file: Path) -> pl.DataFrame:
    """Per-trajectory rewards and real step counts from trajectories.parquet, joined by group."""
    needs = ("group_id", "traj_idx", "reward", "n_steps")
    trajs = schemas.read(trajectories_file, schemas.TRAJECTORIES, columns=needs)
    _check_no_nulls(trajs, needs, trajectories_file)
    from_trajs = groups_from_trajectories(trajs, trajectories_file)
    missing = groups.join(from_trajs, on="group_id", how="anti")
    if missing.height:
        raise SrolloutError(
            f"{trajectories_file}: no trajectories for group "
            f"{missing['group_id'][0]} of signals.parquet"
        )
    joined = groups.join(
        from_trajs.select(["group_id", "G", "rewards", "n_steps", "total_steps", "zero_var"]),
        on="group_id",
        how="left",
        suffix="_traj",
    )
    clash = joined.filter(pl.col("zero_var") != pl.col("zero_var_traj"))
    if clash.height:
        raise SrolloutError(
            f"{trajectories_file}: group {clash['group_id'][0]}: rewards disagree with reward_var "
            "of signals.parquet"
        )
    return joined.drop("zero_var_traj")


def subsample_trajectories(trajs: pl.DataFrame, size: int, seed: int) -> pl.DataFrame:
    """For every group with more than ``size`` trajectories, a seeded random subset of ``size`` of
    them (App. G16: G=8 sub-samples of G=16 groups); groups in group_id order, one draw each."""
    rng = np.random.default_rng(seed)
    counts = trajs.group_by("group_id").agg(pl.col("traj_idx").sort()).sort("group_id")
    keep_gid, keep_idx = [], []
    for gid, idx in zip(counts["group_id"].to_list(), counts["traj_idx"].to_list(), strict=True):
        chosen = (
            idx if len(idx) <= size else sorted(rng.choice(idx, size=size, replace=False).tolist())
        )
        keep_gid += [gid] * len(chosen)
        keep_idx += chosen
    keep = pl.DataFrame(
        {"group_id": keep_gid, "traj_idx": keep_idx},
        schema={"group_id": pl.Utf8, "traj_idx": pl.Int64},
    )
    return trajs.join(keep, on=["group_id", "traj_idx"], how="semi", maintain_order="left")
