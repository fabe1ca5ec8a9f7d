"""Where srollout keeps what it builds once and reuses: generated games, the default policy."""

from __future__ import annotations

import os
from pathlib import Path


def srollout_home() -> Path:
    """``$SROLLOUT_HOME`` or ``~/.cache/srollout``; created on first use."""
    root = Path(os.environ.get("SROLLOUT_HOME") or Path.home() / ".cache" / "srollout")
    root.mkdir(parents=True, exist_ok=True)
    return root
