"""Run directories: ``runs/<stage>-<UTC timestamp>/`` with a ``manifest.json`` (config, package
versions, git revision, timings, ``status``: ``partial`` until the stage finishes). A run never
overwrites an existing directory unless asked (``--overwrite``); ``--resume`` reuses it with its
partial artifacts. One writer per run directory: an advisory ``flock`` on ``<run>/.srollout.lock``,
held until the process exits (docs/reliability.md, "One writer per run directory").
A run is *complete* when no gate acted on it (:func:`require_complete`).
"""

from __future__ import annotations

import dataclasses
import fcntl
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path
from typing import Any

import polars as pl

from srollout import __version__, schemas
from srollout.errors import RunDirBusyError, SrolloutError
from srollout.schemas import write_json

_PACKAGES = (
    "polars",
    "numpy",
    "torch",
    "transformers",
    "peft",
    "alfworld",
    "textworld",
    "Levenshtein",
    "vllm",
    "ray",
)


def default_run_dir(stage: str) -> Path:
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    return Path("runs") / f"{stage}-{stamp}"


LOCK_FILE = ".srollout.lock"

# run directory (resolved) -> open lock file of this process; kept open (and so locked) until the
# process exits or opens another run directory (a process writes one at a time; in-process test
# sessions run many stages). A second prepare_run_dir of the same directory reuses it.
_LOCKS: dict[Path, Any] = {}


class ActiveRun:
    """The run directory this process writes and its manifest: what the CLI marks and names
    when a signal or a full disk stops the stage (:func:`active_run`)."""

    def __init__(self) -> None:
        self.run_dir: Path | None = None
        self.stage: str | None = None
        self.created: bool = False  # this call made the directory
        self.resumed: bool = False  # --resume reopened it
        self.manifest: Manifest | None = None


_ACTIVE = ActiveRun()


def reset_active_run() -> None:
    """Forget the run directory of an earlier command in this process (the CLI's entry point
    calls this first, so a second ``main()`` never marks or removes the first one's directory)."""
    _ACTIVE.__init__()


def active_run() -> ActiveRun:
    """The run directory the last :func:`prepare_run_dir` of this process opened (run_dir None
    before any)."""
    return _ACTIVE


def lock_run_dir(out: Path) -> None:
    """Take ``out``'s writer lock for the rest of this process (re-entrant within a process), or
    raise RunDirBusyError naming the PID of the live process that holds it."""
    key = out.resolve()
    held = _LOCKS.get(key)
    if held is not None and not held.closed:
        try:  # still the same file? (--overwrite removed the directory since)
            if os.fstat(held.fileno()).st_ino == os.stat(out / LOCK_FILE).st_ino:
                return
        except FileNotFoundError:
            pass
        held.close()
    out.mkdir(parents=True, exist_ok=True)
    fh = open(out / LOCK_FILE, "a+")  # noqa: SIM115 - held open for the life of the process
    try:
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        fh.seek(0)
        owner = fh.read().strip()
        fh.close()
        raise _busy(out, owner) from None
    fh.seek(0)
    fh.truncate()
    fh.write(f"{os.getpid()}\n")
    fh.flush()
    for other in [k for k in _LOCKS if k != key]:
        _LOCKS.pop(other).close()
    _LOCKS[key] = fh


def _busy(out: Path, owner: str) -> RunDirBusyError:
    return RunDirBusyError(
        f"{out} is being written by another srollout process (PID {owner or 'unknown'}); wait for "
        "it to finish, stop it, or choose another --out"
    )


def _refuse_if_locked(out: Path) -> None:
    """Raise RunDirBusyError if a live process holds ``out``'s lock; create nothing."""
    try:
        fh = open(out / LOCK_FILE)  # noqa: SIM115 - closed below
    except OSError:
        return  # no lock file: nobody is writing it
    with fh:
        try:
            fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise _busy(out, fh.read().strip()) from None
        fcntl.flock(fh.fileno(), fcntl.LOCK_UN)


def release_run_dir(out: Path) -> None:
    """Drop this process's lock on ``out`` (tests; a CLI process keeps it until it exits)."""
    fh = _LOCKS.pop(Path(out).resolve(), None)
    if fh is not None:
        fh.close()


def _has_content(out: Path) -> bool:
    return any(p.name != LOCK_FILE for p in out.iterdir())


def prepare_run_dir(
    out: Path | None, stage: str, overwrite: bool = False, resume: bool = False
) -> Path:
    """Create (or, with ``resume``, reopen) the run directory; refuse to clobber one silently.

    Takes the directory's writer lock first (:func:`lock_run_dir`), so neither ``--overwrite``
    nor ``--resume`` can touch a directory another live process is writing.
    """
    out = Path(out) if out is not None else default_run_dir(stage)
    existed = out.exists()
    if existed and not out.is_dir():
        raise SrolloutError(f"--out {out}: exists and is not a directory")
    if existed and out.resolve() not in _LOCKS:
        _refuse_if_locked(out)  # a live writer is named whatever the flags, before anything else
    if resume and not existed:
        raise SrolloutError(f"--resume: {out} does not exist")
    if existed and _has_content(out) and not (resume or overwrite):
        raise SrolloutError(
            f"{out} already exists and is not empty; pass "
            "--overwrite to replace it or --resume to continue it"
        )
    try:
        lock_run_dir(out)
    except OSError as err:
        raise SrolloutError(
            f"--out {out}: cannot create the run directory ({err.strerror or err})"
        ) from None
    if existed and _has_content(out) and not resume:
        for entry in out.iterdir():  # --overwrite: everything but the lock this process now holds
            if entry.name == LOCK_FILE:
                continue
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry)
            else:
                entry.unlink()
    _ACTIVE.run_dir, _ACTIVE.stage, _ACTIVE.manifest = out, stage, None
    _ACTIVE.created, _ACTIVE.resumed = not existed, bool(existed and resume)
    return out


def _versions() -> dict[str, str]:
    found = {"python": sys.version.split()[0], "srollout": __version__}
    for name in _PACKAGES:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return found


# Environment variables that choose the CPU kernels torch runs, and so a run's training floats in
# their last bits (docs/reliability.md, "What is reproducible where").
KERNEL_ENV = ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "MKL_ENABLE_INSTRUCTIONS", "MKL_CBWR")


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def machine_info() -> dict[str, Any]:
    """What a run's floats depend on besides the code: the CPU model, and once torch is loaded the
    kernel family it chose (``torch.backends.cpu.get_cpu_capability()``, e.g. ``AVX2``,
    ``AVX512``) and its thread count; kernel choices forced through the environment. Two runs
    whose entries differ here agree in their training floats only within the tolerance in
    docs/reliability.md, not bit for bit."""
    info: dict[str, Any] = {
        "platform": platform.platform(),
        "processor": platform.machine(),
        "cpu_model": _cpu_model(),
        "cpu_count": os.cpu_count(),
    }
    torch = sys.modules.get("torch")  # never imported here: analyze and sweep start fast
    if torch is not None:
        info["torch_cpu_capability"] = torch.backends.cpu.get_cpu_capability()
        info["torch_threads"] = torch.get_num_threads()
    forced = {k: os.environ[k] for k in KERNEL_ENV if k in os.environ}
    if forced:
        info["kernel_env"] = forced
    return info


def _git_revision() -> str | None:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            cwd=Path(__file__).resolve().parent,
            capture_output=True,
            text=True,
            timeout=5,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


def _jsonable(config: Any) -> Any:
    if dataclasses.is_dataclass(config) and not isinstance(config, type):
        return {k: _jsonable(v) for k, v in dataclasses.asdict(config).items()}
    if isinstance(config, dict):
        return {str(k): _jsonable(v) for k, v in config.items()}
    if isinstance(config, (list, tuple)):
        return [_jsonable(v) for v in config]
    if isinstance(config, Path):
        return str(config)
    return config


class Manifest:
    """Builds and atomically rewrites ``manifest.json`` as a stage progresses."""

    def __init__(self, run_dir: Path, stage: str, config: Any):
        self.path = Path(run_dir) / "manifest.json"
        self._t0 = time.perf_counter()
        self.data: dict[str, Any] = {
            "stage": stage,
            "status": "partial",
            "config": _jsonable(config),
            "versions": _versions(),
            "git_revision": _git_revision(),
            "machine": machine_info(),
            "started_utc": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "timings_s": {},
            "outputs": [],
        }
        write_json(self.data, self.path)
        if _ACTIVE.run_dir is not None and Path(run_dir).resolve() == _ACTIVE.run_dir.resolve():
            _ACTIVE.manifest = self

    def interrupted(self, reason: str) -> None:
        """Record that the stage stopped before its end (a signal, a full disk): ``status`` stays
        ``partial`` and ``interrupted`` says why and when. Best effort: on a full disk the write
        may fail, and the previous manifest (also ``partial``) stays."""
        self.data["interrupted"] = {
            "reason": reason,
            "utc": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        }
        self.data["status"] = "partial"
        write_json(self.data, self.path)

    def update(self, **fields: Any) -> None:
        self.data.update({k: _jsonable(v) for k, v in fields.items()})
        write_json(self.data, self.path)

    def complete(self, outputs: list[str | Path], **fields: Any) -> None:
        self.data["timings_s"]["total"] = round(time.perf_counter() - self._t0, 3)
        self.data["finished_utc"] = datetime.now(timezone.utc).isoformat(timespec="seconds")
        self.data["outputs"] = sorted({Path(p).name for p in outputs})
        self.data["status"] = "complete"
        self.data["machine"] = machine_info()  # by now a torch stage has loaded torch
        self.update(**fields)


# Config options added after runs were first written, with the value that runs made before them
# played: a manifest without the option reads as that value, so those runs still resume.
ADDED_OPTIONS: dict[str, Any] = {
    "difficulty": "small",
    "backend": "transformers",
    "env": "alfworld",
    "audit": 0.0,
    "audit_floor": 0.85,
    "stall": 0,
    "stall_from": 10,
    "shadow": False,
}


# Config options renamed since runs were first written: new name -> the name old manifests use.
RENAMED_OPTIONS: dict[str, str] = {"audit_floor": "precision_floor"}


def check_resumable(run_dir: Path, stage: str, resume_key: dict[str, Any], what: str) -> None:
    """Refuse to resume ``run_dir`` unless it is a ``stage`` run made with the same settings.

    resume_key: the config fields that must match (a stage's ``config.resume_key()``);
    what: the part of the run a mismatch would corrupt, for the message ("groups", "checkpoints").
    """
    path = Path(run_dir) / "manifest.json"
    if not path.exists():
        raise SrolloutError(f"--resume: {run_dir} has no manifest.json; it is not a {stage} run")
    old = json.loads(path.read_text())
    if old.get("stage") != stage:
        raise SrolloutError(f"--resume: {run_dir} is a {old.get('stage')!r} run, not a {stage} run")
    for name, value in resume_key.items():
        config = old.get("config", {})
        before = config.get(
            name, config.get(RENAMED_OPTIONS.get(name, ""), ADDED_OPTIONS.get(name))
        )
        now = json.loads(json.dumps(value, default=str))
        if now != before:
            raise SrolloutError(
                f"--resume: {run_dir} was made with {name}={before!r}, not {now!r}; use the same "
                f"options (its {what} would not match)"
            )


# --- a complete run -------------------------------------------------------------------------

# ended_by of a trajectory a gate stopped: its reward is only what it had earned by then
STOPPED_BY_GATE: tuple[str, ...] = ("gate", "stalled")
UNGATED_ALTERNATIVE = (
    "rerun collect without --stall / --gate / --audit (or with --shadow, which cuts nothing), or "
    "give the ungated twin (an A/B's baseline arm)"
)


def require_complete(run: str | Path) -> None:
    """The one definition of a complete run (docs/artifacts.md, under the groups table): ``run``'s
    trajectories.parquet and groups.parquet, where present, show no gate acting. An audited cut
    counts too: the run was gated, only a seeded share of its cuts ran on. Raises SrolloutError,
    one line: the counts and the ungated alternative."""
    run = Path(run)
    trajs_file, groups_file = run / schemas.TRAJECTORIES.filename, run / schemas.GROUPS.filename
    cut_groups = pl.DataFrame(schema={"group_id": pl.Utf8, "audited": pl.Boolean})
    n_groups = 0
    if groups_file.exists():
        groups = schemas.read(groups_file, schemas.GROUPS)
        n_groups = groups.height
        audited = pl.col("audited") if "audited" in groups.columns else pl.lit(None)
        cut_groups = groups.filter(pl.col("cut").fill_null(False)).select(
            "group_id", audited.fill_null(False).cast(pl.Boolean).alias("audited")
        )
    parts: list[str] = []
    n, total, unit = cut_groups.height, n_groups, "groups"
    if trajs_file.exists():
        names = schemas.column_names(trajs_file)
        wanted = ["group_id", "ended_by", *(["audited_stop"] if "audited_stop" in names else [])]
        trajs = schemas.read(trajs_file, schemas.TRAJECTORIES, columns=wanted)
        ended = pl.col("ended_by")
        in_cut = pl.col("group_id").is_in(cut_groups["group_id"].implode())
        audited_stop = (
            pl.col("audited_stop").is_not_null() if "audited_stop" in names else pl.lit(False)
        )
        flags = trajs.select(
            stalled=(ended == "stalled").sum(),
            gate=(ended == "gate").sum(),
            audited_stop=audited_stop.sum(),
            any=(ended.is_in(list(STOPPED_BY_GATE)) | in_cut | audited_stop).sum(),
        ).row(0, named=True)
        n, total, unit = int(flags["any"]), trajs.height, "trajectories"
        parts = [f"ended_by '{e}': {flags[e]}" for e in ("stalled", "gate") if flags[e]]
        if flags["audited_stop"]:
            parts.append(f"audited stops: {flags['audited_stop']}")
    if cut_groups.height:
        n_audited = int(cut_groups["audited"].sum())
        audited_note = f", {n_audited} audited" if n_audited else ""
        parts.append(f"{cut_groups.height} group(s) cut by a gate{audited_note}")
    if n:
        raise SrolloutError(
            f"{run}: not an ungated run: a gate stopped or cut {n} of its {total} {unit} "
            f"({'; '.join(parts)}), so their full outcomes are unknown and no label can be made "
            f"from them; {UNGATED_ALTERNATIVE}"
        )
