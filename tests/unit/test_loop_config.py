"""The on-policy loop's settings are typed where they are used: ``LoopConfig`` names every field
the loop reads, and ``TrainOnpolicyConfig`` has each with the same type."""

from __future__ import annotations

import re
import typing
from pathlib import Path

from srollout.config import TrainOnpolicyConfig
from srollout.training.onpolicy import LoopConfig

SOURCE = Path(__file__).resolve().parents[2] / "srollout" / "training" / "onpolicy.py"


def test_the_loop_reads_only_what_loop_config_names_and_the_config_has_it():
    needed = typing.get_type_hints(LoopConfig)
    have = typing.get_type_hints(TrainOnpolicyConfig)
    assert {n: have.get(n) for n in needed} == needed
    read = set(re.findall(r"(?:\bself\.|(?<![.\w]))config\.([A-Za-z_]+)", SOURCE.read_text()))
    assert read <= set(needed), sorted(read - set(needed))
    assert (
        "getattr(config" not in SOURCE.read_text()
        and "getattr(self.config" not in SOURCE.read_text()
    )
