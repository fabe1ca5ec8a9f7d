"""Every stage's artifacts, from small seeded runs, are the ones recorded in digests.json: a
reorganisation of the code must not change what srollout computes (see golden_runs.py)."""

from __future__ import annotations

import json

import pytest
from golden_runs import DIGESTS, RUNS, run_all

pytestmark = pytest.mark.slow


def test_golden_runs_reproduce_their_recorded_tables(tmp_path):
    golden = json.loads(DIGESTS.read_text())
    now = run_all(tmp_path)
    assert {k.split("/")[0] for k in golden} == set(RUNS)
    changed = {
        k: (golden.get(k), now.get(k))
        for k in sorted(set(golden) | set(now))
        if golden.get(k) != now.get(k)
    }
    assert not changed, (
        "tables changed (python tests/golden/golden_runs.py --write after a deliberate change):\n"
        + "\n".join(f"  {k}: recorded {a} now {b}" for k, (a, b) in changed.items())
    )
