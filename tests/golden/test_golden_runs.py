"""Every stage's artifacts, from small seeded runs, are the ones recorded in golden.json: a
reorganisation of the code must not change what srollout computes (see golden_runs.py). Exact
columns (cuts, tokens, rows, dtypes) must be equal; training floats may differ by the CPU's own
kernel noise only (FLOAT_RTOL, measured)."""

from __future__ import annotations

import pytest
from golden_runs import RUNS, compare, load_golden, run_all

pytestmark = pytest.mark.slow


def test_golden_runs_reproduce_their_recorded_tables(tmp_path):
    golden = load_golden()
    now = run_all(tmp_path)
    assert {k.split("/")[0] for k in golden} == set(RUNS)
    differences = compare(golden, now)
    assert not differences, (
        "tables changed (python tests/golden/golden_runs.py --write after a deliberate change):\n"
        + "\n".join(f"  {d}" for d in differences)
    )
