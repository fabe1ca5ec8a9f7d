"""Atomic file writes (temp file in the same directory, then ``os.replace``).

A crash never leaves half a file, and a write that runs out of space leaves the previous version in
place (:class:`~srollout.errors.DiskFullError`). Every file srollout writes goes through
:func:`atomic_file` (Parquet, JSON, text, figures, checkpoints); a directory written whole (a
group's part, a built model) is renamed into place by its own module. No third-party imports, so
``srollout.core`` can use it without pulling polars.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

from srollout.errors import DiskFullError, disk_full


def atomic_file(path: str | Path, fill: Callable[[str], None]) -> Path:
    """Create ``path``'s directory, let ``fill(tmp)`` write a temp file beside it (any writer:
    Parquet, ``torch.save``, a figure), give it the mode a plain ``open`` would and rename it into
    place; on any error the temp file goes and ``path`` is as it was."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        fill(tmp)
        umask_mode(tmp)
        os.replace(tmp, path)
    except BaseException as err:
        Path(tmp).unlink(missing_ok=True)
        if isinstance(err, Exception) and disk_full(err):
            raise no_space(path) from err
        raise
    return path


def atomic_write(path: str | Path, write: Callable[[IO[str]], None]) -> Path:
    """:func:`atomic_file` for text: ``write(fh)`` fills the temp file through a text handle."""

    def fill(tmp: str) -> None:
        with open(tmp, "w") as fh:
            write(fh)

    return atomic_file(path, fill)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def umask_mode(tmp: str | Path) -> None:
    """Give a temp file the mode a plain ``open`` would (0666 less the umask): ``mkstemp`` makes
    it 0600, and the artifacts of a run should be as readable as any other file the user writes."""
    os.chmod(tmp, 0o666 & ~_umask())


def no_space(path: str | Path) -> DiskFullError:
    """The one-line error of a write that ran out of space: ``path`` was not replaced."""
    return DiskFullError(
        f"no space left on the device while writing {path}; the files already there are "
        "intact (every write is a temp file + rename)"
    )


def atomic_write_json(
    obj: Any, path: str | Path, default: Callable[[Any], Any] | None = None
) -> Path:
    """``obj`` as indented, key-sorted JSON with a final newline."""

    def write(fh: IO[str]) -> None:
        json.dump(obj, fh, indent=2, sort_keys=True, default=default)
        fh.write("\n")

    return atomic_write(path, write)


def atomic_write_text(text: str, path: str | Path) -> Path:
    return atomic_write(path, lambda fh: fh.write(text))
