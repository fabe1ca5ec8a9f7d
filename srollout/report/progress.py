"""The rich progress bar every long stage shows: one task, silent when disabled.

Each stage subclasses :class:`StageBar` for its own updates (``tick``, ``group``, ...) and
chooses the text columns around the bar; entering and leaving, and doing nothing at all when
disabled (rich is then not even imported), live here once.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any


class StageBar:
    """``label [before fields] ━━━ done/total [unit] [after fields] elapsed [ETA remaining]``.

    before / after: names of ``task.fields`` shown as text columns, each starting as ""; unit:
    a fixed word after the count (``groups``); eta: add the ETA columns. ``t0`` is when the bar
    was made (for rates); ``enabled`` False makes every method a no-op.
    """

    def __init__(self, console: Any, label: str, total: int, *, enabled: bool, completed: int = 0,
                 before: Sequence[str] = (), after: Sequence[str] = ("info",), unit: str | None = None,
                 eta: bool = True, transient: bool = False) -> None:
        self.enabled = enabled
        self.total = total
        self.t0 = time.perf_counter()
        if not enabled:
            return
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )

        columns: list[Any] = [TextColumn(f"[bold]{label}")]
        columns += [TextColumn(f"{{task.fields[{name}]}}") for name in before]
        columns += [BarColumn(), MofNCompleteColumn()]
        columns += [TextColumn(unit)] if unit else []
        columns += [TextColumn(f"{{task.fields[{name}]}}") for name in after]
        columns += [TimeElapsedColumn()]
        columns += [TextColumn("ETA"), TimeRemainingColumn()] if eta else []
        self.bar = Progress(*columns, console=console, transient=transient)
        self.task = self.bar.add_task(label, total=total, completed=completed, **{name: "" for name in (*before, *after)})

    def __enter__(self) -> StageBar:
        if self.enabled:
            self.bar.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.enabled:
            self.bar.__exit__(*exc)

    def update(self, **changes: Any) -> None:
        """``Progress.update`` of the one task (advance=, total=, or a field's new text)."""
        if self.enabled:
            self.bar.update(self.task, **changes)
