"""vLLM throughput and memory of a Qwen2-architecture model of realistic size, made here from a
config with random weights (no hub download): the actions of such a model are meaningless, so
this measures the engine's speed and footprint only, never a rollout's outcome.

    python3 benchmarks/gpu_vllm/qwen_random.py --size 0.5b --prompts 256 --prompt-len 512 --gen 128

Token-id prompts (no tokenizer), ``ignore_eos`` so every request generates exactly ``--gen``
tokens, one seed per request as srollout's engine sends. Prints one line per batch size.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

SIZES = {  # Qwen2-0.5B and Qwen2-1.5B shapes (their public config.json values)
    "0.5b": dict(
        hidden_size=896,
        intermediate_size=4864,
        num_hidden_layers=24,
        num_attention_heads=14,
        num_key_value_heads=2,
    ),
    "1.5b": dict(
        hidden_size=1536,
        intermediate_size=8960,
        num_hidden_layers=28,
        num_attention_heads=12,
        num_key_value_heads=2,
    ),
}


def make_model(size: str, out: Path) -> int:
    """Write a random-weight Qwen2 of ``size`` to ``out`` in bf16; returns its parameter count."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    cfg = Qwen2Config(
        vocab_size=151936, max_position_embeddings=32768, tie_word_embeddings=True, **SIZES[size]
    )
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = Qwen2ForCausalLM(cfg).to(torch.bfloat16)
    model.save_pretrained(out)
    return sum(p.numel() for p in model.parameters())


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--size", default="0.5b", choices=sorted(SIZES))
    ap.add_argument("--prompts", default="64,256")
    ap.add_argument("--prompt-len", type=int, default=512)
    ap.add_argument("--gen", type=int, default=128)
    args = ap.parse_args()
    import torch
    from vllm import LLM, SamplingParams

    path = Path(f"/tmp/qwen2-{args.size}-random")
    t0 = time.perf_counter()
    n_params = make_model(args.size, path)
    torch.cuda.empty_cache()
    print(
        f"model: Qwen2 {args.size} shape, {n_params / 1e6:.0f}M parameters, random bf16 weights, "
        f"written in {time.perf_counter() - t0:.1f} s",
        flush=True,
    )
    t0 = time.perf_counter()
    llm = LLM(
        model=str(path),
        skip_tokenizer_init=True,
        enable_prefix_caching=True,
        seed=0,
        gpu_memory_utilization=0.5,
        max_model_len=4096,
    )
    print(f"engine up in {time.perf_counter() - t0:.1f} s", flush=True)
    gen = torch.Generator().manual_seed(1)
    for n in (int(x) for x in args.prompts.split(",")):
        prompts = [
            {
                "prompt_token_ids": torch.randint(
                    0, 150000, (args.prompt_len,), generator=gen
                ).tolist()
            }
            for _ in range(n)
        ]
        params = [
            SamplingParams(
                temperature=0.7, max_tokens=args.gen, ignore_eos=True, seed=i, detokenize=False
            )
            for i in range(n)
        ]
        t0 = time.perf_counter()
        outs = llm.generate(prompts, params, use_tqdm=False)
        dt = time.perf_counter() - t0
        toks = sum(len(o.outputs[0].token_ids) for o in outs)
        print(
            json.dumps(
                dict(
                    size=args.size,
                    prompts=n,
                    prompt_len=args.prompt_len,
                    gen=args.gen,
                    seconds=round(dt, 2),
                    gen_tok_per_s=round(toks / dt),
                    prompt_tok_per_s=round(n * args.prompt_len / dt),
                )
            ),
            flush=True,
        )


if __name__ == "__main__":
    main()
