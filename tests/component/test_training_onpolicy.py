"""The on-policy loop end to end on a tiny real Qwen2 + LoRA in a scripted corridor (no ALFWorld).

The corridor is won by two "forward" moves within T_max; the parser turns a response of even
length into "forward", so whether a trajectory wins depends on what the model samples: groups
are a real mix, advantages are non-zero and updates change the policy.
"""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest
import torch

from srollout.config import TrainOnpolicyConfig
from srollout.envs.base import StepResult, Task
from srollout.rollout.engine import ParsedTurn

torch.set_num_threads(1)

TIMING = ["rollout_s", "update_s", "sync_s", "iter_s", "cum_s", "eval_s", "warmup_s"]


class Corridor:
    def __init__(self) -> None:
        self.pos, self.length = 0, 2

    def reset(self, task: Task, seed: int):
        self.task, self.pos = task, 0
        return "cell 0", StepResult("", 0.0, False, True, ("forward", "wait"))

    def step(self, action: str) -> StepResult:
        if action == "forward":
            self.pos += 1
        won = self.pos >= self.length
        return StepResult(f"cell {self.pos}", 1.0 if won else 0.0, won, action == "forward", ("forward", "wait"))

    def close(self) -> None:
        pass


class Prompter:
    def system(self, task):
        return "You walk a corridor."

    def user(self, observation, step, task):
        return observation

    def parse(self, text):
        action = "forward" if len(text.strip()) % 2 == 0 else "wait"
        return ParsedTurn("", action, action)


TRAIN = [Task(f"train/{i}", "pick_and_place_simple", "walk", "") for i in range(4)]
HELDOUT = [Task(f"heldout/{i}", "pick_and_place_simple", "walk", "") for i in range(3)]


@pytest.fixture(scope="module")
def tiny_model(tiny_policy) -> Path:
    return tiny_policy


def _config(model: Path, out: Path, **kw) -> TrainOnpolicyConfig:
    values = dict(seeds=(7,), model=model, iterations=3, prompts_per_iter=2, G=4, T_max=4, K=2, eval_every=2,
                  n_eval=3, train_tasks=4, lr=2e-2, max_new_tokens=8, d_L=0.0, out=out)
    values.update(kw)
    return TrainOnpolicyConfig.from_preset("tiny", **values)


def _run(config, **kw):
    from srollout.stages.train_onpolicy import run_train_onpolicy

    return run_train_onpolicy(config, progress=False, env_factory=Corridor, prompter=Prompter(),
                              train_tasks=TRAIN, eval_tasks=HELDOUT, **kw)


def _adapter(run_dir: Path, arm: str) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(run_dir / "adapters" / f"seed7-{arm}" / "adapter_model.safetensors")


@pytest.fixture(scope="module")
def never_gated(tiny_model, tmp_path_factory):
    """Both arms, gate R1 with d_L = 0 (d_K >= 0, so it never fires)."""
    return _run(_config(tiny_model, tmp_path_factory.mktemp("never") / "run"))


def test_a_gate_that_never_fires_gives_bit_identical_adapters(never_gated):
    res = never_gated
    m = res.metrics
    assert m.height == 6 and m["n_cut"].sum() == 0
    assert (m["grad_l2"] > 0).any(), "no learning signal: the test would pass trivially"
    base, gated = _adapter(res.run_dir, "baseline"), _adapter(res.run_dir, "gated")
    assert base.keys() == gated.keys()
    assert all(torch.equal(base[k], gated[k]) for k in base)
    assert any(float(v.abs().max()) > 0 for k, v in base.items() if "lora_B" in k)  # the adapter moved
    cols = [c for c in m.columns if c not in TIMING and c != "arm"]
    b = m.filter(pl.col("arm") == "baseline").select(cols)
    g = m.filter(pl.col("arm") == "gated").select(cols)
    assert b.equals(g)
    ev = res.evals
    assert sorted(set(ev["iteration"])) == [0, 2, 3] and ev.height == 2 * 3 * 3
    assert set(ev["task_id"]) == {t.task_id for t in HELDOUT}
    for name in ("metrics.parquet", "eval.parquet", "onpolicy.png", "mechanism.png", "report.md", "summary.json"):
        assert (res.run_dir / name).exists(), name
    assert res.complete and res.tests.height == 3


def test_a_gate_that_fires_drops_groups_and_changes_the_update(tiny_model, tmp_path, never_gated):
    res = _run(_config(tiny_model, tmp_path / "run", d_L=1.0))  # R1: cut iff d_K < 1
    gated = res.metrics.filter(pl.col("arm") == "gated")
    assert gated["n_cut"].sum() > 0
    assert (gated["n_kept"] + gated["n_cut"] == gated["n_groups"]).all()
    assert (gated["n_traj"] == 4 * gated["n_kept"]).all()  # cut groups are dropped entirely
    base_never = _adapter(never_gated.run_dir, "baseline")
    assert all(torch.equal(base_never[k], v) for k, v in _adapter(res.run_dir, "baseline").items())  # same seed, same baseline
    other = _adapter(res.run_dir, "gated")
    assert any(not torch.equal(base_never[k], other[k]) for k in other)


def test_resume_after_a_stop_reproduces_the_uninterrupted_run(tiny_model, tmp_path, never_gated):
    out = tmp_path / "run"
    first = _run(_config(tiny_model, out), stop_after=1)
    assert not first.complete and first.metrics.height == 2  # both arms (interleaved) at iteration 1
    assert '"status": "partial"' in (out / "manifest.json").read_text()
    again = _run(_config(tiny_model, out, resume=True))
    assert again.complete
    cols = [c for c in never_gated.metrics.columns if c not in TIMING]
    assert again.metrics.select(cols).equals(never_gated.metrics.select(cols))
    assert again.evals.equals(never_gated.evals)
    for arm in ("baseline", "gated"):
        a, b = _adapter(out, arm), _adapter(never_gated.run_dir, arm)
        assert all(torch.equal(a[k], b[k]) for k in a)


def test_resume_refuses_a_different_config(tiny_model, never_gated):
    from srollout.errors import SrolloutError

    with pytest.raises(SrolloutError, match="lr"):
        _run(_config(tiny_model, never_gated.run_dir, resume=True, lr=1e-3))
