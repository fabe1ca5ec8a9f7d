"""The names of the group signals, in the order of the signals table's columns: base layer, no
dependencies, so that ``srollout.core`` (numpy only) and ``srollout.schemas`` (the Parquet
contract) name them from one place."""

from __future__ import annotations

# The seven agreement signals of a group at step K (srollout.core.signals), the paper's names.
SIGNAL_NAMES: tuple[str, ...] = (
    "prefix_edit_distance_mean",
    "action_bigram_jaccard_mean",
    "unique_prefix_ratio",
    "unique_action_ratio",
    "action_entropy",
    "obs_unique_ratio",
    "termination_fraction",
)

# Signals at K read from what each step recorded (srollout.core.step_signals computes them),
# beside the seven agreement signals: optional columns of signals.parquet (a table written before
# 2026-11-27 has none and still reads).
STEP_SIGNAL_NAMES: tuple[str, ...] = ("action_logprob_mean", "invalid_action_rate")
