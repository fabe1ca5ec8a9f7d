"""Every stage's artifacts, from small seeded runs, are the ones recorded in golden.json: a
reorganisation of the code must not change what srollout computes (see golden_runs.py). Exact
columns (cuts, tokens, rows, dtypes) must be equal; training floats may differ by the CPU's own
kernel noise only (FLOAT_RTOL, measured).

One test per chain of runs that read each other's output, so pytest's workers run the chains side
by side (`make test-other-kernels` runs them on two)."""

from __future__ import annotations

import pytest
from golden_runs import RUNS, compare, load_golden, run_all

pytestmark = pytest.mark.slow

# Each chain's runs in order: a run that reads another's output ({D}/<name>) follows it.
CHAINS = {
    "collect-lm": ["collect-lm", "train-offpolicy"],
    "collect-lm-gated": ["collect-lm-gated"],
    "collect-expert": ["collect-expert", "analyze", "sweep"],
    "ab-rollout": ["ab-rollout"],
    "train-onpolicy": ["train-onpolicy"],
}


def test_the_chains_cover_every_recorded_run_once():
    runs = [r for chain in CHAINS.values() for r in chain]
    assert sorted(runs) == sorted(RUNS) == sorted({k.split("/")[0] for k in load_golden()})
    for chain in CHAINS.values():  # a run's inputs are earlier in its own chain
        for i, name in enumerate(chain):
            reads = {a.split("/")[1] for a in RUNS[name] if a.startswith("{D}/")}
            assert reads <= set(chain[:i]), (name, reads)


@pytest.mark.parametrize("chain", list(CHAINS))
def test_golden_runs_reproduce_their_recorded_tables(chain, tmp_path):
    runs = CHAINS[chain]
    golden = {k: v for k, v in load_golden().items() if k.split("/")[0] in runs}
    now = run_all(tmp_path, only=runs)
    assert {k.split("/")[0] for k in golden} == set(runs)
    differences = compare(golden, now)
    assert not differences, (
        "tables changed (python tests/golden/golden_runs.py --write after a deliberate change):\n"
        + "\n".join(f"  {d}" for d in differences)
    )
