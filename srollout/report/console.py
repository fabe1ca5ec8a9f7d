"""Old home of :mod:`srollout.console` (a base utility that low layers import), kept only for
``stages/analyze.py`` and ``stages/sweep.py`` until they import it from there; then delete it."""

from srollout.console import PIPE_WIDTH, make_console

__all__ = ["PIPE_WIDTH", "make_console"]
