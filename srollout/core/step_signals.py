"""Signals of a group at step K read from what each step recorded (``steps.parquet``), beside the
seven agreement signals of :mod:`srollout.core.signals`; defined in docs/artifacts.md
(signals.parquet).

Each is one function of G lists in step order (``values[i][t]`` = the value at step t+1 of
trajectory i), over the steps t <= K that happened (no padding); every step weighs the same. A
new one is a function here, its entry in :data:`STEP_SIGNALS`, its name in
``srollout.signal_names.STEP_SIGNAL_NAMES`` and its test; every consumer takes it from there.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any


def _steps_up_to(values: Sequence[Sequence[Any]], K: int) -> list[Any]:
    return [v for traj in values for v in traj[:K]]


def action_logprob_mean(logprob_mean: Sequence[Sequence[float]], K: int) -> float:
    """Mean over the group's steps t <= K of each step's mean token log-probability."""
    seen = [float(v) for v in _steps_up_to(logprob_mean, K) if v is not None and v == v]
    return sum(seen) / len(seen) if seen else math.nan


def invalid_action_rate(valid: Sequence[Sequence[bool]], K: int) -> float:
    """Share of the group's steps t <= K whose action the environment rejected."""
    steps = _steps_up_to(valid, K)
    return sum(1 for v in steps if not v) / len(steps) if steps else math.nan


# name -> (the steps column it reads, the function); the order of signal_names.STEP_SIGNAL_NAMES
STEP_SIGNALS: dict[str, tuple[str, Callable[[Sequence[Sequence[Any]], int], float]]] = {
    "action_logprob_mean": ("logprob_mean", action_logprob_mean),
    "invalid_action_rate": ("valid", invalid_action_rate),
}

# the steps columns the step signals read
STEP_COLUMNS: tuple[str, ...] = tuple(dict.fromkeys(col for col, _ in STEP_SIGNALS.values()))


def step_signals(columns: Mapping[str, Sequence[Sequence[Any]]], K: int) -> dict[str, float]:
    """Every step signal of one group at step K from ``columns`` (steps column -> G per-step
    lists); a signal whose column is not given is NaN (a table written before it existed)."""
    out = {}
    for name, (col, fn) in STEP_SIGNALS.items():
        out[name] = fn(columns[col], K) if col in columns else math.nan
    return out
