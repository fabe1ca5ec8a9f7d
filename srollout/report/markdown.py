"""``report.md``: every stage writes one, so a run can be read without code."""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import NamedTuple

from srollout.schemas import write_text


class Section(NamedTuple):
    """One ``##`` section of a report: a title and its markdown body (tables, text, figure
    links)."""

    title: str
    body: str


def figure(path: str | Path, run_dir: str | Path, caption: str) -> str:
    """Markdown that shows the PNG ``path`` (linked relative to ``run_dir``) with a caption."""
    rel = os.path.relpath(Path(path), Path(run_dir))
    return f"![{caption}]({rel})\n\n*{caption}*\n"


def doc_link(page: str, heading: str) -> str:
    """A markdown link to the section ``heading`` of docs/``page``: a report gives a run's numbers
    and links to the doc that explains them (the anchor is GitHub's: lower case, punctuation
    dropped, spaces to hyphens)."""
    anchor = re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")
    return f"[docs/{page}, “{heading}”](docs/{page}#{anchor})"


def write_report(
    run_dir: str | Path, title: str, sections: Sequence[Section], preamble: str = ""
) -> Path:
    """Write ``run_dir/report.md`` atomically and return its path: ``# title``, a UTC stamp, an
    optional preamble, then each section."""
    stamp = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    parts = [f"# {title}\n", f"_Written {stamp} by srollout._\n"]
    if preamble:
        parts.append(preamble.rstrip() + "\n")
    for section in sections:
        parts.append(f"## {section.title}\n\n{section.body.rstrip()}\n")
    return write_text("\n".join(parts), Path(run_dir) / "report.md")
