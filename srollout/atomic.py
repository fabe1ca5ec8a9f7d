"""Atomic writes (a temp file in the same directory, then ``os.replace``): every file srollout
writes goes through :func:`atomic_file`, every directory written whole through :func:`atomic_dir`
(docs/reliability.md, "A full disk loses nothing"). No third-party imports, so ``srollout.core``
can use it without pulling polars.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
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


@contextmanager
def atomic_dir(path: str | Path, *, keep_existing: bool = False) -> Iterator[Path]:
    """Yield an empty temp directory beside ``path`` for the ``with`` body to fill; on a clean
    exit give it the mode a plain ``mkdir`` would and rename it to ``path`` in one ``os.replace``,
    so ``path`` exists whole or not at all. A ``path`` already there is replaced, or, with
    ``keep_existing``, kept (another process built the same cache entry first: theirs is as good).
    On any error the temp directory goes, and a full disk is one
    :class:`~srollout.errors.DiskFullError` naming ``path`` and the space left."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.tmp-", dir=path.parent))
    try:
        yield tmp
        tmp.chmod(0o777 & ~_umask())
        if path.is_dir() and not keep_existing:
            shutil.rmtree(path)
        try:
            os.replace(tmp, path)
        except OSError:  # ENOTEMPTY/EEXIST: another process renamed its directory there first
            if not (keep_existing and path.is_dir()):
                raise
    except BaseException as err:
        if isinstance(err, Exception) and disk_full(err):
            raise no_space(path) from err
        raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


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
    """The one-line error of a write that ran out of space: ``path`` was not replaced; the line
    names the space left in its directory."""
    folder = Path(path).parent
    while not folder.is_dir() and folder != folder.parent:
        folder = folder.parent
    try:
        left = f"{shutil.disk_usage(folder).free / 1e6:,.0f} MB free in {folder}"
    except OSError:
        left = f"free space in {folder} unknown"
    return DiskFullError(
        f"no space left on the device while writing {path}; {left}; the files already there "
        "are intact (every write is a temp file + rename)"
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
