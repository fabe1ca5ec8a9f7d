"""A wheel of the package carries the default policy and the SmolLM2 adapter, so `pip install
srollout` needs no build."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from srollout.default_policy import SHIPPED_DIR
from srollout.policy.named import SMOLLM2_ADAPTER_DIR

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_the_wheel_carries_every_file_of_the_default_policy(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", str(ROOT), "--no-deps", "-q", "-w", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    [wheel] = tmp_path.glob("srollout-*.whl")
    for folder in (SHIPPED_DIR, SMOLLM2_ADAPTER_DIR):
        prefix = f"srollout/default_policy/{folder.name}/"
        with zipfile.ZipFile(wheel) as z:
            packed = {
                Path(n).name: z.getinfo(n).file_size for n in z.namelist() if n.startswith(prefix)
            }
        assert packed == {f.name: f.stat().st_size for f in folder.iterdir()}
