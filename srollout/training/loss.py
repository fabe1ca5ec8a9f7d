"""Teacher-forcing GRPO loss over the rollout's own tokens (paper App. "Teacher-forcing GRPO loss").

Each trajectory is the exact token sequence the rollout produced,
``[prompt, o_1, a_1, o_2, a_2, ..., o_T, a_T]``, with an action mask that is True only on the
tokens the policy generated. One causal forward pass over the (right-padded) batch gives
``log p(x_t | x_<t)`` at every position; only action positions count:

    log p(tau_i) = sum_{t in A_i} log p(x_t | x_<t)
    L = - sum_i w_i * A_i * log p(tau_i)                    (REINFORCE form, the paper's)

with w_i from :func:`srollout.core.grpo.sequence_weights` (the loss denominator; the paper's is
1/N). With ``clip_eps`` the per-token term becomes PPO's clipped surrogate against the logprobs
of the policy that sampled the tokens; with ``kl_coef > 0`` a k3 KL estimate to a reference
policy is added per action token. Both are off by default, as in the paper.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from srollout.core.grpo import sequence_weights


@dataclass(frozen=True)
class PaddedBatch:
    """Right-padded tensors for a batch of N trajectories of max length L: input_ids [N, L] long;
    attention_mask [N, L] long (1 on real tokens); target_mask [N, L-1] bool, True where position
    t+1 is an action token that counts (the logit at t predicts the token at t+1)."""

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    target_mask: torch.Tensor


def pad_batch(
    token_ids: Sequence[Sequence[int]], action_mask: Sequence[Sequence[bool]], pad_id: int = 0
) -> PaddedBatch:
    """Pad ragged trajectories to one [N, L] batch; the first token can never be a target."""
    if len(token_ids) != len(action_mask):
        raise ValueError("token_ids and action_mask must have the same number of trajectories")
    n = len(token_ids)
    length = max(len(t) for t in token_ids)
    ids = torch.full((n, length), pad_id, dtype=torch.long)
    attn = torch.zeros((n, length), dtype=torch.long)
    amask = torch.zeros((n, length), dtype=torch.bool)
    for i, (toks, mask) in enumerate(zip(token_ids, action_mask, strict=True)):
        if len(toks) != len(mask):
            raise ValueError(f"trajectory {i}: {len(toks)} tokens but {len(mask)} mask entries")
        ids[i, : len(toks)] = torch.as_tensor(list(toks), dtype=torch.long)
        attn[i, : len(toks)] = 1
        amask[i, : len(mask)] = torch.as_tensor(list(mask), dtype=torch.bool)
    return PaddedBatch(ids, attn, amask[:, 1:])


# Causal LMs whose logits are lm_head(last_hidden_state), unscaled (read in transformers 5.19)
HEAD_ON_HIDDEN = {"LlamaForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM", "MistralForCausalLM"}


def head_split(model: torch.nn.Module) -> tuple[torch.nn.Module, torch.nn.Module] | None:
    """(body, lm_head) of a :data:`HEAD_ON_HIDDEN` model, peft-wrapped or not, else None: the
    head can then run on chosen positions alone (the GRPO loss's and the SFT's one place)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return (base.model, base.lm_head) if type(base).__name__ in HEAD_ON_HIDDEN else None


def token_logprobs(model: torch.nn.Module, batch: PaddedBatch) -> torch.Tensor:
    """log p(x_{t+1} | x_<=t) at the target positions: [N, L-1] float32 (zeros off the mask); the
    head on the M targets alone where :func:`head_split` can ([M, V] logits: docs/benchmarks.md)."""
    kw = {"input_ids": batch.input_ids, "attention_mask": batch.attention_mask, "use_cache": False}
    mask, split = batch.target_mask, head_split(model)
    if split is None:
        logp = torch.log_softmax(model(**kw).logits[:, :-1].float(), dim=-1)
        return logp.gather(-1, batch.input_ids[:, 1:].unsqueeze(-1)).squeeze(-1) * mask
    logits = split[1](split[0](**kw).last_hidden_state[:, :-1][mask])  # [M, V]
    logp = torch.log_softmax(logits.float(), dim=-1)
    picked = logp.gather(-1, batch.input_ids[:, 1:][mask].unsqueeze(-1)).squeeze(-1)
    return torch.zeros(mask.shape, dtype=picked.dtype).masked_scatter(mask, picked)


@dataclass(frozen=True)
class LossOutput:
    """loss: scalar tensor to backpropagate; the rest is for the metrics log."""

    loss: torch.Tensor
    n_traj: int
    n_tokens: int
    denominator: str
    mean_logp: float
    kl: float
    clip_frac: float


def grpo_loss(
    model: torch.nn.Module,
    token_ids: Sequence[Sequence[int]],
    action_mask: Sequence[Sequence[bool]],
    advantages: Sequence[float],
    denominator: str = "paper",
    constant: float | None = None,
    clip_eps: float | None = None,
    old_logprobs: torch.Tensor | None = None,
    kl_coef: float = 0.0,
    ref_logprobs: torch.Tensor | None = None,
    pad_id: int = 0,
    seq_weights: Sequence[float] | None = None,
) -> LossOutput:
    """The GRPO loss of N trajectories (shapes: N sequences; advantages [N]).

    ``old_logprobs`` / ``ref_logprobs`` are [N, L-1] tensors as returned by
    :func:`token_logprobs` on the same batch (sampling policy / reference policy), needed only
    with ``clip_eps`` / ``kl_coef > 0``. ``seq_weights`` ([N], optional) replaces the weights
    w_i of ``denominator``: a caller that splits one GRPO batch into micro-batches computes w_i
    once over the whole batch and passes each micro-batch its slice, so the summed loss (and
    gradient) equals that of the whole batch in one pass.
    """
    batch = pad_batch(token_ids, action_mask, pad_id)
    mask = batch.target_mask
    n_tok_per_seq = mask.sum(dim=1)
    logp = token_logprobs(model, batch)
    adv = torch.as_tensor(np.asarray(advantages, dtype=np.float32)).unsqueeze(1)

    clip_frac = 0.0
    if clip_eps is None:
        per_token = adv * logp
    else:
        if old_logprobs is None:
            raise ValueError("clip_eps needs old_logprobs from the sampling policy")
        ratio = torch.exp(logp - old_logprobs.detach())
        clipped = torch.clamp(ratio, 1.0 - clip_eps, 1.0 + clip_eps)
        per_token = torch.minimum(ratio * adv, clipped * adv)
        clip_frac = (
            float(((ratio - clipped).abs() > 1e-6)[mask].float().mean()) if mask.any() else 0.0
        )
    per_token = per_token * mask

    kl_value = 0.0
    if kl_coef > 0.0:
        if ref_logprobs is None:
            raise ValueError("kl_coef > 0 needs ref_logprobs from the reference policy")
        delta = ref_logprobs.detach() - logp
        kl_tok = (torch.exp(delta) - delta - 1.0) * mask  # k3 estimator, >= 0
        per_token = per_token - kl_coef * kl_tok
        kl_value = float(kl_tok.detach().sum() / mask.sum().clamp(min=1))

    if seq_weights is None:
        seq_weights = sequence_weights(denominator, n_tok_per_seq.tolist(), constant=constant)
    elif len(seq_weights) != len(token_ids):
        raise ValueError(
            f"seq_weights has {len(seq_weights)} entries for {len(token_ids)} trajectories"
        )
    weights = torch.as_tensor(np.asarray(seq_weights, dtype=np.float32), dtype=torch.float32)
    loss = -(weights * per_token.sum(dim=1)).sum()
    n_tokens = int(mask.sum())
    return LossOutput(
        loss=loss,
        n_traj=len(token_ids),
        n_tokens=n_tokens,
        denominator=denominator,
        mean_logp=float((logp.detach() * mask).sum() / max(n_tokens, 1)),
        kl=kl_value,
        clip_frac=clip_frac,
    )


def grad_l2_norm(parameters) -> float:
    """L2 norm of all gradients of ``parameters`` (trainable ones), as the paper logs it."""
    total = torch.zeros(())
    for p in parameters:
        if p.grad is not None:
            total += p.grad.detach().float().pow(2).sum()
    return float(total.sqrt())


def action_turn_spans(action_mask: Sequence[bool]) -> list[tuple[int, int]]:
    """Contiguous runs of True in an action mask: one (start, end) per assistant turn."""
    spans: list[tuple[int, int]] = []
    start = None
    for i, m in enumerate(action_mask):
        if m and start is None:
            start = i
        elif not m and start is not None:
            spans.append((start, i))
            start = None
    if start is not None:
        spans.append((start, len(action_mask)))
    return spans


def subsample_turns(action_mask: Sequence[bool], k: int, rng: np.random.Generator) -> list[bool]:
    """Keep only ``k`` randomly chosen assistant turns of a mask (Tier 2: 8 action steps/traj)."""
    spans = action_turn_spans(action_mask)
    if len(spans) <= k:
        return list(action_mask)
    keep = sorted(rng.choice(len(spans), size=k, replace=False).tolist())
    out = [False] * len(action_mask)
    for j in keep:
        s, e = spans[j]
        out[s:e] = [True] * (e - s)
    return out
