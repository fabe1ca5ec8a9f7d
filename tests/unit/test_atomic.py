"""srollout.atomic: a write either lands whole or leaves the previous file as it was."""

from __future__ import annotations

import errno
import json
from pathlib import Path

import pytest

from srollout.atomic import atomic_write, atomic_write_json, atomic_write_text
from srollout.errors import DiskFullError


def _names(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir())


def test_json_is_indented_key_sorted_with_a_final_newline_and_makes_its_directory(tmp_path):
    target = tmp_path / "a" / "b" / "o.json"
    path = atomic_write_json({"b": [1, 2], "a": {"y": 1.5, "x": None}}, target)
    assert path == tmp_path / "a" / "b" / "o.json"
    expected = '{\n  "a": {\n    "x": null,\n    "y": 1.5\n  },\n  "b": [\n    1,\n    2\n  ]\n}\n'
    assert path.read_text() == expected
    assert _names(path.parent) == ["o.json"]


def test_json_default_converts_what_json_cannot_and_without_it_the_old_file_stays(tmp_path):
    path = atomic_write_json({"run": Path("runs/x")}, tmp_path / "o.json", default=str)
    assert json.loads(path.read_text()) == {"run": "runs/x"}
    with pytest.raises(TypeError, match="PosixPath"):
        atomic_write_json({"run": Path("runs/y")}, path)
    assert json.loads(path.read_text()) == {"run": "runs/x"}
    assert _names(tmp_path) == ["o.json"]


def test_text_replaces_the_whole_file(tmp_path):
    path = atomic_write_text("a long first version\n", tmp_path / "r.md")
    atomic_write_text("short\n", path)
    assert path.read_text() == "short\n"  # not "short\n" over the tail of the first version


def test_a_writer_that_fails_half_way_leaves_the_previous_file_and_no_temp_file(tmp_path):
    path = atomic_write_text("version 1\n", tmp_path / "r.md")

    def half(fh):
        fh.write("version 2, first half")
        raise ValueError("the writer broke")

    with pytest.raises(ValueError, match="the writer broke"):
        atomic_write(path, half)
    assert path.read_text() == "version 1\n"
    assert _names(tmp_path) == ["r.md"]


def test_an_interrupt_during_the_write_also_drops_the_temp_file_and_is_not_swallowed(tmp_path):
    def interrupted(fh):
        fh.write("partial")
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        atomic_write(tmp_path / "new.json", interrupted)
    assert _names(tmp_path) == []  # neither the target nor a temp file


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EDQUOT])
def test_a_full_disk_is_one_line_naming_the_file_and_the_old_file_is_intact(tmp_path, code):
    path = atomic_write_text("version 1\n", tmp_path / "steps.json")

    def full(fh):
        fh.write("x")
        raise OSError(code, "No space left on device")

    with pytest.raises(DiskFullError) as caught:
        atomic_write(path, full)
    message = str(caught.value)
    assert message.startswith(f"no space left on the device while writing {path};")
    assert "\n" not in message
    assert isinstance(caught.value.__cause__, OSError) and caught.value.__cause__.errno == code
    assert path.read_text() == "version 1\n"
    assert _names(tmp_path) == ["steps.json"]


def test_another_os_error_is_not_reported_as_a_full_disk(tmp_path):
    def denied(fh):
        raise PermissionError(errno.EACCES, "Permission denied")

    with pytest.raises(PermissionError):
        atomic_write(tmp_path / "x.json", denied)
    assert _names(tmp_path) == []


def test_a_directory_lands_whole_or_not_at_all(tmp_path):
    from srollout.atomic import atomic_dir

    target = tmp_path / "cache" / "model"
    with pytest.raises(RuntimeError), atomic_dir(target) as tmp:
        (tmp / "weights").write_text("half")
        raise RuntimeError("killed")
    assert _names(tmp_path / "cache") == []  # neither the target nor the temp directory
    with atomic_dir(target) as tmp:
        (tmp / "weights").write_text("v1")
    assert _names(target) == ["weights"] and _names(tmp_path / "cache") == ["model"]
    with atomic_dir(target, keep_existing=True) as tmp:  # another process built it first
        (tmp / "weights").write_text("v2")
    assert (target / "weights").read_text() == "v1"
    with atomic_dir(target) as tmp:  # replaced
        (tmp / "weights").write_text("v3")
    assert (target / "weights").read_text() == "v3" and _names(tmp_path / "cache") == ["model"]


def test_a_full_disk_while_filling_a_directory_names_it_and_the_space_left(tmp_path):
    from srollout.atomic import atomic_dir

    with pytest.raises(DiskFullError) as caught, atomic_dir(tmp_path / "d") as tmp:
        (tmp / "x").write_text("x")
        raise OSError(errno.ENOSPC, "No space left on device")
    message = str(caught.value)
    assert message.startswith(f"no space left on the device while writing {tmp_path / 'd'};")
    assert f"MB free in {tmp_path};" in message and "\n" not in message
    assert _names(tmp_path) == []
