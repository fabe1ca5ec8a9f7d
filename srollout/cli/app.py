"""`srollout` entry point: registers the subcommands and turns known errors into exit code 2.

Each subcommand lives in its own module under ``srollout.cli`` and only parses options into a
frozen config from :mod:`srollout.config`, then calls its stage. Heavy libraries (torch,
transformers, alfworld, vllm, ray) are imported inside the stages, so ``--help`` is fast.
"""

from __future__ import annotations

import os
import sys

import typer

from srollout.errors import SrolloutError

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
    # Order here is the order `srollout --help` lists them: the paper's pipeline order.
    from srollout.cli import (
        ab_rollout,
        analyze,
        collect,
        policy,
        serve,
        sweep,
        train_offpolicy,
        train_onpolicy,
    )

    # `policy` (build/inspect the default policy) and `serve` (a vLLM server) are helpers, listed
    # after the pipeline.
    for module in (collect, analyze, sweep, ab_rollout, train_offpolicy, train_onpolicy, policy, serve):
        module.register(app)


_register()


def main() -> None:
    """Console-script entry: run the app; known errors become one red line and exit 2."""
    try:
        app(standalone_mode=False)
    except SrolloutError as err:
        if os.environ.get("SROLLOUT_DEBUG") == "1":
            raise
        _fail(str(err))
    except (typer.Exit, SystemExit) as done:
        code = getattr(done, "exit_code", None)
        if code is None:
            code = getattr(done, "code", 0)
        sys.exit(code or 0)
    except typer.Abort:
        _fail("aborted")
    except Exception as err:  # click usage errors carry their own exit code
        import click

        if isinstance(err, click.exceptions.ClickException):
            err.show()
            sys.exit(2)
        raise


def _fail(message: str) -> None:
    from rich.console import Console
    from rich.markup import escape

    Console(stderr=True).print(f"[bold red]error:[/] {escape(message)}", highlight=False, soft_wrap=True)
    sys.exit(2)


if __name__ == "__main__":
    main()
