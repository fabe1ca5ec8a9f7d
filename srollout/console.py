"""The console every stage prints to.

Rich sizes a console to the terminal, and to 80 columns when output goes to a file or a pipe
(a log, CI, ``| tee``), where the wide tables of ``analyze`` and ``sweep`` then squeeze into
one-letter columns. Off a terminal we use :data:`PIPE_WIDTH` columns instead, unless
``COLUMNS`` says otherwise (rich reads it).
"""

from __future__ import annotations

import os
from typing import Any

PIPE_WIDTH = 160


def make_console(**kwargs: Any) -> Any:
    """A rich Console: the terminal's width on a terminal, else ``COLUMNS`` or
    :data:`PIPE_WIDTH`."""
    from rich.console import Console

    console = Console(**kwargs)
    if "width" not in kwargs and not console.is_terminal and not os.environ.get("COLUMNS"):
        console.width = PIPE_WIDTH
    return console
