"""A GRPOTrainer run that logs its rollouts (GatedRollout(log_dir=...)), for the resume test:
``python trl_log_run.py MODEL OUT LOG [--kill-at N] [--resume]``. It saves a checkpoint every 2
steps; with ``--kill-at N`` it kills itself (SIGKILL, no clean-up) once step N has finished."""

from __future__ import annotations

import os
import signal
import sys

import torch


def main() -> None:
    model, out, log = sys.argv[1:4]
    kill_at = int(sys.argv[sys.argv.index("--kill-at") + 1]) if "--kill-at" in sys.argv else None
    os.environ["TRL_EXPERIMENTAL_SILENCE"] = "1"
    torch.set_num_threads(1)
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from srollout.core.trajectory_gate import StallGate
    from srollout.integrations.trl import GatedRollout

    rollout = GatedRollout.alfworld(
        "train", n_tasks=8, G=2, T_max=4, seed=5, max_new_tokens=32,
        traj_gate=StallGate(1, 2), shadow=True, log_dir=log,
    )  # fmt: skip
    config = GRPOConfig(
        output_dir=out, use_cpu=True, bf16=False, gradient_checkpointing=False,
        num_generations=2, per_device_train_batch_size=4, max_steps=4, learning_rate=1e-4,
        beta=0.0, logging_steps=1, save_strategy="steps", save_steps=2, report_to="none",
        seed=11, disable_tqdm=True,
    )  # fmt: skip

    class Kill(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step == kill_at:
                os.kill(os.getpid(), signal.SIGKILL)

    trainer = GRPOTrainer(
        model=model, args=config, reward_funcs=rollout.reward,
        train_dataset=rollout.dataset(repeats=4), rollout_func=rollout, callbacks=[Kill()],
    )  # fmt: skip
    trainer.train(resume_from_checkpoint="--resume" in sys.argv)


if __name__ == "__main__":
    main()
