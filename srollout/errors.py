"""Errors a user can cause. The CLI turns each into one red line and exit code 2."""

from __future__ import annotations


class SrolloutError(Exception):
    """A known, user-facing error: bad input, missing file, wrong schema, bad option value.

    The message must be one line that says what is wrong and, where it helps, what to do.
    """


class SchemaError(SrolloutError):
    """An artifact file is missing a column, has a mistyped column, or is empty."""


class NotAvailableError(SrolloutError):
    """A subcommand or backend that this installation cannot run (missing extra, no GPU)."""
