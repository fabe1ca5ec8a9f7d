"""Run directories: ``runs/<stage>-<UTC timestamp>/`` with a ``manifest.json``.

A run never overwrites an existing run directory unless asked (``--overwrite``), and resuming
(``--resume``) reuses the directory with its partial artifacts. The manifest records the config,
package versions, git revision, timings and ``status`` (``partial`` until the stage finishes).
"""

from __future__ import annotations

import dataclasses
import json
import platform
import shutil
import subprocess
import sys
import time
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path
from typing import Any

from srollout import __version__
from srollout.errors import SrolloutError
from srollout.schemas import write_json

_PACKAGES = ("polars", "numpy", "torch", "transformers", "peft", "alfworld", "textworld", "Levenshtein", "vllm", "ray")


def default_run_dir(stage: str) -> Path:
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    return Path("runs") / f"{stage}-{stamp}"


def prepare_run_dir(out: Path | None, stage: str, overwrite: bool = False, resume: bool = False) -> Path:
    """Create (or, with ``resume``, reopen) the run directory; refuse to clobber one silently."""
    out = Path(out) if out is not None else default_run_dir(stage)
    if out.exists() and any(out.iterdir()):
        if resume:
            return out
        if not overwrite:
            raise SrolloutError(f"{out} already exists and is not empty; pass --overwrite to replace it or --resume to continue it")
        shutil.rmtree(out)
    elif resume and not out.exists():
        raise SrolloutError(f"--resume: {out} does not exist")
    out.mkdir(parents=True, exist_ok=True)
    return out


def _versions() -> dict[str, str]:
    found = {"python": sys.version.split()[0], "srollout": __version__}
    for name in _PACKAGES:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return found


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
            "machine": {"platform": platform.platform(), "processor": platform.machine()},
            "started_utc": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "timings_s": {},
            "outputs": [],
        }
        write_json(self.data, self.path)

    def update(self, **fields: Any) -> None:
        self.data.update({k: _jsonable(v) for k, v in fields.items()})
        write_json(self.data, self.path)

    def complete(self, outputs: list[str | Path], **fields: Any) -> None:
        self.data["timings_s"]["total"] = round(time.perf_counter() - self._t0, 3)
        self.data["finished_utc"] = datetime.now(timezone.utc).isoformat(timespec="seconds")
        self.data["outputs"] = sorted({Path(p).name for p in outputs})
        self.data["status"] = "complete"
        self.update(**fields)


# Config options added after runs were first written, with the value that runs made before them
# played: a manifest without the option reads as that value, so those runs still resume.
ADDED_OPTIONS: dict[str, Any] = {"difficulty": "small", "backend": "transformers"}


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
        before = old.get("config", {}).get(name, ADDED_OPTIONS.get(name))
        now = json.loads(json.dumps(value, default=str))
        if now != before:
            raise SrolloutError(
                f"--resume: {run_dir} was made with {name}={before!r}, not {now!r}; use the same "
                f"options (its {what} would not match)"
            )
