"""The examples CI runs on tiny settings: they must keep working as the library changes."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_gate_in_your_trainer_cuts_only_zero_variance_groups_and_saves_steps():
    out = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "gate_in_your_trainer.py"), "--groups", "30"],
        capture_output=True, text=True, timeout=120, check=True,
    ).stdout
    cut, wrong = map(int, re.search(r"cut (\d+) \(of which (\d+) had reward variance\)", out).groups())
    full, gated = map(int, re.search(r"steps: (\d+) without the gate, (\d+) with it", out).groups())
    assert cut > 0 and wrong == 0
    assert gated < full
