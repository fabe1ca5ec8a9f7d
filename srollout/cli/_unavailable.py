"""Subcommands that a later piece of work builds: they exist in `--help`, but say so and exit 2."""

from __future__ import annotations

from collections.abc import Callable

import typer

from srollout.errors import NotAvailableError


def unavailable_command(name: str, help_line: str, what: str) -> Callable[[typer.Typer], None]:
    """Return a ``register(app)`` that adds a command which refuses to run (exit 2)."""

    def register(app: typer.Typer) -> None:
        @app.command(
            name,
            help=f"{help_line} (not available yet)",
            context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
        )
        def _command(ctx: typer.Context) -> None:
            raise NotAvailableError(f"`srollout {name}` is not available yet: {what}")

    return register
