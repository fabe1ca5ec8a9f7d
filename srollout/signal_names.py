"""The names of the group signals, in the order of the signals table's columns: base layer, no
dependencies, so that ``srollout.core`` (numpy only) and ``srollout.schemas`` (the Parquet
contract) name them from one place."""

from __future__ import annotations

# The seven agreement signals of a group at step K (srollout.core.signals computes them, one
# function each in its AGREEMENT_SIGNALS), the paper's names: name -> (what a value is, for the
# signals table's rule; whether it may be NaN). The order of the signals table's columns.
AGREEMENT_UNITS: dict[str, tuple[str, bool]] = {
    "prefix_edit_distance_mean": ("d_K", False),
    "action_bigram_jaccard_mean": ("a Jaccard distance", False),
    "unique_prefix_ratio": ("a share of G", False),
    "unique_action_ratio": ("a share of G", False),
    "action_entropy": ("an entropy normalised by log G", False),
    "obs_unique_ratio": ("a share of G", True),  # NaN when no observations were given
    "termination_fraction": ("τ_K", False),
}
SIGNAL_NAMES: tuple[str, ...] = tuple(AGREEMENT_UNITS)

# Signals at K read from what each step recorded (srollout.core.step_signals computes them),
# beside the seven agreement signals: optional columns of signals.parquet (a table written before
# 2026-11-27 has none and still reads).
STEP_SIGNAL_NAMES: tuple[str, ...] = ("action_logprob_mean", "invalid_action_rate")
