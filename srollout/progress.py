"""The rich progress bar every long stage shows: one task, silent when disabled.

Each stage subclasses :class:`StageBar` for its own updates (``tick``, ``group``, ...) and
chooses the text columns around the bar; entering and leaving, and doing nothing at all when
disabled (rich is then not even imported), live here once.

Off a terminal (a log file, CI, ``nohup``) rich draws nothing until the bar closes, so a long
run would look dead; there the bar also prints one plain line at most every
:data:`LOG_EVERY_S` seconds and when the work is done: ``label: done/total unit fields, elapsed
m:ss, ETA m:ss``.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from typing import Any

LOG_EVERY_S = 30.0


class StageBar:
    """``label [before fields] ━━━ done/total [unit] [after fields] elapsed [ETA remaining]``.

    before / after: names of ``task.fields`` shown as text columns, each starting as ""; unit:
    a fixed word after the count (``groups``); eta: add the ETA columns. ``t0`` is when the bar
    was made (for rates); ``enabled`` False makes every method a no-op.
    """

    def __init__(
        self,
        console: Any,
        label: str,
        total: int,
        *,
        enabled: bool,
        completed: int = 0,
        before: Sequence[str] = (),
        after: Sequence[str] = ("info",),
        unit: str | None = None,
        eta: bool = True,
        transient: bool = False,
    ) -> None:
        self.enabled = enabled
        self.total = total
        self.t0 = time.perf_counter()
        if not enabled:
            return
        self.console = console
        self.label = label
        self.unit = unit
        self.fields = (*before, *after)
        self.plain_lines = not getattr(console, "is_terminal", True)
        self._last_line = -math.inf
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
        self.task = self.bar.add_task(
            label, total=total, completed=completed, **{name: "" for name in (*before, *after)}
        )

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
            if self.plain_lines:
                self._plain_line()

    def extend(self, n: int) -> None:
        """``n`` more steps than planned (DAPO's extra rounds)."""
        if n:
            self.total += n
            self.update(total=self.total)

    def resumed(self, n: int) -> None:
        """``n`` steps an earlier run finished (``--resume``): taken off the total, so the count
        and the ETA are this run's own work."""
        if n > 0:
            self.extend(-n)

    def _remaining(self, completed: float, total: float | None, now: float) -> float | None:
        """Seconds left: the time so far per step done, times the steps to go (None before the
        first step)."""
        if not completed or not total:
            return None
        return (now - self.t0) * (total - completed) / completed

    def _plain_line(self) -> None:
        """Off a terminal: one line of text, at most every LOG_EVERY_S seconds and at the end."""
        task = self.bar.tasks[0]
        now = time.perf_counter()
        if task.finished:
            if self._last_line == math.inf:  # the closing line is out already
                return
        elif now - self._last_line < LOG_EVERY_S:
            return
        self._last_line = now
        parts = [
            f"{int(task.completed)}/{int(task.total or 0)}" + (f" {self.unit}" if self.unit else "")
        ]
        shown = [name for name in self.fields if name != "eta" and task.fields.get(name)]
        parts += [str(task.fields[name]) for name in shown]
        clock = f"elapsed {_clock(now - self.t0)}"
        remaining = None if task.finished else self._remaining(task.completed, task.total, now)
        if remaining is not None:
            clock += f", ETA {_clock(remaining)}"
        self.console.print(
            f"{self.label}: {' '.join(parts)}, {clock}", highlight=False, markup=False
        )
        if task.finished:
            self._last_line = math.inf


class RolloutBar(StageBar):
    """The bar of a stage that rolls groups out through the engine (``collect``, ``ab-rollout``):
    groups done, then ``after=("rate",)``: generated tokens per second and the rows in flight,
    fed by the engine's per-tick callback (:meth:`tick`), and ETA."""

    def __init__(self, console: Any, label: str, total: int, **kw: Any) -> None:
        # kw: enabled, completed, before; not rich's ETA, which counts the start-up as the pace
        super().__init__(
            console, label, total, unit="groups", after=("rate", "eta"), eta=False, **kw
        )
        self.tokens = 0
        self.first_tick: float | None = None  # the policy's first call: start-up is over
        self.in_flight = 0

    def _remaining(self, completed: float, total: float | None, now: float) -> float | None:
        """Seconds left, from the pace since the first tick (model loading and the Ray cluster's
        start are not the pace) over the groups done, each group in flight counted half done:
        groups finish in waves, and the first finishes only when many have run for as long."""
        if self.first_tick is None or not total or not completed:
            return None
        done = completed + 0.5 * self.in_flight
        if done <= 0:
            return None
        return max(0.0, (now - self.first_tick) * (total - done) / done)

    def _eta_text(self, more: int = 0) -> str:
        """The ETA column's text once ``more`` groups are added to those done."""
        task = self.bar.tasks[0]
        done, total = task.completed + more, task.total
        left = self._remaining(done, total, time.perf_counter())
        return (
            "" if left is None or (total is not None and done >= total) else f"ETA {_clock(left)}"
        )

    def tick(self, stats: Any) -> None:
        """One engine tick (a ``srollout.rollout.engine.TickStats``: ``gen_tokens``, ``rows``,
        ``groups_in_flight``)."""
        self.tokens += stats.gen_tokens
        if self.first_tick is None:
            self.first_tick = time.perf_counter()
        self.in_flight = int(getattr(stats, "groups_in_flight", 0) or 0)
        if self.enabled:
            rate = self.tokens / max(time.perf_counter() - self.t0, 1e-9)
            # tokens over the time since the bar started (a Ray cluster's start included), like
            # the summary's "throughput"; not its "generation speed" (time inside generate only)
            self.update(
                rate=f"{rate:,.0f} tok/s since the start, {stats.rows} in flight",
                eta=self._eta_text(),
            )

    def advance(self, n: int = 1) -> None:
        """``n`` more groups done (none: nothing drawn)."""
        if n and self.enabled:
            self.update(advance=n, eta=self._eta_text(n))


def _clock(seconds: float) -> str:
    """``m:ss`` (``h:mm:ss`` from an hour on)."""
    s = int(round(seconds))
    return (
        f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}" if s >= 3600 else f"{s // 60}:{s % 60:02d}"
    )


class PhaseBars:
    """Phases of one long job shown one after another, each a :class:`StageBar` (rich shows one
    live bar at a time): ``phase(name)`` gives a ``(done, total)`` callback whose bar opens at its
    first call (closing the phase before it) and closes when ``done == total``.

    Used by work made of steps whose sizes are known only as they start (the default-policy
    build: games, demonstrations, SFT; game generation on its own). ``close()`` ends the open one.
    """

    def __init__(self, console: Any, *, enabled: bool, unit: dict[str, str] | None = None) -> None:
        self.console = console
        self.enabled = enabled
        self.units = unit or {}
        self.open: StageBar | None = None
        self.name: str | None = None

    def phase(self, name: str, *, info: bool = False) -> Any:
        """A ``(done, total)`` callback; with ``info`` a ``(done, total, text)`` one whose text
        (a loss, a rate) shows after the count."""

        def report(done: int, total: int, text: str = "") -> None:
            if not self.enabled:
                return
            if self.name != name:
                self.close()
                self.open = StageBar(
                    self.console, name, total, enabled=True, unit=self.units.get(name)
                )
                self.open.__enter__()
                self.name = name
            assert self.open is not None
            self.open.update(completed=done, total=total, info=text)
            if done >= total:
                self.close()

        return report

    def close(self) -> None:
        if self.open is not None:
            self.open.__exit__(None, None, None)
        self.open, self.name = None, None

    def __enter__(self) -> PhaseBars:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
