"""`srollout sweep`: Sweep gate thresholds, choose an operating point under a precision floor, write gate.json."""

from srollout.cli._unavailable import unavailable_command

register = unavailable_command(
    "sweep",
    "Sweep gate thresholds, choose an operating point under a precision floor, write gate.json.",
    "being built.",
)
