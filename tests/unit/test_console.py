"""The stages' console: wide tables stay readable when output goes to a file or a pipe."""

from __future__ import annotations

import io

from srollout.console import PIPE_WIDTH, make_console


def test_off_a_terminal_the_console_is_pipe_width(monkeypatch):
    monkeypatch.delenv("COLUMNS", raising=False)
    console = make_console(file=io.StringIO())
    assert console.width == PIPE_WIDTH == 160


def test_columns_wins_off_a_terminal(monkeypatch):
    monkeypatch.setenv("COLUMNS", "100")
    assert make_console(file=io.StringIO()).width == 100


def test_an_explicit_width_wins(monkeypatch):
    monkeypatch.delenv("COLUMNS", raising=False)
    assert make_console(file=io.StringIO(), width=72).width == 72


def test_a_wide_table_keeps_its_header_on_one_line(monkeypatch):
    from rich.table import Table

    monkeypatch.delenv("COLUMNS", raising=False)
    out = io.StringIO()
    table = Table(*[f"column_{i}_heading" for i in range(7)])  # ~120 columns wide
    table.add_row(*["0.123"] * 7)
    make_console(file=out).print(table)
    assert "column_6_heading" in out.getvalue()  # at 80 columns rich folds the headings
