"""srollout.report.progress.StageBar: the columns a stage asks for, and nothing when disabled."""

from __future__ import annotations

import io

from rich.console import Console

from srollout.report.progress import StageBar


def test_disabled_bar_is_silent_and_has_no_rich_progress():
    bar = StageBar(None, "collect", 10, enabled=False)
    with bar:
        bar.update(advance=3, info="x")
    assert not hasattr(bar, "bar") and bar.total == 10


def test_enabled_bar_renders_label_unit_fields_and_counts():
    out = io.StringIO()
    console = Console(file=out, force_terminal=False, width=200)
    bar = StageBar(console, "ab-rollout", 8, enabled=True, completed=2, before=("run",), unit="groups", after=("rate",))
    with bar:
        bar.update(advance=3, run="gated r0 b1", rate="650 tok/s")
    text = out.getvalue()
    assert "ab-rollout" in text and "gated r0 b1" in text and "5/8" in text and "groups" in text and "650 tok/s" in text
    assert "ETA" in text
    seeds = StageBar(Console(file=io.StringIO(), width=200), "seeds", 4, enabled=True, eta=False)
    assert not any(type(c).__name__ == "TimeRemainingColumn" for c in seeds.bar.columns)
