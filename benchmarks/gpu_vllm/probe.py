"""Time vLLM's engine start and first generate calls on the shipped policy: 8 prompts x 16
tokens, unseeded, then seeded (run.sh's first step: does this vLLM answer at all on the GPU)."""

import time

from vllm import LLM, SamplingParams

from srollout.policy.shipped import default_policy

t0 = time.perf_counter()
llm = LLM(model=str(default_policy()), gpu_memory_utilization=0.3, seed=0)
print(f"engine up {time.perf_counter() - t0:.1f} s", flush=True)
prompts = [{"prompt_token_ids": [1, 2, 3, 4, 5, 6, 7, 8 + i]} for i in range(8)]
for label, seed in (("unseeded", None), ("seeded", 5), ("seeded again", 6)):
    t0 = time.perf_counter()
    out = llm.generate(
        prompts, [SamplingParams(temperature=0.7, max_tokens=16, seed=seed)] * 8, use_tqdm=False
    )
    n = sum(len(o.outputs[0].token_ids) for o in out)
    print(f"{label}: {time.perf_counter() - t0:.2f} s, {n} tokens", flush=True)
