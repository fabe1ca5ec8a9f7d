"""Batched decode: srollout's transformers backend against transformers' own ``generate`` on the
same batch (issue 60 (b): within 1.25x). Appends to docs/bench/decode.md.

Both get the same B rows: one ALFWorld first turn (system prompt + a ~60-token observation) in
the model's chat template, sampled at temperature 0.7 with a different seed per row, and both
generate exactly N tokens per row (the backend's end-of-turn set is emptied, ``generate`` gets
``min_new_tokens=N``), so neither stops early. The decode cost per step is
``(t(N) - t(1)) / (N - 1)`` for each, the prefill (t(1)) taken out; each is the best of 3.

    python benchmarks/bench_decode.py --model smollm2-alfworld --batch 8 --tokens 24
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

OBSERVATION = (
    "Observation: You are in the middle of a room. Looking quickly around you, you see a "
    "cabinet 3, a cabinet 2, a cabinet 1, a countertop 1, a drawer 1, a fridge 1, a microwave 1, "
    "and a sinkbasin 1.\n\nYour task is to: put a cool apple in countertop."
)
SYSTEM = "You are an agent in a household (ALFWorld). Reply with one action: Action: <action>"


def backend_times(path: Path, batch: int, tokens: int, dtype: str) -> tuple[float, float]:
    """(t(1), t(N)) seconds of one ``act`` on ``batch`` fresh rows, best of 3 each."""
    from srollout.policy.base import ActRequest, TrajKey
    from srollout.policy.transformers_backend import TransformersPolicy

    def once(n: int, rep: int) -> float:
        pol = TransformersPolicy(path, max_new_tokens=n, dtype=dtype)
        pol._eot_set = frozenset()  # exactly n tokens per row, as generate(min_new_tokens=n)
        reqs = [
            ActRequest(TrajKey(f"g{rep}", i), 1, 1000 * rep + i, SYSTEM, OBSERVATION)
            for i in range(batch)
        ]
        t = time.perf_counter()
        pol.act(reqs)
        return time.perf_counter() - t

    once(2, 99)  # warm-up
    return min(once(1, r) for r in range(3)), min(once(tokens, r) for r in range(3))


def generate_times(path: Path, batch: int, tokens: int, dtype: str) -> tuple[float, float]:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, dtype)).eval()
    text = tok.apply_chat_template(
        [{"role": "system", "content": SYSTEM}, {"role": "user", "content": OBSERVATION}],
        tokenize=False,
        add_generation_prompt=True,
    )
    ids = tok(text, return_tensors="pt", add_special_tokens=False)["input_ids"].repeat(batch, 1)

    def once(n: int, rep: int) -> float:
        torch.manual_seed(rep)
        t = time.perf_counter()
        with torch.inference_mode():
            model.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                do_sample=True,
                temperature=0.7,
                top_p=1.0,
                top_k=0,
                max_new_tokens=n,
                min_new_tokens=n,
                pad_token_id=tok.pad_token_id,
            )
        return time.perf_counter() - t

    once(2, 99)
    return min(once(1, r) for r in range(3)), min(once(tokens, r) for r in range(3))


def main() -> None:
    import torch

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="smollm2-alfworld")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=24)
    ap.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", type=Path, default=ROOT / "docs" / "bench" / "decode.md")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    from srollout.policy import resolve_model

    path = resolve_model(args.model)
    b1, bn = backend_times(path, args.batch, args.tokens, args.dtype)
    g1, gn = generate_times(path, args.batch, args.tokens, args.dtype)
    per_b = (bn - b1) / (args.tokens - 1)
    per_g = (gn - g1) / (args.tokens - 1)
    from srollout.default_policy.build import build_machine

    cpu = build_machine()["cpu"]  # the CPU's model name, as build.json records it
    row = (
        f"| {datetime.now(timezone.utc):%Y-%m-%d %H:%M} | {cpu}, {args.threads} threads "
        f"({os.cpu_count()} cores) | {args.model} {args.dtype} | {args.batch} x {args.tokens} | "
        f"{b1 * 1e3:.0f} / {g1 * 1e3:.0f} | {per_b * 1e3:.1f} | {per_g * 1e3:.1f} | "
        f"{per_b / per_g:.2f} |"
    )
    print(row)
    if not args.out.exists():
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(
            "# Batched decode: the transformers backend vs transformers' generate\n\n"
            "`benchmarks/bench_decode.py`: the same rows, exactly N tokens each; decode ms per "
            "step with the prefill taken out, best of 3. Goal: backend / generate <= 1.25.\n\n"
            "| date (UTC) | machine | model | rows x tokens | prefill ms backend / generate | "
            "backend ms/step | generate ms/step | ratio |\n|---|---|---|---|---|---|---|---|\n"
        )
    with args.out.open("a") as f:
        f.write(row + "\n")


if __name__ == "__main__":
    main()
