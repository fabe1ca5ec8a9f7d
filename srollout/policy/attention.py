"""Attention for the transformers backend's decode steps: grouped-query attention without copying
the KV cache.

The backend decodes one token per row against a KV buffer of the whole call's width, with an
attention mask (rows are left-padded to a common past). transformers' own ``sdpa`` attention,
up to 5.22, repeats every key/value head ``num_key_value_groups`` times whenever a mask is given
on CPU (``repeat_kv``): a copy of the whole buffer, per layer, per decode step. On the default
policy (4 query heads over 2 KV heads) that copy was 30 % of the rollout's time under 5.19, and
``make demo`` rolled out at half the speed it reaches under 5.23, which packs the query heads of
one KV head together instead. :func:`packed_sdpa` does the same on every version: a single query
token's heads ``[B, H, 1, d]`` become ``[B, H_kv, n_rep, d]`` (query head ``h`` attends with KV
head ``h // n_rep``, as ``repeat_kv`` lays them out), one ``scaled_dot_product_attention`` over
the KV heads as they are, and the output back to ``[B, 1, H, d]``. Everything else (prefill,
training, a model without grouped heads) goes to transformers' own ``sdpa`` unchanged.

:func:`use_packed_attention` registers it under :data:`NAME` (with sdpa's mask function) and
switches a loaded model to it.
"""

from __future__ import annotations

from typing import Any

NAME = "srollout_packed_sdpa"


def packed_sdpa(
    module: Any,
    query: Any,
    key: Any,
    value: Any,
    attention_mask: Any,
    dropout: float = 0.0,
    scaling: float | None = None,
    is_causal: bool | None = None,
    **kwargs: Any,
) -> tuple[Any, None]:
    """transformers' attention-function signature: query ``[B, H, q, d]``, key/value
    ``[B, H_kv, L, d]``, attention_mask ``[B|1, 1, q, L']`` (bool or additive, L' >= L) or None;
    returns ``([B, q, H, d], None)``."""
    import torch
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    n_rep = int(getattr(module, "num_key_value_groups", 1))
    mask = attention_mask
    if (
        query.shape[2] != 1
        or n_rep == 1
        or dropout
        or kwargs.get("position_bias") is not None
        or kwargs.get("cache") is not None
        or (mask is not None and (mask.ndim != 4 or mask.shape[1] != 1))
    ):
        return sdpa_attention_forward(
            module, query, key, value, attention_mask,
            dropout=dropout, scaling=scaling, is_causal=is_causal, **kwargs,
        )  # fmt: skip
    batch, heads, _, dim = query.shape
    packed = query.reshape(batch, heads // n_rep, n_rep, dim)
    if mask is not None:
        mask = mask[:, :, :, : key.shape[-2]]  # [B, 1, 1, L]: the same for every head
    out = torch.nn.functional.scaled_dot_product_attention(
        packed, key, value, attn_mask=mask, dropout_p=0.0, scale=scaling, is_causal=False
    )
    return out.reshape(batch, heads, 1, dim).transpose(1, 2).contiguous(), None


def use_packed_attention(model: Any) -> bool:
    """Switch ``model`` (a transformers model, or a peft model around one) to :func:`packed_sdpa`
    when it runs transformers' ``sdpa``; return whether it did (eager, flash or a custom attention
    is left as it is)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface

    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    if getattr(base.config, "_attn_implementation", None) != "sdpa":
        return False
    if NAME not in AttentionInterface._global_mapping:
        AttentionInterface.register(NAME, packed_sdpa)
        AttentionMaskInterface.register(NAME, ALL_MASK_ATTENTION_FUNCTIONS["sdpa"])
    base.set_attn_implementation(NAME)
    return True
