"""The golden runs' float tolerances do not hide a real change: one-line changes to the advantage,
to the loss and to the policy's log-probs, made in the source of the running process, still fail
the comparison with golden.json by a float beyond its kind's tolerance (FLOAT_RTOL: the measured
kernel noise is 11x below it, the smallest of these changes 11x above it; LOGPROB_ATOL for the
log-prob columns).

Each mutation edits one line of srollout's source in the run's own process (``prelude``) and
reruns one golden training run; the unmutated runs are test_golden_runs.py."""

from __future__ import annotations

import re

import pytest
from golden_runs import compare, load_golden, run_all

pytestmark = pytest.mark.slow

# (name, run, module, the line as it is, the line mutated)
MUTATIONS = [
    (
        "advantage: sample std (G - 1) for the population std",
        "train-offpolicy",
        "srollout.core.grpo",
        "std = float(np.sqrt(np.mean(centred * centred)))",
        "std = float(np.sqrt(np.sum(centred * centred) / (r.size - 1)))",
    ),
    (
        "advantage: eps 1e-4 for 1e-6",
        "train-offpolicy",
        "srollout.core.grpo",
        "def group_advantages(rewards: ArrayLike, eps: float = 1e-6)",
        "def group_advantages(rewards: ArrayLike, eps: float = 1e-4)",
    ),
    (
        "log-probs: taken after the temperature, not before it (the raw distribution)",
        "collect-lm",
        "srollout.policy.transformers_backend",
        "raw = torch.log_softmax(logits, dim=-1)",
        "raw = torch.log_softmax(logits / self.temperature, dim=-1)",
    ),
    (
        "loss: each sequence's action tokens counted one too many (seq_mean denominator)",
        "train-onpolicy",
        "srollout.training.update",
        "n_action = [_n_targets(s.action_mask) for s in samples]",
        "n_action = [_n_targets(s.action_mask) + 1 for s in samples]",
    ),
]

PRELUDE = """
import importlib
module = importlib.import_module({module!r})
source = open(module.__file__).read()
assert source.count({old!r}) == 1, 'the line to mutate is not in ' + module.__file__
exec(compile(source.replace({old!r}, {new!r}), module.__file__, 'exec'), module.__dict__)
"""


@pytest.fixture(scope="module")
def buffer_root(tmp_path_factory):
    """collect-lm once: train-offpolicy reads it."""
    root = tmp_path_factory.mktemp("golden-mutations")
    run_all(root, only=["collect-lm"])
    return root


@pytest.mark.parametrize("name,run,module,old,new", MUTATIONS, ids=[m[0] for m in MUTATIONS])
def test_a_one_line_change_fails_the_golden_comparison(
    buffer_root, tmp_path, name, run, module, old, new
):
    out = tmp_path
    if run != "collect-lm":
        (out / "collect-lm").symlink_to(buffer_root / "collect-lm")
    now = run_all(out, only=[run], prelude=PRELUDE.format(module=module, old=old, new=new))
    golden = {k: v for k, v in load_golden().items() if k.startswith(run + "/")}
    differences = compare(golden, {k: v for k, v in now.items() if k in golden})
    float_changes = [d for d in differences if d.row is not None]
    assert float_changes, f"{name}: no float of {run} moved beyond the tolerance"
    moved = "logprob" if run.startswith("collect") else "loss|grad"
    assert any(re.search(moved, d.column) for d in float_changes), differences
