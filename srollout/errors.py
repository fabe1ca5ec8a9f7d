"""Errors a user can cause. The CLI turns each into one red line and exit code 2."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple


class SrolloutError(Exception):
    """A known, user-facing error: bad input, missing file, wrong schema, bad option value.

    The message must be one line that says what is wrong and, where it helps, what to do.
    """


class ArgumentError(SrolloutError, ValueError):
    """A bad argument, named as the function or config that takes it names it. ``template``
    holds one ``{name}`` field per argument it is about; ``str()`` shows each as ``name=value``
    (``K=12 is larger than T_max=10``; ``{name:name}``: the name alone), and the CLI's one error
    handler shows the same line with each argument's flag (``--K 12 is larger than --T-max 10``;
    :meth:`render`, ``srollout.cli.app.cli_line``). So the pure core never names a command-line
    flag."""

    def __init__(self, template: str, **values: Any) -> None:
        self.template, self.values = template, values
        super().__init__(self.render())

    def render(self, name_of: Callable[[str], str] = str, sep: str = "=") -> str:
        """The message with each argument named ``name_of(name)`` and shown with its value after
        ``sep`` (the CLI: its flag, a space, the value)."""
        shown = {n: _Shown(name_of(n), sep, v) for n, v in self.values.items()}
        return self.template.format(**shown)


class _Shown(NamedTuple):
    """One argument of an :class:`ArgumentError` as its template shows it."""

    name: str
    sep: str
    value: Any

    def __format__(self, spec: str) -> str:
        return self.name if spec == "name" else f"{self.name}{self.sep}{self.value}"


class SchemaError(SrolloutError):
    """An artifact file is missing a column, has a mistyped column, or is empty."""


class NotAvailableError(SrolloutError):
    """A subcommand or backend that this installation cannot run (missing extra, no GPU)."""


class DiskFullError(SrolloutError):
    """A write failed for lack of space (ENOSPC, EDQUOT). Writes are atomic, so every file that
    was there before is still whole; the message names the file and says to free space."""


class EnvError(SrolloutError):
    """An environment failed mid-run (``make_env``, ``reset`` or ``step`` raised, or gave what the
    protocol does not allow); the message names the environment, group, trajectory and step. The
    groups finished before it are kept; the stage adds how to continue."""


class RunDirBusyError(SrolloutError):
    """Another live process holds the run directory's lock (one writer per run directory)."""


class Interrupted(BaseException):  # noqa: N818 - a stop request, like KeyboardInterrupt
    """SIGINT or SIGTERM arrived: unwind (atomic writes drop their temp files), then the CLI marks
    the run directory's manifest as interrupted and exits 128 + the signal number.

    A BaseException, like KeyboardInterrupt, so ``except Exception`` blocks let it through.
    """

    def __init__(self, signum: int) -> None:
        import signal

        self.signum = int(signum)
        self.name = signal.Signals(self.signum).name
        super().__init__(self.name)


def one_line(err: BaseException, limit: int = 200) -> str:
    """The first line of ``err``'s message that says something (a library's banner of asterisks
    or an empty first line skipped), at most ``limit`` characters: how an error of a library
    goes into one of ours."""
    import re

    plain = re.sub(r"\x1b\[[0-9;]*m", "", str(err))  # a terminal's colour codes
    lines = [line.strip() for line in plain.splitlines()]
    text = next((line for line in lines if any(c.isalnum() for c in line)), "")
    return text if len(text) <= limit else text[: limit - 1] + "…"


def entry_point(group: str, name: str, what: str) -> tuple[Any, str] | None:
    """The entry point ``name`` of ``group`` as (its object, its value), or None when no package
    installs it; one that does not load is one SrolloutError starting with ``what``."""
    from importlib.metadata import entry_points

    point = next((ep for ep in entry_points(group=group) if ep.name == name), None)
    if point is None:
        return None
    try:
        return point.load(), point.value
    except Exception as e:
        raise SrolloutError(
            f"{what}: entry point {point.value!r} does not load ({type(e).__name__}: {one_line(e)})"
        ) from e


NO_SPACE_ERRNOS = (28, 122)  # ENOSPC, EDQUOT (Linux)
NO_SPACE_TEXTS = ("no space left on device", "disk quota exceeded", "os error 28")


def disk_full(err: BaseException) -> bool:
    """True when ``err`` (or an error it was raised from) is a write that failed for lack of
    space: an OSError with ENOSPC/EDQUOT, or a library error whose message says so (polars and
    torch re-raise the OS error as their own type)."""
    seen: set[int] = set()
    current: BaseException | None = err
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, OSError) and current.errno in NO_SPACE_ERRNOS:
            return True
        if any(s in str(current).lower() for s in NO_SPACE_TEXTS):
            return True
        current = current.__cause__ or current.__context__
    return False
