"""srollout.policy.attention.packed_sdpa: a decode step's grouped-query attention over the KV heads
as they are, equal to transformers' repeat-the-KV-heads layout (query head h reads KV head
h // n_rep), and transformers' own sdpa for everything else."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from srollout.policy.attention import NAME, packed_sdpa, use_packed_attention  # noqa: E402


def test_two_query_heads_on_one_kv_head_worked_by_hand():
    """d = 2, scaling 1, keys [1, 0] and [0, 1], values [2, 0] and [4, 0]. Head 0 asks [1, 0]:
    scores (1, 0), weights (e, 1) / (e + 1), output 2 e/(e+1) + 4/(e+1) = 2.5379. Head 1 asks
    [0, 0]: equal weights, 3.0. With the second key masked out both read the first value, 2."""
    module = SimpleNamespace(num_key_value_groups=2)
    q = torch.tensor([[[[1.0, 0.0]], [[0.0, 0.0]]]])  # [B=1, H=2, q=1, d=2]
    k = torch.tensor([[[[1.0, 0.0], [0.0, 1.0]]]])  # [B=1, H_kv=1, L=2, d=2]
    v = torch.tensor([[[[2.0, 0.0], [4.0, 0.0]]]])
    out, weights = packed_sdpa(module, q, k, v, None, scaling=1.0)
    assert weights is None and out.shape == (1, 1, 2, 2)  # [B, q, H, d]
    e = math.e
    assert out[0, 0, 0, 0].item() == pytest.approx(2 * e / (e + 1) + 4 / (e + 1), abs=1e-6)
    assert out[0, 0, 1, 0].item() == pytest.approx(3.0, abs=1e-6)
    mask = torch.tensor([True, False]).view(1, 1, 1, 2)
    out, _ = packed_sdpa(module, q, k, v, mask, scaling=1.0)
    assert out[0, 0, :, 0].tolist() == pytest.approx([2.0, 2.0], abs=1e-6)


def test_decode_step_equals_repeated_kv_heads_with_left_padding():
    """4 query heads on 2 KV heads, rows left-padded by 0, 3 and 6 columns: the packed result equals
    attention with every KV head repeated (head h reads KV head h // 2); mapping h to h % 2 would
    not (heads 1 and 2 swap their KV heads)."""
    g = torch.Generator().manual_seed(0)
    B, H, H_kv, L, d = 3, 4, 2, 9, 8
    q = torch.randn(B, H, 1, d, generator=g)
    k, v = torch.randn(B, H_kv, L, d, generator=g), torch.randn(B, H_kv, L, d, generator=g)
    mask = torch.ones(B, 1, 1, L + 2, dtype=torch.bool)  # wider than L, as the model may pass
    for row, pad in enumerate((0, 3, 6)):
        mask[row, ..., :pad] = False
    out, _ = packed_sdpa(SimpleNamespace(num_key_value_groups=2), q, k, v, mask, scaling=0.5)
    rep = torch.nn.functional.scaled_dot_product_attention(
        q, k.repeat_interleave(2, dim=1), v.repeat_interleave(2, dim=1),
        attn_mask=mask[..., :L], scale=0.5,
    ).transpose(1, 2)  # fmt: skip
    assert torch.allclose(out, rep, atol=1e-6)
    wrong = torch.nn.functional.scaled_dot_product_attention(
        q, k.repeat(1, 2, 1, 1), v.repeat(1, 2, 1, 1), attn_mask=mask[..., :L], scale=0.5
    ).transpose(1, 2)
    assert not torch.allclose(out, wrong, atol=1e-3)


def test_the_shipped_policy_switched_to_it_decodes_what_sdpa_decodes_without_copying_kv(
    default_model, monkeypatch
):
    """The shipped policy (4 query heads on 2 KV heads) after use_packed_attention: prefill
    identical, the decode step's logits within float noise of stock sdpa (measured 5e-6 on logits
    of size 14), and transformers' repeat_kv called by the prefill only, never while decoding."""
    import transformers.integrations.sdpa_attention as sdpa
    from transformers import DynamicCache

    from srollout.policy.transformers_backend import load_model

    model, _ = load_model(default_model)
    cfg = model.config
    assert cfg.num_attention_heads == 2 * cfg.num_key_value_heads
    ids = torch.randint(0, cfg.vocab_size, (3, 12), generator=torch.Generator().manual_seed(1))
    mask = torch.ones(3, 13, dtype=torch.long)
    mask[1, :4], mask[2, :9] = 0, 0

    def run():
        cache = DynamicCache()
        with torch.inference_mode():
            first = model(input_ids=ids, attention_mask=mask[:, :12], past_key_values=cache)
            step = first.logits[:, -1].argmax(-1, keepdim=True)
            last = model(input_ids=step, attention_mask=mask, past_key_values=cache)
        return first.logits, last.logits

    prefill, decode = run()
    assert use_packed_attention(model) and cfg._attn_implementation == NAME
    queries = []
    original = sdpa.repeat_kv
    spy = lambda x, n: (queries.append(x.shape), original(x, n))[1]  # noqa: E731
    monkeypatch.setattr(sdpa, "repeat_kv", spy)
    prefill2, decode2 = run()
    assert torch.equal(prefill, prefill2)
    assert (decode - decode2).abs().max().item() < 1e-4
    assert len(queries) == 2 * cfg.num_hidden_layers  # keys and values, each layer, prefill only
    assert use_packed_attention(model) is False  # already switched: sdpa is no longer its attention
