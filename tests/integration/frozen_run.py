"""Kill a real `srollout` process at an exact point of its work, without a race.

The child runs the CLI with one function wrapped: right after that function's ``after``-th call
returns, the child freezes itself (SIGSTOP). The test waits for that with
``waitpid(WUNTRACED)``, an event rather than polling a directory against a deadline, so the run
can neither finish between two looks nor run on past the point. :func:`frozen_at` hands the frozen
process to the test (to signal it, or to act while it holds still); :func:`signal_when_frozen`
sends it one signal.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import IO, NamedTuple

import pytest

# argv: module, attribute (``f`` or ``Class.f``), after, then the srollout arguments
WRAPPER = """
import importlib, os, signal, sys
module, attribute, after = sys.argv[1], sys.argv[2], int(sys.argv[3])
owner = importlib.import_module(module)
*path, name = attribute.split(".")
for part in path:
    owner = getattr(owner, part)
original, calls = getattr(owner, name), []

def frozen(*args, **kwargs):
    out = original(*args, **kwargs)
    calls.append(1)
    if len(calls) == after:
        os.kill(os.getpid(), signal.SIGSTOP)  # the test sends its signal now
    return out

setattr(owner, name, frozen)
sys.argv = ["srollout", *sys.argv[4:]]
from srollout.cli.app import main
main()
"""


class Frozen(NamedTuple):
    """A run frozen at its hook (:func:`frozen_at`): ``proc`` to signal (SIGCONT resumes it)."""

    proc: subprocess.Popen
    err: IO[bytes]

    def finish(self, timeout: float = 120) -> subprocess.CompletedProcess:
        """Wait for the run to end: its return code (-sig for a kill) and stderr."""
        rc = self.proc.wait(timeout=timeout)
        self.err.seek(0)
        return subprocess.CompletedProcess(
            self.proc.args, rc, "", self.err.read().decode(errors="replace")
        )


@contextlib.contextmanager
def frozen_at(
    args: Sequence[str],
    hook: tuple[str, str, int],
    env: dict[str, str],
    cwd: Path,
    timeout: float = 240,
) -> Iterator[Frozen]:
    """Run ``srollout *args`` and yield it frozen right after ``hook`` = (module, attribute, n)'s
    n-th call; killed on the way out if still alive. Fails the test if the run ended, or had not
    got there after ``timeout`` seconds, before it froze."""
    module, attribute, after = hook
    with tempfile.TemporaryFile() as err:
        proc = subprocess.Popen(
            [sys.executable, "-c", WRAPPER, module, attribute, str(after), *args],
            env=env,
            cwd=cwd,
            stdout=subprocess.DEVNULL,
            stderr=err,  # a file, not a pipe: a child that writes a lot never blocks on us
        )
        timer = threading.Timer(timeout, proc.kill)
        timer.start()
        try:
            _, status = os.waitpid(proc.pid, os.WUNTRACED)
        finally:
            timer.cancel()
        if not os.WIFSTOPPED(status):
            proc.returncode = os.waitstatus_to_exitcode(status)  # reaped here, not by Popen
            err.seek(0)
            pytest.fail(
                f"the run ended (rc {proc.returncode}) before {attribute} was called {after} "
                f"times: {err.read().decode(errors='replace')[-1500:]}"
            )
        try:
            yield Frozen(proc, err)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def signal_when_frozen(
    args: Sequence[str],
    hook: tuple[str, str, int],
    env: dict[str, str],
    cwd: Path,
    sig: int = signal.SIGKILL,
    timeout: float = 240,
) -> int:
    """Run ``srollout *args``, freeze it right after ``hook``'s n-th call (:func:`frozen_at`),
    send ``sig`` and return the process's return code (-sig for a kill)."""
    with frozen_at(args, hook, env, cwd, timeout) as run:
        os.kill(run.proc.pid, sig)
        if sig != signal.SIGKILL:  # a stopped process handles its signal once resumed
            os.kill(run.proc.pid, signal.SIGCONT)
        return run.finish().returncode
