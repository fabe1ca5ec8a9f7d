"""On-policy training through vLLM: after every update the engine must sample from the adapter
just trained, never a stale one.

`train-onpolicy --backend vllm` on the real engine (tiny preset with T_max 15, so some episodes
are won and groups are mixed; sampled rollouts; a large learning rate so every update moves the
policy). After each iteration the test asks both the vLLM
engine (with the adapter it now serves) and the trained transformers module for the
log-probabilities of one fixed answer to one fixed prompt: they must agree every time (fp32, to
1e-3), while the module's own values move over the run. A run with the hot swap broken on
purpose (the engine keeps the iteration-0 adapter) must disagree: that is what this check exists
to catch.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
if importlib.util.find_spec("vllm") is None and os.environ.get("CI"):
    raise RuntimeError(
        "CI must test on-policy training through vLLM: vllm is not installed (make setup-vllm)"
    )
# slow: each test trains 4 iterations through vLLM in a subprocess (100-190 s on 2 loaded cores)
pytestmark = [
    pytest.mark.skipif(
        importlib.util.find_spec("vllm") is None, reason="vLLM is not installed: make setup-vllm"
    ),
    pytest.mark.slow,
]

ARGS = [
    "train-onpolicy",
    "--preset",
    "tiny",
    "--seeds",
    "7",
    "--arms",
    "baseline",
    "--iterations",
    "4",
    "--T-max",
    "15",
    "--prompts-per-iter",
    "4",
    "--temperature",
    "1.0",
    "--lr",
    "5e-2",
    "--n-eval",
    "1",
    "--eval-every",
    "4",
    "--no-interleave",
    "--backend",
    "vllm",
]

PROBED = r"""
import json, sys
import torch
from vllm import SamplingParams
from srollout.training import onpolicy
from srollout.policy.chat import encode_text, first_turn_text

STALE = sys.argv[1] == "stale"
PROBES = sys.argv[2]
real_sync, real_step = onpolicy.ArmRunner._sync_rollout_weights, onpolicy.ArmRunner.step
if STALE:  # the bug this test must catch: the engine keeps the first adapter
    def only_first(self, iteration):
        if iteration == 0:
            real_sync(self, iteration)
    onpolicy.ArmRunner._sync_rollout_weights = only_first
found = []
def step(self):
    row = real_step(self)
    tok = self.trainable.tokenizer
    text = first_turn_text(tok,
        "You are an agent in a household (ALFWorld). Reply with one action: Action: <action>",
        "Observation: You are in the middle of a room. Looking quickly around you, you see a "
        "cabinet 2, a cabinet 1, a countertop 1, a drawer 1, a fridge 1, and a sinkbasin 1.\n\n"
        "Your task is to: put a clean mug in cabinet.")
    ids = encode_text(tok, text)
    answer = encode_text(tok, "Action: go to cabinet 1")
    seq = ids + answer
    # log-probabilities of the answer's tokens: from the engine (its prompt logprobs) ...
    out = self.policy.llm.generate([{"prompt_token_ids": seq}],
                                   SamplingParams(max_tokens=1, prompt_logprobs=0),
                                   lora_request=self.policy._lora, use_tqdm=False)
    plp = out[0].prompt_logprobs
    engine = [plp[i][seq[i]].logprob for i in range(len(ids), len(seq))]
    # ... and from the trained module (LoRA on), teacher-forced
    with torch.no_grad():
        logits = self.trainable.model(input_ids=torch.tensor([seq])).logits[0].float()
        lp = torch.log_softmax(logits, dim=-1)
        module = [float(lp[i - 1, seq[i]]) for i in range(len(ids), len(seq))]
    found.append({"iteration": self.iteration, "engine": engine, "module": module})
    json.dump(found, open(PROBES, "w"))
    return row
onpolicy.ArmRunner.step = step
from srollout.cli.app import main
sys.argv = ["srollout", *sys.argv[3:]]
main()
"""


def run(mode: str, tmp_path: Path) -> tuple[list[dict], Path]:
    out, probes = tmp_path / mode, tmp_path / f"{mode}.json"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "200"}
    cmd = [sys.executable, "-c", PROBED, mode, str(probes), *ARGS, "--out", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900, env=env, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(probes.read_text()), out


def test_every_iteration_rolls_out_with_the_adapter_just_trained(tmp_path):
    import polars as pl

    probes, out = run("fresh", tmp_path)
    assert [p["iteration"] for p in probes] == [1, 2, 3, 4]
    for p in probes:
        assert max(abs(a - b) for a, b in zip(p["engine"], p["module"], strict=True)) < 1e-3, p
    # the updates moved the policy by far more than that: a stale engine would have shown
    first, last = probes[0]["module"], probes[-1]["module"]
    assert max(abs(a - b) for a, b in zip(first, last, strict=True)) > 1e-2, probes
    m = pl.read_parquet(out / "metrics.parquet").sort("iteration")
    assert m["rollout/adapter_iteration"].to_list() == [0, 1, 2, 3]
    assert json.loads((out / "manifest.json").read_text())["config"]["backend"] == "vllm"


def test_a_stale_adapter_is_caught(tmp_path):
    probes, _ = run("stale", tmp_path)
    pairs = [(a, b) for p in probes for a, b in zip(p["engine"], p["module"], strict=True)]
    assert max(abs(a - b) for a, b in pairs) > 1e-2, probes
