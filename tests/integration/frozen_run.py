"""Kill a real `srollout` process at an exact point of its work, without a race.

The child runs the CLI with one function wrapped: right after that function's ``after``-th call
returns, the child freezes itself (SIGSTOP). The test waits for that with
``waitpid(WUNTRACED)``, an event rather than polling a directory against a deadline, so the run
can neither finish between two looks nor run on past the point; then it sends the signal to the
frozen process. This is test_reliability.py's "SIGSTOP first", with the stop moved into the child.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Sequence
from pathlib import Path

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


def signal_when_frozen(
    args: Sequence[str],
    hook: tuple[str, str, int],
    env: dict[str, str],
    cwd: Path,
    sig: int = signal.SIGKILL,
    timeout: float = 240,
) -> int:
    """Run ``srollout *args``, freeze it right after ``hook`` = (module, attribute, n)'s n-th
    call, send ``sig`` and return the process's return code (-sig for a kill). Fails the test
    if the run ended, or had not got there after ``timeout`` seconds, before it froze."""
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
        os.kill(proc.pid, sig)
        if sig != signal.SIGKILL:
            os.kill(proc.pid, signal.SIGCONT)  # a stopped process handles its signal once resumed
        return proc.wait(timeout=120)
