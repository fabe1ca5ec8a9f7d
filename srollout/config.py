"""One frozen dataclass per stage. Defaults are the paper's.

Each field is documented once, in the ``metadata["help"]`` of the field; the Typer options of
``srollout.cli`` take their help text from there (``help_for``), so CLI and library agree.
Paper defaults: K=10, d_L=0.12, G=8, T_max=30, temperature 0.7, precision floor 0.80.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# The paper's operating point and rollout settings (Table "Hyperparameters").
PAPER_K = 10
PAPER_D_L = 0.12
PAPER_G = 8
PAPER_T_MAX = 30
PAPER_TEMPERATURE = 0.7
PAPER_PRECISION_FLOOR = 0.80
PAPER_K_VALUES = (5, 10, 15, 20)


def doc(default: Any, help: str, **kw: Any) -> Any:
    """A dataclass field with its help text attached."""
    if isinstance(default, (list, dict, set)):
        return field(default_factory=lambda: type(default)(default), metadata={"help": help}, **kw)
    return field(default=default, metadata={"help": help}, **kw)


def help_for(config_cls: type, name: str) -> str:
    """The help text of ``config_cls.name`` (used by the CLI option of the same name)."""
    for f in dataclasses.fields(config_cls):
        if f.name == name:
            return f.metadata.get("help", "")
    raise KeyError(f"{config_cls.__name__} has no field {name}")


# --- stage configs are appended below, one frozen dataclass per stage -------------------------
