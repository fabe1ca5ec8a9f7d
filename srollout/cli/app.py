"""`srollout` entry point: registers the subcommands and turns known errors into exit code 2.

Each subcommand lives in its own module under ``srollout.cli`` and only parses options into a
frozen config from :mod:`srollout.config`, then calls its stage. Heavy libraries (torch,
transformers, alfworld, vllm, ray) are imported inside the stages, so ``--help`` is fast.
"""

from __future__ import annotations

import importlib
import os
import shlex
import signal
import sys

import typer

from srollout.errors import ArgumentError, DiskFullError, Interrupted, SrolloutError, disk_full

app = typer.Typer(
    name="srollout",
    help="Selective rollout for GRPO: stop agent groups mid-rollout when their trajectories "
    "already agree, and prove what it saves.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode="rich",
)


def _register() -> None:
    # The order `srollout --help` lists them in: the paper's pipeline, then the helpers `policy`
    # (build/inspect the default policy) and `serve` (a vLLM server).
    pipeline = ("collect", "analyze", "sweep", "what_if", "ab_rollout")
    for name in (*pipeline, "train_offpolicy", "train_onpolicy", "policy", "serve"):
        importlib.import_module(f"srollout.cli.{name}").register(app)


_register()


# Stages that continue a stopped run with --resume; the others start again with --overwrite.
RESUMABLE = ("collect", "ab-rollout", "train-onpolicy")


def _raise_interrupted(signum: int, frame: object) -> None:
    raise Interrupted(signum)


def main() -> None:
    """Console-script entry: known errors and a full disk become one red line and exit 2; SIGINT
    and SIGTERM raise :class:`Interrupted` (docs/reliability.md, promises 3 and 4)."""
    import threading

    main_thread = threading.current_thread() is threading.main_thread()  # signal.signal needs it
    previous = (
        {sig: signal.signal(sig, _raise_interrupted) for sig in (signal.SIGINT, signal.SIGTERM)}
        if main_thread
        else {}
    )
    try:
        _run()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _run() -> None:
    if "srollout.rundir" in sys.modules:  # an earlier main() in this process (tests) opened one
        sys.modules["srollout.rundir"].reset_active_run()
    try:
        app(standalone_mode=False)
    except Interrupted as stop:
        _stopped(stop)
    except SrolloutError as err:
        if os.environ.get("SROLLOUT_DEBUG") == "1":
            raise
        if isinstance(err, DiskFullError):
            _disk_full(str(err))
        _drop_empty_run_dir()
        _fail(cli_line(err))
    except (typer.Exit, SystemExit) as done:
        code = getattr(done, "exit_code", None)
        if code is None:
            code = getattr(done, "code", 0)
        sys.exit(code or 0)
    except typer.Abort:
        _fail("aborted")
    except Exception as err:  # click usage errors carry their own exit code
        if isinstance(err, _click_errors()):
            _fail(_usage_line(err))
        if (disk_full(err) or _run_dir_out_of_space()) and os.environ.get("SROLLOUT_DEBUG") != "1":
            # a library (torch, matplotlib, peft) that ran out of space mid-write: its temp file
            # is gone and the file it would replace is intact (every writer here is atomic)
            first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
            _disk_full(
                f"no space left on the device ({first}); the files already written are intact"
            )
        raise


def cli_line(err: SrolloutError) -> str:
    """The one line the user sees for ``err``: an :class:`~srollout.errors.ArgumentError` (a
    library function or config naming its own argument, ``T_max``) shown with the flag that
    argument comes from (``--T-max``), every other error as it is. The one place argument names
    become flags."""
    if not isinstance(err, ArgumentError):
        return str(err)
    from srollout.cli.rollout_options import flag

    return err.render(flag, " ")


def _click_errors() -> tuple[type, ...]:
    """Click's usage-error class: typer >= 0.20 vendors click as ``typer._click``, older typers use
    click itself; either may raise."""
    found: list[type] = []
    for module in ("typer._click.exceptions", "click.exceptions"):
        try:
            found.append(importlib.import_module(module).ClickException)
        except (ImportError, AttributeError):
            continue
    return tuple(found)


def _usage_line(err: Exception) -> str:
    """A click usage error (unknown option, bad value, missing argument) as one line that names
    the help to read."""
    message = " ".join(err.format_message().split())  # type: ignore[attr-defined]
    ctx = getattr(err, "ctx", None)
    path = getattr(ctx, "command_path", None)
    return f"{message} (see `{path} --help`)" if path else message


def _drop_empty_run_dir() -> None:
    """A stage refused its input after opening its run directory (a model that will not load,
    say): remove it if it holds no work yet (only the manifest and the lock)."""
    import shutil

    from srollout.rundir import LOCK_FILE, active_run, release_run_dir

    run = active_run()
    if run.run_dir is None or run.resumed or not run.run_dir.is_dir():
        return
    files = [p for p in run.run_dir.rglob("*") if not p.is_dir()]
    if not all(p.parent == run.run_dir and p.name in ("manifest.json", LOCK_FILE) for p in files):
        return
    release_run_dir(run.run_dir)
    if run.created:
        shutil.rmtree(run.run_dir, ignore_errors=True)
    else:  # the user's own (empty, or emptied by --overwrite) directory stays, empty
        for p in run.run_dir.iterdir():
            shutil.rmtree(p, ignore_errors=True) if p.is_dir() else p.unlink(missing_ok=True)
    run.run_dir = None


def _run_dir_out_of_space() -> bool:
    """The run directory's filesystem has (next to) no space left: torch's writer, for one, says
    only "file write failed" when the disk is full."""
    from srollout.rundir import active_run

    run = active_run().run_dir
    try:
        stat = os.statvfs(run) if run is not None else None
    except OSError:
        return False
    return stat is not None and stat.f_bavail * stat.f_frsize < 1 << 20


def _resume_hint() -> str:
    """The hint after a full disk: free space, then :func:`_continue_command`."""
    from srollout.rundir import active_run

    run = active_run()
    if run.run_dir is None:
        return "; free space and run the command again"
    return f"; free space, then {_continue_command(run.run_dir)}"


def _continue_command(run_dir: os.PathLike) -> str:
    """The command line again with --resume --out RUN_DIR (--overwrite if it has no --resume)."""
    args = [a for a in sys.argv[1:] if a not in ("--overwrite", "--resume")]
    if not any(a == "--out" or a.startswith("--out=") for a in args):
        args += ["--out", str(run_dir)]
    stage = next((a for a in sys.argv[1:] if not a.startswith("-")), "")
    if stage in RESUMABLE:
        return f"continue it with `srollout {shlex.join(args + ['--resume'])}`"
    return f"start it again with `srollout {shlex.join(args + ['--overwrite'])}`"


def _stopped(stop: Interrupted) -> None:
    """SIGINT/SIGTERM: mark the run's manifest, say what is kept and how to go on, exit 128+n."""
    for sig in (signal.SIGINT, signal.SIGTERM):  # a second Ctrl-C must not cut this short
        signal.signal(sig, signal.SIG_IGN)
    from srollout.rundir import active_run

    run = active_run()
    if run.run_dir is None or not run.run_dir.exists():
        message = f"interrupted by {stop.name} before a run directory was opened"
    elif run.manifest is not None and run.manifest.data.get("status") == "complete":
        message = (
            f"interrupted by {stop.name} after the run had finished: {run.run_dir} is complete"
        )
    else:
        if run.manifest is not None:
            try:
                run.manifest.interrupted(stop.name)
            except Exception:  # noqa: BLE001 - a full disk: the previous manifest (partial) stays
                pass
        message = (
            f"interrupted by {stop.name}: the work finished so far is kept in {run.run_dir} "
            f"(manifest status 'partial'); {_continue_command(run.run_dir)}"
        )
    _print_error(message, "stopped")
    sys.exit(128 + stop.signum)


def _disk_full(message: str) -> None:
    """A write ran out of space: mark the manifest if it still fits, say how to go on, exit 2."""
    from srollout.rundir import active_run

    run = active_run()
    if run.manifest is not None:
        try:
            run.manifest.interrupted("no space left on device")
        except Exception:  # noqa: BLE001 - no space for the manifest either: it stays 'partial'
            pass
    _fail(message + _resume_hint())


def _fail(message: str) -> None:
    _print_error(message, "error")
    sys.exit(2)


def _print_error(message: str, label: str) -> None:
    from rich.console import Console
    from rich.markup import escape

    Console(stderr=True).print(
        f"[bold red]{label}:[/] {escape(message)}", highlight=False, soft_wrap=True
    )


if __name__ == "__main__":
    main()
