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
    "loop": "#393b79",
}

# arms of skip parts from other packages: a colour picked by a hash of the name, so such an arm
# too has one colour on every page
_MORE_COLORS = ("#aec7e8", "#ffbb78", "#98df8a", "#ff9896", "#c5b0d5", "#c49c94", "#f7b6d2")


def arm_color(arm: str) -> str:
    """The colour of ``arm`` on every figure."""
    if arm in ARM_COLORS:
        return ARM_COLORS[arm]
    import zlib

    return _MORE_COLORS[zlib.crc32(str(arm).encode()) % len(_MORE_COLORS)]


def arm_order(arms: set[str] | list[str]) -> list[str]:
    """``arms`` in the pages' order: srollout's own arms as :data:`ARM_COLORS` lists them, then
    the others by name."""
    present = set(arms)
    return [a for a in ARM_COLORS if a in present] + sorted(present - set(ARM_COLORS))
