"""One number format for markdown and rich tables, so report.md and the console agree."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import polars as pl


def format_value(value: Any, digits: int = 3) -> str:
    """A cell as text: floats to ``digits`` decimals (scientific below 1e-3), missing as ``—``."""
    if value is None:
        return "—"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        if math.isnan(value):
            return "—"
        if value != 0.0 and abs(value) < 10 ** (-digits):
            return f"{value:.1e}"
        return f"{value:.{digits}f}"
    if isinstance(value, (list, tuple)):
        return ", ".join(format_value(v, digits) for v in value)
    return str(value)


def pct(x: float | None) -> str:
    """A share as ``12.3 %``; missing or NaN as ``—``."""
    return "—" if x is None or x != x else f"{100 * x:.1f} %"


def num(x: float | None, digits: int = 1) -> str:
    """A number with thousands separators; missing or NaN as ``—``."""
    return "—" if x is None or x != x else f"{x:,.{digits}f}"


def mean_pm(m: float | None, s: float, scale: float = 1.0, digits: int = 1) -> str:
    """``mean ± std`` (both times ``scale``); missing or NaN as ``—``."""
    return "—" if m is None or m != m else f"{m * scale:.{digits}f} ± {s * scale:.{digits}f}"


def _cells(
    df: pl.DataFrame, columns: Sequence[str] | None, digits: int | dict[str, int]
) -> tuple[list[str], list[list[str]]]:
    columns = list(columns) if columns is not None else list(df.columns)
    per_col = digits if isinstance(digits, dict) else {}
    default = digits if isinstance(digits, int) else 3
    rows = [
        [format_value(row[c], per_col.get(c, default)) for c in columns]
        for row in df.select(columns).iter_rows(named=True)
    ]
    return columns, rows


def to_markdown(
    df: pl.DataFrame,
    columns: Sequence[str] | None = None,
    digits: int | dict[str, int] = 3,
    bold_rows: Sequence[int] = (),
) -> str:
    """``df`` as a GitHub-flavoured markdown table (pipes in cells escaped); rows in
    ``bold_rows`` in bold."""
    header, rows = _cells(df, columns, digits)
    bold = set(bold_rows)

    def line(cells: Sequence[str]) -> str:
        return "| " + " | ".join(c.replace("|", "\\|").replace("\n", " ") for c in cells) + " |"

    out = [line(header), "|" + "|".join("---" for _ in header) + "|"]
    for i, cells in enumerate(rows):
        out.append(line([f"**{c}**" if i in bold and c else c for c in cells]))
    return "\n".join(out) + "\n"


def to_rich(
    df: pl.DataFrame,
    title: str | None = None,
    columns: Sequence[str] | None = None,
    digits: int | dict[str, int] = 3,
    highlight_rows: Sequence[int] = (),
    headers: Mapping[str, str] | None = None,
) -> Any:
    """``df`` as a ``rich.table.Table``; rows in ``highlight_rows`` in bold green; ``headers``
    renames columns for display (short names keep wide tables inside a terminal)."""
    from rich import box
    from rich.table import Table

    header, rows = _cells(df, columns, digits)
    table = Table(
        title=title, header_style="bold", box=box.SIMPLE_HEAD, padding=(0, 0), show_edge=False
    )
    numeric = {c for c in header if df.schema[c].is_numeric()}
    names = headers or {}
    for c in header:
        table.add_column(
            names.get(c, c),
            justify="right" if c in numeric else "left",
            overflow="fold",
            no_wrap=c in numeric,
        )
    marked = set(highlight_rows)
    for i, cells in enumerate(rows):
        table.add_row(*cells, style="bold green" if i in marked else None)
    return table
