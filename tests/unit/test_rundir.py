"""srollout.rundir: run directories are never clobbered silently, have one writer, and a
manifest that says how they were made and how far they got."""

from __future__ import annotations

import dataclasses
import fcntl
import json
import os
import re
from pathlib import Path

import pytest

from srollout.errors import RunDirBusyError, SrolloutError
from srollout.rundir import (
    ADDED_OPTIONS,
    LOCK_FILE,
    Manifest,
    active_run,
    check_resumable,
    default_run_dir,
    lock_run_dir,
    prepare_run_dir,
    release_run_dir,
    reset_active_run,
)


@pytest.fixture(autouse=True)
def _forget(tmp_path):
    """Each test starts with no run directory open and leaves no lock held by this process."""
    reset_active_run()
    yield
    for path in [tmp_path, *tmp_path.rglob("*")]:
        release_run_dir(path)
    reset_active_run()


def _held_by_another(run: Path, pid: str) -> object:
    """What a second live process does to ``run``: an exclusive flock on the lock file, through
    an open file of its own (flock locks belong to the open file, so this blocks this process's
    own attempts the way another process would)."""
    run.mkdir(parents=True, exist_ok=True)
    fh = open(run / LOCK_FILE, "w")  # noqa: SIM115 - closed by the test
    fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    fh.write(f"{pid}\n")
    fh.flush()
    return fh


def test_default_run_dir_is_stage_and_utc_second():
    path = default_run_dir("collect")
    assert path.parent == Path("runs")
    assert re.fullmatch(r"collect-\d{8}T\d{6}Z", path.name)


def test_a_new_directory_is_created_locked_by_this_process_and_marked_active(tmp_path):
    run = prepare_run_dir(tmp_path / "a" / "run", "collect")
    assert run.is_dir()
    assert (run / LOCK_FILE).read_text() == f"{os.getpid()}\n"
    act = active_run()
    assert (act.run_dir, act.stage, act.created, act.resumed) == (run, "collect", True, False)
    reset_active_run()
    assert active_run().run_dir is None


def test_an_existing_run_is_refused_without_overwrite_or_resume_and_left_as_it_was(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "steps.parquet").write_text("user data")
    with pytest.raises(SrolloutError, match=r"already exists and is not empty; pass --overwrite"):
        prepare_run_dir(run, "collect")
    assert sorted(p.name for p in run.iterdir()) == ["steps.parquet"]  # not even a lock file


def test_an_empty_directory_or_one_with_only_a_lock_file_needs_no_flag(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    assert prepare_run_dir(run, "collect") == run
    release_run_dir(run)
    assert (run / LOCK_FILE).exists()
    assert prepare_run_dir(run, "sweep") == run
    assert active_run().created is False


def test_resume_keeps_the_partial_artifacts_and_needs_an_existing_directory(tmp_path):
    with pytest.raises(SrolloutError, match=r"--resume: .*missing does not exist"):
        prepare_run_dir(tmp_path / "missing", "collect", resume=True)
    assert not (tmp_path / "missing").exists()
    run = tmp_path / "run"
    (run / "parts").mkdir(parents=True)
    (run / "parts" / "g0.parquet").write_text("group 0")
    prepare_run_dir(run, "collect", resume=True)
    assert (run / "parts" / "g0.parquet").read_text() == "group 0"
    assert (active_run().created, active_run().resumed) == (False, True)


def test_overwrite_empties_the_directory_but_never_follows_a_link_out_of_it(tmp_path):
    user = tmp_path / "user-data"
    user.mkdir()
    (user / "precious.txt").write_text("keep me")
    run = tmp_path / "run"
    (run / "figures").mkdir(parents=True)
    (run / "figures" / "a.png").write_text("png")
    (run / "report.md").write_text("# old")
    (run / "linked").symlink_to(user, target_is_directory=True)
    prepare_run_dir(run, "collect", overwrite=True)
    assert sorted(p.name for p in run.iterdir()) == [LOCK_FILE]
    assert (user / "precious.txt").read_text() == "keep me"


def test_a_file_where_the_directory_should_be_is_refused(tmp_path):
    (tmp_path / "run").write_text("not a directory")
    with pytest.raises(SrolloutError, match=r"--out .*run: exists and is not a directory"):
        prepare_run_dir(tmp_path / "run", "collect", overwrite=True)
    assert (tmp_path / "run").read_text() == "not a directory"


@pytest.mark.parametrize("flags", [{}, {"overwrite": True}, {"resume": True}])
def test_a_live_writer_is_named_whatever_the_flags_and_nothing_is_touched(tmp_path, flags):
    run = tmp_path / "run"
    other = _held_by_another(run, "4242")
    (run / "steps.parquet").write_text("being written")
    try:
        busy = r"being written by another srollout process \(PID 4242\)"
        with pytest.raises(RunDirBusyError, match=busy):
            prepare_run_dir(run, "collect", **flags)
        assert (run / "steps.parquet").read_text() == "being written"
        assert active_run().run_dir is None
    finally:
        other.close()
    # the holder is gone (the kernel drops a dead process's lock the same way): resume goes on
    prepare_run_dir(run, "collect", resume=True)
    assert (run / LOCK_FILE).read_text() == f"{os.getpid()}\n"


def test_the_lock_is_reentrant_in_this_process_and_moves_with_the_directory_written(tmp_path):
    one, two = tmp_path / "one", tmp_path / "two"
    lock_run_dir(one)
    lock_run_dir(one)  # the same process again: no error
    lock_run_dir(two)  # a process writes one directory at a time: "one" is released
    probe = open(one / LOCK_FILE)  # noqa: SIM115 - closed below
    with probe:
        fcntl.flock(probe.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)  # would raise if still held
    probe = open(two / LOCK_FILE)  # noqa: SIM115 - closed below
    with probe, pytest.raises(BlockingIOError):
        fcntl.flock(probe.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)


@dataclasses.dataclass
class _Config:
    input: Path
    K: tuple[int, ...]
    extra: dict


def test_manifest_goes_from_partial_to_complete_with_a_json_config(tmp_path):
    run = prepare_run_dir(tmp_path / "run", "sweep")
    manifest = Manifest(run, "sweep", _Config(Path("runs/c"), (5, 10), {1: Path("x")}))
    assert active_run().manifest is manifest
    data = json.loads((run / "manifest.json").read_text())
    assert data["stage"] == "sweep" and data["status"] == "partial"
    assert data["config"] == {"input": "runs/c", "K": [5, 10], "extra": {"1": "x"}}
    assert data["versions"]["srollout"] and data["versions"]["python"]
    assert data["outputs"] == [] and "finished_utc" not in data
    manifest.complete(
        [run / "sweep.parquet", run / "report.md", Path("elsewhere/report.md")], chosen={"K": 10}
    )
    data = json.loads((run / "manifest.json").read_text())
    assert data["status"] == "complete"
    assert data["outputs"] == ["report.md", "sweep.parquet"]  # names, sorted, once each
    assert data["chosen"] == {"K": 10}
    assert data["timings_s"]["total"] >= 0 and data["finished_utc"] >= data["started_utc"]


def test_an_interrupted_manifest_stays_partial_and_says_why(tmp_path):
    run = tmp_path / "run"
    manifest = Manifest(run, "collect", {"groups": 4})
    manifest.update(groups_done=2)
    manifest.interrupted("SIGTERM")
    data = json.loads((run / "manifest.json").read_text())
    assert data["status"] == "partial" and data["groups_done"] == 2
    assert data["interrupted"]["reason"] == "SIGTERM"
    assert active_run().manifest is None  # not the directory prepare_run_dir opened


def _made(run: Path, stage: str, config: dict) -> Path:
    run.mkdir(parents=True, exist_ok=True)
    (run / "manifest.json").write_text(json.dumps({"stage": stage, "config": config}))
    return run


def test_resume_needs_a_manifest_of_the_same_stage(tmp_path):
    with pytest.raises(SrolloutError, match=r"has no manifest.json; it is not a collect run"):
        check_resumable(tmp_path, "collect", {}, "groups")
    run = _made(tmp_path / "run", "sweep", {})
    with pytest.raises(SrolloutError, match=r"is a 'sweep' run, not a collect run"):
        check_resumable(run, "collect", {}, "groups")


def test_resume_compares_the_key_as_json_and_names_the_first_difference(tmp_path):
    run = _made(tmp_path / "run", "collect", {"groups": 4, "K": [5, 10], "out": "runs/x"})
    check_resumable(run, "collect", {"groups": 4, "K": (5, 10), "out": Path("runs/x")}, "groups")
    with pytest.raises(SrolloutError) as caught:
        check_resumable(run, "collect", {"groups": 8, "K": (5,)}, "groups")
    assert str(caught.value) == (
        f"--resume: {run} was made with groups=4, not 8; use the same "
        "options (its groups would not match)"
    )


def test_an_option_added_later_reads_as_the_value_older_runs_played(tmp_path):
    run = _made(tmp_path / "run", "collect", {"groups": 4})  # written before --difficulty existed
    assert ADDED_OPTIONS["difficulty"] == "small"
    check_resumable(run, "collect", {"groups": 4, "difficulty": "small"}, "groups")
    with pytest.raises(SrolloutError, match=r"made with difficulty='small', not 'large'"):
        check_resumable(run, "collect", {"difficulty": "large"}, "groups")
    with pytest.raises(SrolloutError, match=r"made with seed=None, not 3"):
        check_resumable(run, "collect", {"seed": 3}, "groups")  # not an added option: no default


def test_manifest_names_the_cpu_and_the_kernels_torch_chose(tmp_path, monkeypatch):
    """Two runs' training floats agree bit for bit only on the same CPU kernels: the manifest
    says which, so two runs can be compared knowingly (docs/reliability.md)."""
    import sys

    import torch

    from srollout.rundir import KERNEL_ENV

    for name in KERNEL_ENV:  # make test-other-kernels sets some of them
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "avx2")
    monkeypatch.delitem(sys.modules, "torch")  # a stage that never loaded torch (sweep)
    run = prepare_run_dir(tmp_path / "run", "sweep")
    manifest = Manifest(run, "sweep", _Config(Path("x"), (5,), {}))
    machine = json.loads((run / "manifest.json").read_text())["machine"]
    cpuinfo = Path("/proc/cpuinfo").read_text()
    model = next(ln.split(":", 1)[1].strip() for ln in cpuinfo.splitlines() if "model name" in ln)
    assert machine["cpu_model"] == model and machine["cpu_count"] >= 1
    assert "torch_cpu_capability" not in machine
    assert machine["kernel_env"] == {"ATEN_CPU_CAPABILITY": "avx2"}
    monkeypatch.setitem(sys.modules, "torch", torch)  # loaded by the time the stage completes
    manifest.complete([])
    machine = json.loads((run / "manifest.json").read_text())["machine"]
    assert machine["torch_cpu_capability"] == torch.backends.cpu.get_cpu_capability()
    assert machine["torch_threads"] == torch.get_num_threads()
