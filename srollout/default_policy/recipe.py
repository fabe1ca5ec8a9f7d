"""The recipe of the default policy: :class:`BuildConfig`, the build's one config.

Its fields are ``srollout policy build``'s options (help from ``metadata["help"]`` via
:func:`srollout.config.help_for`); its hash names the cache directory
(:func:`srollout.default_policy.build.config_hash`) and build.json records it, which is how the
shipped model is checked against the recipe.
"""

from __future__ import annotations

from dataclasses import dataclass

from srollout.config import doc


@dataclass(frozen=True)
class BuildConfig:
    """How the default policy is built (its hash names the cache directory)."""

    seed: int = doc(0, "Seed of demonstrations, tokenizer data order, init and SFT.")
    task_set: str = doc("train", "Task set the demonstrations are played on.")
    difficulty: str = doc(
        "small", "Room size preset of the generated games (small|medium|large|full)."
    )
    n_demo_tasks: int = doc(1000, "Tasks played for demonstrations.")
    demos_per_task: int = doc(2, "Noisy-expert episodes per task.")
    noise: tuple[float, ...] = doc((0.1, 0.3), "Noise rates cycled over the episodes of a task.")
    invalid_fraction: float = doc(
        0.5, "Share of noise actions that are invalid (answered 'Nothing happens.')."
    )
    explore: str = doc(
        "listed",
        "The demonstrating expert's exploration order: `listed` (the first receptacle not checked "
        "yet, in the room description's order) or `random`.",
    )
    take: str = doc(
        "planned",
        "The demonstrating expert's take rule: `planned` (explore until the objects of the "
        "planner's plan are seen, then follow the plan) or `greedy` (take an object of a needed "
        "kind as soon as one is in view with free hands).",
    )
    thoughts: str = doc(
        "none",
        "What precedes each demonstrated action: `none` (`Action: ...` only), `scratchpad` "
        "(`Thought: Find <kind>. Unchecked: <receptacles>.`) or `react` (the expert's sentences).",
    )
    prompt: str = doc(
        "short",
        "System prompt of fine-tuning and rollouts, saved in the model's srollout.json: `short` "
        "(one line) or `react` (the ~530-token ReAct prompt of srollout.envs.prompts).",
    )
    user_template: str = doc(
        "Observation: {observation}",
        "The policy's user turn ({observation}: o_t; {task}: the goal; {actions}: the admissible "
        "actions), saved in the model's srollout.json so every stage prompts it the same way.",
    )
    template: str = doc(
        "compact",
        "Chat template: `compact` (one special token per role, 2 template tokens per message) or "
        "`chatml` (Qwen's, ~5 per message).",
    )
    vocab_size: int = doc(1024, "BPE vocabulary size.")
    d_model: int = doc(256, "Hidden size.")
    n_layers: int = doc(4, "Transformer layers.")
    d_ff: int = doc(768, "MLP size.")
    head_dim: int = doc(64, "Attention head size (vLLM kernels need 32/64/128...).")
    gqa_groups: int = doc(2, "Query heads per key/value head.")
    max_context: int = doc(
        4096,
        "Context length in tokens (max_position_embeddings; RoPE, so no weights depend on it). "
        "Raise it to 8192 with `{actions}` in the user template.",
    )
    epochs: int = doc(4, "SFT epochs.")
    lr: float = doc(3e-4, "Peak learning rate of the SFT (AdamW, cosine schedule).")
    obs_loss_weight: float = doc(
        0.5,
        "Weight of an auxiliary next-token loss on the observation tokens, added to the "
        "action-token loss (mean over each); noise actions stay untrained either way.",
    )
    batch_tokens: int = doc(1024, "Padded tokens per SFT batch (~2 episodes).")
    correction_rounds: int = doc(
        0,
        "DAgger rounds after SFT (srollout.default_policy.dagger), each fine-tuning on won "
        "trajectories the model played with the expert stepping in; 0 is SFT only.",
    )
    correction_tasks: int = doc(
        150, "Train tasks per DAgger round (a fresh seeded sample each round)."
    )
    correction_G: int = doc(4, "Trajectories per task in a DAgger round.")
    correction_beta: float = doc(
        0.5, "Probability that the expert, not the model, plays a step of a DAgger rollout."
    )
    correction_beta_decay: float = doc(1.0, "Round r (from 0) plays with beta x decay^r.")
    correction_temperature: float = doc(
        0.7, "Sampling temperature of the model's steps in a DAgger rollout."
    )
    correction_epochs: int = doc(2, "Fine-tuning epochs per DAgger round.")
    correction_lr: float = doc(1e-4, "Peak learning rate of a DAgger round's fine-tuning.")
    correction_relabel: bool = doc(
        False,
        "Also teach the expert's label at each state where the model's own step went off it, as a "
        "branch conversation; worth turning on with an {actions} user template.",
    )
    correction_branches: int = doc(
        0,
        "At most this many relabelled branches fine-tuned per round (a seeded sample; each is a "
        "whole prefix, the round's dearest data); 0 keeps them all.",
    )
    correction_replay: int = doc(
        400,
        "Original demonstrations mixed into each DAgger round's fine-tuning, so what the rounds "
        "do not show is not forgotten.",
    )
    bf16: bool = doc(
        True,
        "bf16 autocast during SFT where the CPU has native bf16 (AVX512-BF16 or AMX), fp32 "
        "elsewhere; the model directory's hash follows the precision used.",
    )
    threads: int = doc(2, "torch threads for the build.")
