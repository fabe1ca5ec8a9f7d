"""The Parquet log a trainer writes as it trains: every group its rollout function played, in
collect's tables, so ``srollout analyze``, ``sweep`` and ``what-if`` read a user's own run like a
``collect``. Nothing is held in memory between calls. Layout, the extra columns and resume:
docs/artifacts.md ("A trainer's log")."""

from __future__ import annotations

import json
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import polars as pl

from srollout.errors import SrolloutError
from srollout.rollout.engine import GroupRecord
from srollout.rollout.parts import finished_groups, merge_parts, parts_dir, write_part
from srollout.rollout.records import GroupTables, group_tables

STAGE = "trainer-log"
PART = "step-{:08d}"


@dataclass(frozen=True)
class LogResume:
    """What a reopened log restores: ``next_group`` (the next group index: seeds continue where
    the checkpoint left them), ``greso`` ((task_id, trainer_step, zero_var or cut) of every
    group in the log) and ``steps`` (the trainer steps the log holds)."""

    next_group: int
    greso: tuple[tuple[str, int, bool], ...]
    steps: tuple[int, ...]


def _step_of(part: str) -> int | None:
    head, _, num = part.partition("-")
    return int(num) if head == "step" and num.isdigit() else None


class TrainerLog:
    """A trainer log at ``out`` for a rollout function with settings ``config`` (a JSON-able
    mapping: a log is refused if it was made with other settings)."""

    def __init__(self, out: str | Path, config: Mapping[str, Any]) -> None:
        self.out = Path(out)
        self.config = json.loads(json.dumps(dict(config), default=str))
        self._manifest: Any = None

    # --- opening -------------------------------------------------------------------------------
    def open(self, trainer_step: int) -> LogResume:
        """Open the log at the trainer's ``global_step`` (0 for a fresh run; S when resumed from
        the checkpoint of step S). Refuses, in one line and before writing anything, a directory
        that is not a trainer log, a log made with other settings, and a fresh run (step 0) into
        a log that already holds steps."""
        from srollout.rundir import Manifest

        out = self.out
        if out.exists() and not out.is_dir():
            raise SrolloutError(f"log_dir {out}: exists and is not a directory")
        manifest = out / "manifest.json"
        if out.exists() and any(out.iterdir()):
            if not manifest.exists():
                raise SrolloutError(
                    f"log_dir {out} is not empty and has no manifest.json: it is not a srollout "
                    "trainer log; give an empty or new directory"
                )
            _check_config(out, self.config)
        steps = sorted(s for s in map(_step_of, finished_groups(out)) if s is not None)
        if steps and trainer_step == 0:
            raise SrolloutError(
                f"log_dir {out} already holds trainer steps {steps[0]}..{steps[-1]} of an earlier "
                "run, and this one starts at step 0: give a new directory, or resume the trainer "
                "from its checkpoint (resume_from_checkpoint) to continue that log"
            )
        for s in [s for s in steps if s > trainer_step]:  # played again after the checkpoint
            shutil.rmtree(parts_dir(out) / PART.format(s))
        for table in ("steps", "trajectories", "groups", "signals"):
            (out / f"{table}.parquet").unlink(missing_ok=True)  # merged again at the end
        kept = [s for s in steps if s <= trainer_step]
        resume = self._resume(kept)
        out.mkdir(parents=True, exist_ok=True)
        self._manifest = Manifest(out, STAGE, self.config)
        self._manifest.update(resumed_at_step=trainer_step if kept else None)
        return resume

    def _resume(self, steps: Sequence[int]) -> LogResume:
        if not steps:
            return LogResume(0, (), ())
        frames = [
            pl.read_parquet(
                parts_dir(self.out) / PART.format(s) / "groups.parquet",
                columns=["group_index", "task_id", "zero_var", "cut", "trainer_step"],
            )
            for s in steps
        ]
        groups = pl.concat(frames)
        greso = tuple(
            (str(r["task_id"]), int(r["trainer_step"]), bool(r["zero_var"] or r["cut"]))
            for r in groups.iter_rows(named=True)
        )
        return LogResume(int(groups["group_index"].max()) + 1, greso, tuple(steps))

    # --- writing -------------------------------------------------------------------------------
    def write(
        self,
        trainer_step: int,
        records: Sequence[GroupRecord],
        in_batch: Sequence[bool],
        shadow: bool = False,
    ) -> Path | None:
        """Write the groups of the call feeding ``trainer_step`` as its part (atomically; a part
        of the same step is replaced). ``in_batch[i]``: record i's rows went to the optimizer."""
        if self._manifest is None:
            raise SrolloutError("TrainerLog.write before open()")
        if not records:
            return None
        parts = [group_tables(r, shadow=shadow) for r in records]
        step = pl.lit(int(trainer_step), dtype=pl.Int64).alias("trainer_step")
        tables = {}
        for name in GroupTables._fields:
            df = pl.concat([getattr(p, name) for p in parts], how="diagonal_relaxed")
            tables[name] = df.with_columns(step)
        tables["groups"] = tables["groups"].with_columns(
            pl.Series("in_batch", [bool(b) for b in in_batch], dtype=pl.Boolean)
        )
        return write_part(self.out, PART.format(trainer_step), GroupTables(**tables))

    def merge(self) -> dict[str, Path]:
        """Merge the parts, in step order, into the four tables; the manifest says complete."""
        paths = merge_log(self.out)
        if self._manifest is not None:
            self._manifest.complete(list(paths.values()))
        return paths


def merge_log(out: str | Path) -> dict[str, Path]:
    """Merge a trainer log's parts into its tables, in step order; returns table -> path. TRL's
    parts (one per call) are concatenated; of verl's (one per session) a step played by more than
    one attempt keeps only the last attempt's sessions, and the groups table is made from the
    trajectories."""
    out = Path(out)
    parts = sorted((p for p in finished_groups(out) if _step_of(p) is not None), key=_step_of)
    sessions = _session_parts(out)
    if parts:
        return merge_parts(out, parts)
    if not sessions:
        raise SrolloutError(f"{out} holds no trainer-log parts (parts/step-*)")
    return _merge_sessions(out, sessions)


# --- verl: one part per session ------------------------------------------------------------------

SESSION = "step-{:08d}-{}-{}-{}"  # trainer step, attempt, group (uid), session
SESSION_TABLES = ("steps", "trajectories")


def write_session(
    out: str | Path,
    config: Mapping[str, Any],
    trainer_step: int,
    attempt: str,
    tables: Mapping[str, pl.DataFrame],
) -> Path:
    """Write one session's steps and trajectory row as an atomic part of the log at ``out``
    (made on first use, its manifest checked against ``config`` as :meth:`TrainerLog.open`
    does, without the resume: sessions of a resumed run are told apart by ``attempt``)."""
    out = Path(out)
    if not (out / "manifest.json").exists():
        from srollout.rundir import Manifest

        if out.exists() and any(p.name != "parts" for p in out.iterdir()):
            TrainerLog(out, config).open(0)  # the one-line refusals of a foreign directory
        out.mkdir(parents=True, exist_ok=True)
        Manifest(out, STAGE, json.loads(json.dumps(dict(config), default=str)))
    else:
        _check_config(out, config)
    traj = tables["trajectories"].row(0, named=True)
    name = SESSION.format(int(trainer_step), attempt, traj["group_id"], int(traj["traj_idx"]))
    return write_part(out, name, {t: tables[t] for t in SESSION_TABLES})


def _check_config(out: Path, config: Mapping[str, Any]) -> None:
    before = json.loads((out / "manifest.json").read_text())
    if before.get("stage") != STAGE:
        raise SrolloutError(
            f"log_dir {out} is a {before.get('stage')!r} run, not a trainer log; give an empty "
            "or new directory"
        )
    now = json.loads(json.dumps(dict(config), default=str))
    for key in sorted(set(before.get("config", {})) | set(now)):
        if before.get("config", {}).get(key) != now.get(key):
            raise SrolloutError(
                f"log_dir {out} belongs to a run made with {key}="
                f"{before.get('config', {}).get(key)!r}, not {now.get(key)!r}; give a new "
                "directory for a new configuration"
            )


def _session_parts(out: Path) -> list[Path]:
    root = parts_dir(out)
    if not root.exists():
        return []
    return sorted(
        p
        for p in root.iterdir()
        if p.is_dir()
        and not p.name.startswith(".")
        and p.name.count("-") >= 4
        and all((p / f"{t}.parquet").exists() for t in SESSION_TABLES)
    )


def _merge_sessions(out: Path, sessions: Sequence[Path]) -> dict[str, Path]:
    from srollout.core.grpo import group_label, is_zero_variance
    from srollout.schemas import ARTIFACTS
    from srollout.schemas import write as write_parquet

    # per trainer step, the attempt that wrote last (a resumed run plays the step again)
    by_step: dict[int, dict[str, float]] = {}
    for p in sessions:
        step, attempt = int(p.name.split("-")[1]), p.name.split("-")[2]
        last = by_step.setdefault(step, {})
        last[attempt] = max(last.get(attempt, 0.0), p.stat().st_mtime)
    keep = {step: max(a, key=a.get) for step, a in by_step.items()}
    chosen = [p for p in sessions if keep[int(p.name.split("-")[1])] == p.name.split("-")[2]]
    frames = {
        t: pl.concat(
            [pl.read_parquet(p / f"{t}.parquet") for p in chosen], how="diagonal_relaxed"
        ).sort("trainer_step", "group_id", "traj_idx", *(["step"] if t == "steps" else []))
        for t in SESSION_TABLES
    }
    rows = []
    for (gid,), g in frames["trajectories"].group_by(["group_id"], maintain_order=True):
        rewards = g["reward"].to_list()
        rows.append(
            {
                "group_id": gid,
                "task_id": g["task_id"][0],
                "task_type": g["task_type"][0],
                "G": g.height,
                "reward_mean": sum(rewards) / len(rewards),
                "reward_var": float(pl.Series(rewards).var(ddof=0)),
                "label": group_label(rewards, success=g["success"].to_list()),
                "zero_var": bool(is_zero_variance(rewards)),
                "cut": bool(g["cut"].any()),
                "cut_step": g["cut_step"].max(),
                "arm": g["arm"][0],
                "shadow_cut_step": g["shadow_cut_step"].max(),
                "trainer_step": int(g["trainer_step"][0]),
                "in_batch": not bool(g["cut"].any()),
                "n_steps": g["n_steps"].to_list(),
            }
        )
    steps_ = ("cut_step", "shadow_cut_step")
    groups = pl.DataFrame(rows, schema_overrides=dict.fromkeys(steps_, pl.Int64))
    written = {
        t: write_parquet(frames[t], out / f"{t}.parquet", ARTIFACTS[t]) for t in SESSION_TABLES
    }
    written["groups"] = write_parquet(groups, out / "groups.parquet", ARTIFACTS["groups"])
    signals = _signals(frames["steps"], frames["trajectories"], groups)
    written["signals"] = write_parquet(signals, out / "signals.parquet", ARTIFACTS["signals"])
    return written


LOG_K = (5, 10, 15, 20)  # the steps a log's signals table holds (analyze's default K)


def _signals(steps: pl.DataFrame, trajs: pl.DataFrame, groups: pl.DataFrame) -> pl.DataFrame:
    """The signals of every group of G >= 2 at each K of LOG_K its longest trajectory reaches,
    from the sessions' actions and the observations they acted on."""
    from srollout.core.signals import compute_signals

    acts = (
        steps.sort("group_id", "traj_idx", "step")
        .group_by(["group_id", "traj_idx"], maintain_order=True)
        .agg(pl.col("action"), pl.col("observation"))
    )
    per = trajs.select("group_id", "traj_idx", "initial_observation").join(
        acts, on=["group_id", "traj_idx"], how="left"
    )
    info = {r["group_id"]: r for r in groups.iter_rows(named=True)}
    rows = []
    for (gid,), g in per.sort("group_id", "traj_idx").group_by(["group_id"], maintain_order=True):
        if g.height < 2:
            continue
        actions = [a.to_list() if a is not None else [] for a in g["action"]]
        seen = [
            [o0, *(obs.to_list() if obs is not None else [])[:-1]]
            for o0, obs in zip(g["initial_observation"], g["observation"], strict=True)
        ]
        meta = info[gid]
        for K in (k for k in LOG_K if k <= max(map(len, actions), default=0)):
            sig = compute_signals(actions, K, seen)
            rows.append(
                {
                    "group_id": gid,
                    "task_id": meta["task_id"],
                    "task_type": meta["task_type"],
                    "K": K,
                    **sig.as_dict(),
                    "reward_var": meta["reward_var"],
                    "label": meta["label"],
                    "zero_var": meta["zero_var"],
                    "arm": meta["arm"],
                    "trainer_step": meta["trainer_step"],
                }
            )
    from srollout.rollout.records import SIGNAL_SCHEMA

    return pl.DataFrame(rows) if rows else pl.DataFrame(schema=SIGNAL_SCHEMA)


def _attempt() -> str:
    """Which run of the trainer wrote a session: Ray's job id (shared by every worker of one
    verl run, new when a killed run is resumed), else this process."""
    import os

    try:
        import ray

        if ray.is_initialized():
            return "r" + ray.get_runtime_context().get_job_id()
    except Exception:  # no Ray, or no runtime context: one process is one attempt
        pass
    return f"p{os.getpid()}"


class SessionLog:
    """One verl session's rows for a trainer log, written when it ends (the agent loop's
    ``log_dir``): its steps (``step`` each step) and its trajectory row, from the session's
    ``extra_fields``."""

    def __init__(self, uid: str, session: int, trainer_step: int) -> None:
        self.uid, self.session, self.trainer_step = uid, session, trainer_step
        self.initial = ""
        self.rows: list[dict[str, Any]] = []

    def step(
        self, t: int, turn: Any, text: str, result: Any, n_prompt: int, n_gen: int, state: Any
    ) -> None:
        self.rows.append(
            {
                "step": t,
                "thought": turn.thought,
                "action": turn.normalized,
                "response": text,
                "observation": result.observation,
                "valid": bool(result.valid),
                "reward": float(result.reward),
                "done": bool(result.done),
                "n_prompt_tokens": n_prompt,
                "n_gen_tokens": n_gen,
                "steps_since_new": state.since_new,
                "rejected_run": state.rejected_run,
            }
        )

    def write(
        self, log_dir: str, config: Mapping[str, Any], task: Any, extra: Mapping[str, Any]
    ) -> Path:
        keys = {
            "group_id": self.uid,
            "traj_idx": self.session,
            "task_id": task.task_id,
            "task_type": task.task_type,
        }
        step_ = pl.lit(self.trainer_step, dtype=pl.Int64).alias("trainer_step")
        steps = pl.DataFrame([{**keys, **r} for r in self.rows]).with_columns(
            step_, gen_s=pl.lit(0.0), env_s=pl.lit(0.0)
        )
        ended_by = str(extra["srollout_ended_by"])
        traj = {
            **keys,
            "seed": 0,
            "reward": float(extra["srollout_env_reward"]),
            "success": ended_by == "done",
            "n_steps": int(extra["srollout_steps"]),
            "ended_by": ended_by,
            "n_gen_tokens": int(sum(r["n_gen_tokens"] for r in self.rows)),
            "initial_observation": self.initial,
            "arm": "gated",
            "cut": bool(extra["srollout_cut"]),
            "cut_step": int(extra["srollout_cut_step"]) if extra["srollout_cut"] else None,
            "shadow_cut_step": _step_or_none(extra["srollout_shadow_cut_step"]),
            "shadow_stop_step": _step_or_none(extra["srollout_shadow_stop_step"]),
            "trainer_step": self.trainer_step,
        }
        steps_ = ("cut_step", "shadow_cut_step", "shadow_stop_step")
        trajs = pl.DataFrame([traj], schema_overrides=dict.fromkeys(steps_, pl.Int64))
        return write_session(
            log_dir, config, self.trainer_step, _attempt(), {"steps": steps, "trajectories": trajs}
        )


def _step_or_none(value: Any) -> int | None:
    return int(value) if int(value) >= 1 else None
