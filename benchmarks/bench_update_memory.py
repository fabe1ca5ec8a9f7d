"""Peak memory and time of one LoRA GRPO micro-batch (forward + backward) on a real model, three
ways: ``ckpt`` as train-onpolicy runs it now (the vocabulary head on the action positions alone,
``srollout.training.loss.token_logprobs`` for the models of ``HEAD_ON_HIDDEN``, and the decoder
layers recomputed in the backward pass, ``srollout.training.update.recomputing``, for a model over
``CHECKPOINT_ABOVE`` parameters); ``head`` without the recompute; ``full``: neither, the full
[N, L, V] logits and every activation kept, as every model ran before 2026-12-05.

Each path runs in its own process, so each peak (``ru_maxrss``) is its own. The batch is shaped
like a train-onpolicy rollout on ALFWorld: ``--batch`` trajectories of ``--length`` tokens, a
system prompt of 350 tokens, then ``--steps`` turns of an observation and a 12-token action (the
action share of the tokens is what decides the saving). Token values are random: memory and time
do not depend on them. The LoRA settings are train-onpolicy's (r 16, alpha 32, every linear
layer).

Usage::

    python benchmarks/bench_update_memory.py --model smollm2-alfworld --batch 8 --length 2000
"""

from __future__ import annotations

import argparse
import json
import platform
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def _batch(vocab: int, batch: int, length: int, steps: int) -> tuple[list, list]:
    import numpy as np

    rng = np.random.default_rng(0)
    ids, masks = [], []
    turn = (length - 350) // steps
    for _ in range(batch):
        ids.append(rng.integers(100, vocab, size=length).tolist())
        mask = [False] * length
        for s in range(steps):
            end = 350 + (s + 1) * turn
            mask[end - 12 : end] = [True] * 12
        masks.append(mask)
    return ids, masks


def one(path: str, model: str, batch: int, length: int, steps: int, threads: int) -> dict:
    """One micro-batch step by ``path`` ("ckpt", "head" or "full") in this process."""
    import torch

    from srollout.policy import resolve_model
    from srollout.training import loss
    from srollout.training import model as model_mod
    from srollout.training.lora import LoraSettings
    from srollout.training.update import recomputing

    torch.set_num_threads(threads)
    if path != "ckpt":
        model_mod.CHECKPOINT_ABOVE = 1 << 62
    if path == "full":
        loss.HEAD_ON_HIDDEN = set()
    targets = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
    trainable = model_mod.load_trainable(
        resolve_model(model), LoraSettings(16, 32, targets), seed=0
    )
    ids, masks = _batch(trainable.model.config.vocab_size, batch, length, steps)
    t0 = time.perf_counter()
    with recomputing(trainable.model):
        advantages = [1.0, -1.0] * (batch // 2) + [0.5] * (batch % 2)
        out = loss.grpo_loss(trainable.model, ids, masks, advantages)
        out.loss.backward()
    seconds = time.perf_counter() - t0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    return {
        "path": path,
        "peak_gb": peak,
        "seconds": seconds,
        "loss": float(out.loss),
        "tokens": batch * length,
        "targets": out.n_tokens,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-alfworld")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--length", type=int, default=2000)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--paths", default="ckpt,head,full", help="which ways, in this order")
    ap.add_argument("--one", choices=["ckpt", "head", "full"], help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.one:
        print(json.dumps(one(a.one, a.model, a.batch, a.length, a.steps, a.threads)))
        return
    print(
        f"{a.model}: {a.batch} x {a.length} tokens, {a.steps} actions of 12 tokens each, "
        f"{a.threads} thread(s), {platform.processor() or platform.machine()}"
    )
    print("| path | peak RSS (GB) | step (s) | loss |")
    print("|---|---|---|---|", flush=True)
    for path in a.paths.split(","):
        cmd = [sys.executable, __file__, "--one", path] + sys.argv[1:]
        done = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if done.returncode != 0:  # -9: the kernel's OOM killer (dmesg says at what RSS)
            print(f"| {path} | exit {done.returncode} | | |", flush=True)
            continue
        r = json.loads(done.stdout.strip().splitlines()[-1])
        print(f"| {path} | {r['peak_gb']:.2f} | {r['seconds']:.1f} | {r['loss']:.4f} |", flush=True)


if __name__ == "__main__":
    main()
