"""Another CPU's noise, checked on this one: the golden collects rerun with the policy's logits
perturbed by seeded noise of the size measured across CPUs, and the comparison with golden.json
still passes (log-probs within LOGPROB_ATOL, every token, action, cut and reward exactly), while
the mutations of test_golden_mutations.py still fail it.

The noise is +-2e-5 a logit, above the largest difference measured between kernel families on the
shipped policy (1.2e-5; benchmarks/golden_noise.py --logits, docs/bench/golden_noise.md), on
every forward of the rollout, whatever CPU this test runs on."""

from __future__ import annotations

import pytest
from golden_runs import (
    LOGPROB_ATOL,
    compare,
    flat_cells,
    float_kind,
    load_golden,
    logit_noise,
    run_all,
)

pytestmark = pytest.mark.slow

CROSS_CPU_LOGIT_NOISE = 2e-5


def test_golden_collects_pass_under_another_cpus_logit_noise(tmp_path):
    noise = logit_noise(CROSS_CPU_LOGIT_NOISE)
    now = run_all(tmp_path, only=["collect-lm", "collect-lm-gated"], prelude=noise)
    golden = {k: v for k, v in load_golden().items() if k in now}
    assert set(now) == set(golden) and len(now) == 8
    differences = compare(golden, now)
    # the sampled tokens, actions, cuts and rewards are the recorded ones: under this noise no
    # sampling draw fell near enough a boundary between two tokens to pick another one
    assert not differences, "\n".join(f"  {d}" for d in differences)
    # the noise reached the log-probs (so this test can fail), by more than the kernels' own
    # difference and well within the tolerance
    moved = [
        abs(a - b)
        for table, rec in now.items()
        for column, values in golden[table]["floats"].items()
        if float_kind(column) == "logprob"
        for a, b in zip(flat_cells(values), flat_cells(rec["floats"][column]), strict=True)
        if a is not None and b is not None and a == a and b == b
    ]
    assert len(moved) > 200
    assert 5e-6 < max(moved) < LOGPROB_ATOL / 4
