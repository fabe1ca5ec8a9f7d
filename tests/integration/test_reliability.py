"""Interruptions, full disks and two writers, on real processes (docs/reliability.md).

- SIGINT (what Ctrl-C sends) and SIGTERM during `collect`, `ab-rollout` and `train-onpolicy`:
  exit 130 / 143, one line that says how to resume, the manifest marked as interrupted, finished
  work kept; running the command that line gives ends in exactly the uninterrupted result.
- A disk that fills during `collect` (a real tmpfs mounted here): one line, exit 2, the files
  already written intact; `--resume` after freeing space completes to the uninterrupted result.
- One writer per run directory: a second process on the same `--out` is refused at once with the
  first one's PID; the lock of a SIGKILLed process does not block `--resume`.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import polars as pl
import pytest
from frozen_run import frozen_at

from srollout.rollout.records import TIMING_COLUMNS

ROOT = Path(__file__).resolve().parents[2]

COLLECT = [
    "collect",
    "--policy",
    "noisy-expert",
    "--groups",
    "10",
    "--G",
    "3",
    "--T-max",
    "8",
    "--concurrency",
    "6",
    "--seed",
    "7",
    "--signal-K",
    "3,5",
]
AB = [
    "ab-rollout",
    "--policy",
    "noisy-expert",
    "--groups",
    "8",
    "--G",
    "2",
    "--T-max",
    "6",
    "--K",
    "2",
    "--d-L",
    "0.6",
    "--blocks",
    "4",
    "--repeats",
    "1",
    "--n-boot",
    "50",
    "--no-figures",
    "--no-warmup",
    "--seed",
    "3",
]
ONPOLICY = [
    "train-onpolicy",
    "--preset",
    "tiny",
    "--seeds",
    "7",
    "--arms",
    "baseline",
    "--iterations",
    "3",
    "--n-eval",
    "1",
]
AB_TIMING = ["wall_s", "gen_s", "env_s", "reset_s", "overhead_s", "group_wall_s"]
ONPOLICY_TIMING = [
    f"time/{c}"
    for c in ("rollout_s", "update_s", "sync_s", "iter_s", "cum_s", "eval_s", "warmup_s")
]


def _env() -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "COLUMNS": "200"}
    env.pop("SROLLOUT_DEBUG", None)
    return env


def _cmd(args: list[str]) -> list[str]:
    return [sys.executable, "-m", "srollout.cli.app", *args]


def _run(args: list[str], timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(
        _cmd(args), capture_output=True, text=True, timeout=timeout, env=_env(), cwd=ROOT
    )


def _last_line(stderr: str) -> str:
    lines = [line for line in stderr.splitlines() if line.strip()]
    return lines[-1] if lines else ""


def _interrupt(
    args: list[str], hook: tuple[str, str, int], sig: int
) -> subprocess.CompletedProcess:
    """Start ``args`` in a real process, freeze it right after ``hook``'s n-th call (enough
    finished work to interrupt), send ``sig``, and return how it ended."""
    with frozen_at(args, hook, _env(), ROOT) as run:
        os.kill(run.proc.pid, sig)
        os.kill(run.proc.pid, signal.SIGCONT)  # a stopped process handles its signal once resumed
        return run.finish()


def _resume_command(stderr: str) -> list[str]:
    """The command the one line says to run: `srollout ... --resume`, as arguments."""
    line = _last_line(stderr)
    assert line.count("`") == 2, line
    words = shlex.split(line.split("`")[1])
    assert words[0] == "srollout" and "--resume" in words, line
    return words[1:]


def _parts(run: Path) -> int:
    root = run / "parts"
    return len([p for p in root.iterdir() if not p.name.startswith(".")]) if root.exists() else 0


def _collect_tables(run: Path) -> dict[str, pl.DataFrame]:
    out = {}
    for name in ("steps", "trajectories", "groups", "signals"):
        df = pl.read_parquet(run / f"{name}.parquet")
        out[name] = df.drop([c for c in df.columns if c in TIMING_COLUMNS])
    return out


def _ab_table(run: Path) -> pl.DataFrame:
    return pl.read_parquet(run / "ab.parquet").drop(AB_TIMING).sort(["arm", "repeat", "group_id"])


def _onpolicy_tables(run: Path) -> dict[str, pl.DataFrame]:
    metrics = pl.read_parquet(run / "metrics.parquet")
    return {
        "metrics": metrics.drop([c for c in ONPOLICY_TIMING if c in metrics.columns]),
        "eval": pl.read_parquet(run / "eval.parquet"),
    }


AFTER_ONE_PART = ("srollout.stages.collect", "write_part", 1)
AFTER_TWO_PARTS = ("srollout.stages.collect", "write_part", 2)

# stage -> (arguments, the call after which it has enough finished work to interrupt: two groups'
# parts, the first timed block's file (written before the second block's run returns), the
# checkpoint after iteration 1 (the 1st save is iteration 0's); the result tables compared)
STAGES: dict[str, tuple[list[str], tuple[str, str, int], Callable[[Path], object]]] = {
    "collect": (COLLECT, AFTER_TWO_PARTS, _collect_tables),
    "ab-rollout": (AB, ("srollout.stages.ab_rollout", "run_block", 2), _ab_table),
    "train-onpolicy": (
        ONPOLICY,
        ("srollout.training.checkpoint", "save_state", 2),
        _onpolicy_tables,
    ),
}


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> Callable[[str], Path]:
    """The uninterrupted run of each stage, made once per module on first use."""
    made: dict[str, Path] = {}

    def get(stage: str) -> Path:
        if stage not in made:
            out = tmp_path_factory.mktemp("reference") / stage
            done = _run([*STAGES[stage][0], "--out", str(out)])
            assert done.returncode == 0, done.stderr[-2000:]
            made[stage] = out
        return made[stage]

    return get


def _equal(a: object, b: object) -> bool:
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(a[k].equals(b[k]) for k in a)
    return a.equals(b)


@pytest.mark.slow  # 5-32 s each (the reference run, the interrupted one, its resume)
@pytest.mark.parametrize("stage", list(STAGES))
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_signal_stops_cleanly_and_resume_completes_exactly(stage, sig, reference, tmp_path):
    args, hook, tables = STAGES[stage]
    ref = reference(stage)
    run = tmp_path / "run"
    stopped = _interrupt([*args, "--out", str(run)], hook, sig)

    assert stopped.returncode == 128 + sig, stopped.stderr[-2000:]
    assert "Traceback" not in stopped.stderr
    line = _last_line(stopped.stderr)
    name = signal.Signals(sig).name
    kept = f"stopped: interrupted by {name}: the work finished so far is kept in {run}"
    assert line.startswith(kept), line
    manifest = json.loads((run / "manifest.json").read_text())
    assert manifest["status"] == "partial" and manifest["interrupted"]["reason"] == name
    assert not list(run.rglob(".*.tmp")), "a temp file was left behind"

    resumed = _run(_resume_command(stopped.stderr))
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert json.loads((run / "manifest.json").read_text())["status"] == "complete"
    assert _equal(tables(run), tables(ref))


# --- one writer per run directory --------------------------------------------------------------


@pytest.mark.slow  # ~5 s: four collects in real processes
def test_a_second_writer_is_refused_at_once_and_a_killed_ones_lock_does_not_block_resume(
    reference, tmp_path
):
    run = tmp_path / "run"
    # frozen right after its first part: alive, holding the lock, unable to finish meanwhile
    with frozen_at([*COLLECT, "--out", str(run)], AFTER_ONE_PART, _env(), ROOT) as frozen:
        first = frozen.proc
        for extra in ([], ["--resume"], ["--overwrite"]):
            t0 = time.monotonic()
            second = _run([*COLLECT, "--out", str(run), *extra], timeout=60)
            assert second.returncode == 2 and time.monotonic() - t0 < 30
            line = _last_line(second.stderr)
            assert f"is being written by another srollout process (PID {first.pid})" in line, line
            assert "Traceback" not in second.stderr
        assert first.poll() is None, "the refused process must not have touched the running one"
        assert not (run / "groups.parquet").exists() and _parts(run) == 1
        os.kill(first.pid, signal.SIGKILL)
        first.wait(timeout=30)
    # stale, left by the killed run
    assert (run / ".srollout.lock").read_text().strip() == str(first.pid)

    resumed = _run([*COLLECT, "--out", str(run), "--resume"])
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert _equal(_collect_tables(run), _collect_tables(reference("collect")))


def test_the_lock_is_per_directory_and_reentrant_in_one_process(tmp_path):
    from srollout.errors import RunDirBusyError
    from srollout.rundir import lock_run_dir, prepare_run_dir, release_run_dir

    a = prepare_run_dir(tmp_path / "a", "collect")
    assert prepare_run_dir(a, "collect", resume=True) == a  # the same process may reopen it
    script = (
        "import sys, time; from pathlib import Path; "
        "from srollout.rundir import lock_run_dir; lock_run_dir(Path(sys.argv[1])); "
        "print('locked', flush=True); time.sleep(60)"
    )
    holder = subprocess.Popen(
        [sys.executable, "-c", script, str(tmp_path / "b")],
        env=_env(),
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(RunDirBusyError, match=f"PID {holder.pid}"):
            lock_run_dir(tmp_path / "b")
    finally:
        holder.kill()
        holder.wait()
    lock_run_dir(tmp_path / "b")  # free once its holder is gone
    release_run_dir(tmp_path / "b")


# --- a full disk ---------------------------------------------------------------------------------


def _mount_tmpfs(where: Path, size: str) -> None:
    where.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)],
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        why = done.stderr.strip() or "mount failed"
        pytest.skip(f"cannot mount a tmpfs here to fill it ({why}; needs root or CAP_SYS_ADMIN)")


@pytest.fixture
def small_disk(tmp_path) -> Path:
    """A real 3 MiB tmpfs, unmounted after the test."""
    where = tmp_path / "disk"
    _mount_tmpfs(where, "3m")
    yield where
    subprocess.run(["umount", "-l", str(where)], capture_output=True)


@pytest.mark.slow  # ~10 s on 2 loaded cores: the reference collect, the filled run, its resume
def test_a_full_disk_is_one_line_keeps_every_file_and_resume_completes(small_disk, reference):
    run = small_disk / "run"
    filler = small_disk / "filler"
    # the run starts and finishes two groups; frozen there while the filler takes all the space
    # that is left, so its next write fails
    with frozen_at([*COLLECT, "--out", str(run)], AFTER_TWO_PARTS, _env(), ROOT) as frozen:
        kept = {p: p.read_bytes() for p in run.rglob("*.parquet")}
        with filler.open("wb") as f:
            try:
                while True:
                    f.write(b"\0" * 65536)
                    f.flush()
            except OSError:
                pass
        os.kill(frozen.proc.pid, signal.SIGCONT)
        proc = frozen.finish()
    err = proc.stderr
    if proc.returncode == 0:
        pytest.fail("the run finished although the disk was full")
    assert proc.returncode == 2, err[-2000:]
    assert "Traceback" not in err
    line = _last_line(err)
    assert line.startswith("error: no space left on the device") and "--resume" in line, line
    assert len(kept) >= 2
    for path, data in kept.items():  # every file written before is whole and readable
        assert path.read_bytes() == data
        pl.read_parquet(path)
    manifest = json.loads((run / "manifest.json").read_text())  # the manifest is whole too
    assert manifest["status"] == "partial"

    filler.unlink()
    resumed = _run(_resume_command(err))
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert _equal(_collect_tables(run), _collect_tables(reference("collect")))
