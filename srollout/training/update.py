"""One GRPO update: trajectories of the kept groups -> advantages -> loss -> one AdamW step.

Shared by the off-policy (Tier 2) and on-policy (Tier 3) loops; a cut group never reaches it.
Zero-advantage trajectories (zero-variance groups the gate did not cut) *are* in the batch, as
in the paper's baseline: they add nothing to the numerator of L = -1/N sum_i A_i log p(tau_i)
but occupy a slot of N (the dilution of §5.4) and cost a forward and backward pass."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np


@dataclass(frozen=True)
class TrainSample:
    """One trajectory in a GRPO batch: token_ids / action_mask [L] (only the policy's tokens carry
    loss), advantage A_i of Eq. (1), its group."""

    token_ids: Sequence[int]
    action_mask: Sequence[bool]
    advantage: float
    group_id: str


class GroupOutcome(NamedTuple):
    """One group's rollouts as the trainer needs them: rewards [G] and token sequences."""

    group_id: str
    rewards: Sequence[float]
    token_ids: Sequence[Sequence[int]]
    action_masks: Sequence[Sequence[bool]]


class UpdateStats(NamedTuple):
    """What one update logs: loss (summed over micro-batches), grad_l2 (before clipping), N, action
    tokens with loss, zero_adv_frac (share with A_i == 0), mean_logp per action token, kl /
    clip_frac (0 unless on), update_s (forward + backward + step, s), stepped (False on an empty
    batch)."""

    loss: float
    grad_l2: float
    n_traj: int
    n_tokens: int
    zero_adv_frac: float
    mean_logp: float
    kl: float
    clip_frac: float
    update_s: float
    stepped: bool


def samples_from_groups(
    groups: Sequence[GroupOutcome],
    keep_turns: Callable[[Any, int, Sequence[bool]], list[bool]] | None = None,
) -> list[TrainSample]:
    """GRPO advantages per group (:func:`srollout.core.grpo.group_advantages`, its eps), one
    TrainSample per trajectory that has tokens (non-LLM policies record none).
    ``keep_turns(group, i, mask)``: the action mask of trajectory i to train on (off-policy's
    sampled turns; its tokens after the last kept one are dropped)."""
    from srollout.core.grpo import group_advantages

    out: list[TrainSample] = []
    for g in groups:
        adv = group_advantages(np.asarray(g.rewards, dtype=np.float64))
        for i, (a, ids, mask) in enumerate(zip(adv, g.token_ids, g.action_masks, strict=True)):
            if len(ids) and any(mask):
                if keep_turns is not None:
                    ids, mask = truncate_after_last_action(ids, keep_turns(g, i, mask))
                out.append(TrainSample(list(ids), list(mask), float(a), g.group_id))
    return out


@contextmanager
def recomputing(model: Any) -> Iterator[None]:
    """Layers marked for gradient checkpointing (load_trainable) recompute while this lasts: only
    their own training flags are set (dropout stays off; a later rollout keeps its KV cache)."""
    from transformers.modeling_layers import GradientCheckpointingLayer as Layer

    layers = [m for m in model.modules() if isinstance(m, Layer) and m.gradient_checkpointing]
    for layer in layers:
        layer.training = True
    try:
        yield
    finally:
        for layer in layers:
            layer.training = False


def config_update(config: Any, trainable: Any, optimizer: Any, samples: Sequence[TrainSample]):
    """:func:`grpo_update` of a :class:`~srollout.training.model.TrainableModel` with a training
    config's loss settings (both training stages)."""
    c = config
    return grpo_update(trainable.model, optimizer, samples, denominator=c.denominator,
                       constant=c.denominator_constant, clip_eps=c.clip_eps, kl_coef=c.kl_coef,
                       micro_batch=c.micro_batch, pad_id=trainable.pad_id)  # fmt: skip


def grpo_update(
    model: Any,
    optimizer: Any,
    samples: Sequence[TrainSample],
    *,
    denominator: str = "paper",
    constant: float | None = None,
    clip_eps: float | None = None,
    kl_coef: float = 0.0,
    micro_batch: int = 8,
    max_grad_norm: float | None = None,
    pad_id: int = 0,
) -> UpdateStats:
    """One optimizer step on ``samples`` (N trajectories).

    w_i of ``denominator`` are computed over the whole batch, then the batch runs in micro-batches
    of ``micro_batch`` whose gradients accumulate, so the step equals one pass over the whole batch.
    ``clip_eps``: PPO ratio clipping against the pre-update policy (the ratio is 1 with one update
    per batch); ``kl_coef``: k3 KL to the base model (adapter disabled); ``max_grad_norm`` clips
    after the norm is logged. An empty batch (every group cut) takes no step."""
    import torch

    from srollout.core.grpo import sequence_weights, zero_advantage_fraction
    from srollout.training.lora import trainable_parameters
    from srollout.training.loss import grad_l2_norm, grpo_loss, pad_batch, token_logprobs

    t0 = time.perf_counter()
    n = len(samples)
    if n == 0:
        return UpdateStats(0.0, 0.0, 0, 0, float("nan"), float("nan"), 0.0, 0.0, 0.0, False)
    params = trainable_parameters(model)
    optimizer.zero_grad(set_to_none=True)
    n_action = [_n_targets(s.action_mask) for s in samples]
    weights = sequence_weights(denominator, n_action, constant=constant)
    loss_sum, kl_sum, clip_sum, logp_sum, tokens = 0.0, 0.0, 0.0, 0.0, 0
    with recomputing(model):  # the layers load_trainable marked, if any
        for start in range(0, n, max(1, micro_batch)):
            chunk = samples[start : start + max(1, micro_batch)]
            ids = [s.token_ids for s in chunk]
            masks = [s.action_mask for s in chunk]
            old = ref = None
            if clip_eps is not None or kl_coef > 0.0:
                batch = pad_batch(ids, masks, pad_id)
                with torch.no_grad():
                    if clip_eps is not None:
                        old = token_logprobs(model, batch)
                    if kl_coef > 0.0:
                        with model.disable_adapter():
                            ref = token_logprobs(model, batch)
            out = grpo_loss(
                model,
                ids,
                masks,
                [s.advantage for s in chunk],
                denominator=denominator,
                constant=constant,
                clip_eps=clip_eps,
                old_logprobs=old,
                kl_coef=kl_coef,
                ref_logprobs=ref,
                pad_id=pad_id,
                seq_weights=weights[start : start + len(chunk)],
            )
            out.loss.backward()
            loss_sum += float(out.loss.detach())
            kl_sum += out.kl * out.n_tokens
            clip_sum += out.clip_frac * out.n_tokens
            logp_sum += out.mean_logp * out.n_tokens
            tokens += out.n_tokens
    grad = grad_l2_norm(params)
    if max_grad_norm is not None:
        torch.nn.utils.clip_grad_norm_(params, max_grad_norm)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return UpdateStats(
        loss=loss_sum,
        grad_l2=grad,
        n_traj=n,
        n_tokens=tokens,
        zero_adv_frac=float(zero_advantage_fraction([np.asarray([s.advantage for s in samples])])),
        mean_logp=logp_sum / max(tokens, 1),
        kl=kl_sum / max(tokens, 1),
        clip_frac=clip_sum / max(tokens, 1),
        update_s=time.perf_counter() - t0,
        stepped=True,
    )


def _n_targets(action_mask: Sequence[bool]) -> int:
    """Action tokens that can be targets (the first token of a sequence never is)."""
    return int(sum(bool(m) for m in list(action_mask)[1:]))


def truncate_after_last_action(
    token_ids: Sequence[int], action_mask: Sequence[bool]
) -> tuple[list[int], list[bool]]:
    """Drop the tail after the last action token: it carries no loss, and a causal model's
    log-probabilities before it do not depend on it, so the loss is unchanged and cheaper."""
    mask = list(action_mask)
    last = max((i for i, m in enumerate(mask) if m), default=-1)
    return list(token_ids)[: last + 1], mask[: last + 1]
