"""One colour per arm, for every figure that draws arms (the A/B and on-policy reports): an arm
has the same colour on every page. Order: baseline and gated first, then the rest as
:data:`srollout.core.arms.ARM_NAMES` lists them."""

from __future__ import annotations

ARM_COLORS: dict[str, str] = {
    "baseline": "#7f7f7f",
    "gated": "#1f77b4",
    "dapo": "#ff7f0e",
    "greso": "#2ca02c",
    "gated+dapo": "#d62728",
    "gated+greso": "#9467bd",
    "stall": "#8c564b",
    "gated+stall": "#e377c2",
    "stall+dapo": "#bcbd22",
    "stall+greso": "#17becf",
}
