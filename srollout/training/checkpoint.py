"""Per-iteration checkpoints of an on-policy arm: adapter, optimizer, RNG states, metrics so far.

One ``state.pt`` per (seed, arm), replaced atomically after every iteration, so a run killed at
any moment resumes from the last finished iteration and ends with the same metrics as an
uninterrupted run (timing aside): every random draw derives from (seed, iteration, group, traj)."""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from srollout.atomic import atomic_file
from srollout.errors import SrolloutError

STATE_FILE = "state.pt"


@dataclass
class ArmState:
    """iteration: the last finished iteration (0 = only the pre-training eval done);
    adapter / optimizer: state dicts; rng: python/numpy/torch RNG states; metrics / evals: the
    rows logged so far; complete: the arm ran all its iterations."""

    iteration: int
    adapter: dict[str, Any]
    optimizer: dict[str, Any]
    rng: dict[str, Any]
    metrics: list[dict[str, Any]] = field(default_factory=list)
    evals: list[dict[str, Any]] = field(default_factory=list)
    complete: bool = False


def rng_states() -> dict[str, Any]:
    """The global RNG states (python, numpy, torch) a resumed run restores."""
    import numpy as np
    import torch

    return {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
    }


def restore_rng(states: dict[str, Any]) -> None:
    import numpy as np
    import torch

    random.setstate(states["python"])
    np.random.set_state(states["numpy"])
    torch.set_rng_state(states["torch"])


def save_state(directory: Path, state: ArmState) -> Path:
    """Write ``directory/state.pt`` atomically (temp file + rename)."""
    import torch

    return atomic_file(directory / STATE_FILE, lambda tmp: torch.save(state.__dict__, tmp))


def load_state(directory: Path) -> ArmState | None:
    """The arm's last checkpoint, or None when it has none yet."""
    import torch

    path = directory / STATE_FILE
    if not path.exists():
        return None
    try:
        data = torch.load(path, weights_only=False)
    except Exception as err:  # a foreign or damaged file
        raise SrolloutError(
            f"{path}: unreadable checkpoint ({type(err).__name__}); rerun with --overwrite"
        ) from err
    return ArmState(**data)
