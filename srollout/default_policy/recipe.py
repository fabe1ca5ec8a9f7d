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
    difficulty: str = doc("small", "Room size preset of the generated games (small|medium|large|full).")
    n_demo_tasks: int = doc(1000, "Tasks played for demonstrations.")
    demos_per_task: int = doc(2, "Noisy-expert episodes per task.")
    noise: tuple[float, ...] = doc((0.1, 0.3), "Noise rates cycled over the episodes of a task.")
    invalid_fraction: float = doc(0.5, "Share of noise actions that are invalid (answered 'Nothing happens.').")
    explore: str = doc("listed", "The demonstrating expert's exploration order: `listed` (the first receptacle not checked yet, in the room description's order) or `random`. v3 (random order, 6 epochs) reached 0 % success: it sampled receptacles absent from the room.")
    take: str = doc("planned", "The demonstrating expert's take rule: `planned` (explore until the very objects of the planner's plan are seen, then follow the plan; v2-v5, the default) or `greedy` (take an object of a needed kind as soon as one is in view with free hands). Greedy alone: 31 % success, 53 % valid actions on 1000 tasks x 2 epochs against planned's 27 % / 57 % (docs/benchmarks.md).")
    thoughts: str = doc("none", "What precedes each demonstrated action: `none` (`Action: ...` only; v3-v5), `scratchpad` (`Thought: Find <kind>. Unchecked: <receptacles not checked yet, in the room's order>.`) or `react` (the expert's templated sentences). Measured on 1000 tasks x 2 epochs: scratchpad 19 % success and 51 % valid actions against 31 % and 53 % without (docs/benchmarks.md); v2 (react, lr 10x too high) reached 0 %.")
    prompt: str = doc("short", "System prompt the policy is fine-tuned and rolled out with: `short` (one line, saved in the model directory's srollout.json so every stage uses it) or `react` (the full ReAct prompt of srollout.envs.prompts, ~530 tokens with its worked example; v2-v4 used it, and their most frequent invalid actions named receptacles of the example).")
    user_template: str = doc("Observation: {observation}", "The policy's user turn ({observation}: o_t; {task}: the goal sentence; {actions}: the state's admissible actions, as the paper's ALFWorld prompt lists them), saved in the model directory's srollout.json so every stage prompts it the same way. On 1000 tasks x 2 epochs (greedy expert): observation only 53 % valid actions / 31 % success, + task 52 / 58 %, + actions 77 / 60 %, but the actions list doubles the SFT tokens: at 500 tasks x 2 epochs + 1 DAgger round (a 20.5-minute build) it reached only 63 % / 31 % (docs/benchmarks.md).")
    template: str = doc("compact", "Chat template: `compact` (one special token per role, 2 template tokens per message) or `chatml` (Qwen's, ~5 per message).")
    vocab_size: int = doc(1024, "BPE vocabulary size.")
    d_model: int = doc(256, "Hidden size.")
    n_layers: int = doc(4, "Transformer layers.")
    d_ff: int = doc(768, "MLP size.")
    head_dim: int = doc(64, "Attention head size (vLLM kernels need 32/64/128...).")
    gqa_groups: int = doc(2, "Query heads per key/value head.")
    max_context: int = doc(4096, "Context length (max_position_embeddings; RoPE, so no weights depend on it). With `{actions}` in the user template 30 turns take up to ~4000 tokens: raise it to 8192 then.")
    epochs: int = doc(4, "SFT epochs.")
    lr: float = doc(3e-4, "Peak learning rate (AdamW, cosine). Measured on 1000 episodes x 2 epochs at 1024-token batches (teacher-forced exact responses on eval demonstrations): 3e-3 0.30 (3 epochs), 2e-3 0.32, 1e-3 0.44, 5e-4 0.59, 2.5e-4 0.62 (with the observation loss). v2-v4 used 3e-3 at 4096-token batches.")
    obs_loss_weight: float = doc(0.5, "Weight of an auxiliary next-token loss on the observation (environment) tokens, added to the action-token loss (mean over each). The environment's text repeats names (`You arrive at cabinet 2. The cabinet 2 is closed.`): predicting it teaches the copying the actions need. Noise actions stay untrained either way.")
    batch_tokens: int = doc(1024, "Padded tokens per SFT batch (~2 episodes: 4x the optimizer steps of 4096, which learned far less per epoch).")
    correction_rounds: int = doc(0, "DAgger rounds after SFT (srollout.default_policy.dagger): the model plays train tasks with the expert stepping in, and is fine-tuned on the won trajectories: the expert's turns and the model's turns that match the expert's label (with correction_relabel, also the label at each state where the model went wrong). On the v5 model each round (150 tasks, 2 epochs, 400 replayed; ~4-6 min) added 3-7 points of valid actions (71 -> 78 -> 80 %) and success (72 -> 80 %), while mixed groups fell (60 -> 45 -> 32 %). 0 (v2-v5, the default): SFT only, which keeps the build under 20 minutes.")
    correction_tasks: int = doc(150, "Train tasks per DAgger round (a fresh seeded sample each round).")
    correction_G: int = doc(4, "Trajectories per task in a DAgger round.")
    correction_beta: float = doc(0.5, "Probability that the expert, not the model, plays a step of a DAgger rollout.")
    correction_temperature: float = doc(0.7, "Sampling temperature of the model's steps in a DAgger rollout.")
    correction_epochs: int = doc(2, "Fine-tuning epochs per DAgger round.")
    correction_lr: float = doc(1e-4, "Peak learning rate of a DAgger round's fine-tuning.")
    correction_relabel: bool = doc(False, "Also teach the expert's label at each state where the model's own step went off it, as a branch conversation (the turns up to that state untrained, then the label), as textbook DAgger aggregates every labelled state. Measured on the v5 model (one round, the same 600 rollouts fine-tuned both ways, 40 eval groups x G=8): valid actions 73.8 % with it against 76.2 % without (v5: 71.1 %), and 42 % more fine-tuning tokens. With the admissible actions in the user template it helps: a third round on the q3 recipe model gave 85.4 % valid against 82.3 % without it (100 groups; q3 itself 84.8 %) and 27 % fewer repeated invalid actions. Off by default (the default build runs no rounds); turn it on with an {actions} template.")
    correction_replay: int = doc(400, "Original demonstrations mixed into each DAgger round's fine-tuning, so what the rounds do not show is not forgotten.")
    bf16: bool = doc(True, "bf16 autocast during SFT where the CPU has native bf16 (AVX512-BF16 or AMX; 1.5x faster than fp32 there); fp32 on other CPUs, where emulated bf16 is ~40x slower (the model directory hash follows the precision used).")
    threads: int = doc(2, "torch threads for the build.")
