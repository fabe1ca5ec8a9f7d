"""The teacher-forcing GRPO loss on a tiny real Qwen2 model (random weights, CPU)."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from srollout.training.loss import (
    HEAD_ON_HIDDEN,
    action_turn_spans,
    grad_l2_norm,
    grpo_loss,
    head_split,
    pad_batch,
    subsample_turns,
    token_logprobs,
)

torch.set_num_threads(1)


@pytest.fixture(scope="module", params=["qwen2", "gpt2"])
def model(request):
    """Qwen2: the head runs on the target positions alone (HEAD_ON_HIDDEN); GPT-2: the full
    logits path."""
    from transformers import GPT2Config, GPT2LMHeadModel, Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    if request.param == "gpt2":
        cfg = GPT2Config(vocab_size=50, n_embd=32, n_layer=2, n_head=4, n_positions=128)
        return GPT2LMHeadModel(cfg).eval()
    cfg = Qwen2Config(
        vocab_size=50,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
    )
    return Qwen2ForCausalLM(cfg).eval()


# two trajectories of different length: prompt/observation tokens (False) and actions (True)
TOKENS = [[1, 5, 6, 7, 8, 9, 10, 11], [1, 5, 12, 13, 14]]
MASK = [[False, False, True, True, False, False, True, True], [False, False, False, True, True]]


def _manual_logp_sums(model, tokens, mask):
    """log p(tau) per trajectory, one unpadded forward each (the naive reference)."""
    sums = []
    for toks, m in zip(tokens, mask, strict=True):
        ids = torch.tensor([toks])
        with torch.no_grad():
            logits = model(input_ids=ids).logits[0, :-1]
        logp = torch.log_softmax(logits.float(), -1).gather(-1, ids[0, 1:, None]).squeeze(-1)
        sums.append(float(logp[torch.tensor(m[1:])].sum()))
    return sums


def test_padded_logprobs_match_unpadded(model):
    batch = pad_batch(TOKENS, MASK)
    with torch.no_grad():
        lp = token_logprobs(model, batch).sum(1).tolist()
    assert lp == pytest.approx(_manual_logp_sums(model, TOKENS, MASK), abs=1e-5)


def test_loss_is_minus_mean_advantage_weighted_logp(model):
    adv = [1.5, -0.5]
    with torch.no_grad():
        out = grpo_loss(model, TOKENS, MASK, adv, denominator="paper")
    sums = _manual_logp_sums(model, TOKENS, MASK)
    expected = -(adv[0] * sums[0] + adv[1] * sums[1]) / 2  # the paper's 1/N
    assert float(out.loss) == pytest.approx(expected, abs=1e-5)
    assert out.n_traj == 2 and out.n_tokens == 4 + 2
    assert out.denominator == "paper"


def test_token_mean_denominator(model):
    adv = [1.0, 1.0]
    with torch.no_grad():
        out = grpo_loss(model, TOKENS, MASK, adv, denominator="token_mean")
    sums = _manual_logp_sums(model, TOKENS, MASK)
    assert float(out.loss) == pytest.approx(-(sums[0] + sums[1]) / 6, abs=1e-5)


def test_observation_tokens_get_zero_gradient(model):
    grads = {}

    def keep(grad):
        grads["logits"] = grad

    def hook(_module, _inp, output):
        output.register_hook(keep)

    head = model.get_output_embeddings()
    handle = head.register_forward_hook(hook)
    try:
        out = grpo_loss(model, TOKENS, MASK, [1.0, -1.0])
        out.loss.backward()
    finally:
        handle.remove()
        model.zero_grad()
    g = grads["logits"]
    if type(model).__name__ in HEAD_ON_HIDDEN:  # [M, V]: the 6 targets, every one with gradient
        assert g.shape == (6, 50)
        assert all(float(row.abs().sum()) > 0 for row in g)
        return
    # [N, L, V]; position t predicts token t+1
    for i, m in enumerate(MASK):
        for t in range(len(TOKENS[i]) - 1):
            row_norm = float(g[i, t].abs().sum())
            if m[t + 1]:
                assert row_norm > 0, (i, t)
            else:
                assert row_norm == 0.0, (i, t)
        # padding positions of the shorter trajectory get no gradient either
        assert float(g[i, len(TOKENS[i]) - 1 :].abs().sum()) == 0.0


def test_head_on_targets_equals_full_logits_with_lora(model):
    """The LoRA-wrapped model's log-probs and adapter gradients are those of the full logits."""
    from peft import LoraConfig, get_peft_model

    if type(model).__name__ not in HEAD_ON_HIDDEN:
        pytest.skip("the full path is the reference")
    torch.manual_seed(1)
    peft_model = get_peft_model(
        copy.deepcopy(model),
        LoraConfig(r=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False),
    )
    batch = pad_batch(TOKENS, MASK)
    fast = token_logprobs(peft_model, batch)
    fast.sum().backward()
    g_fast = [p.grad.clone() for p in peft_model.parameters() if p.requires_grad]
    peft_model.zero_grad()
    logits = peft_model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits
    full = torch.log_softmax(logits[:, :-1], -1).gather(-1, batch.input_ids[:, 1:, None])
    full = full.squeeze(-1) * batch.target_mask
    full.sum().backward()
    g_full = [p.grad.clone() for p in peft_model.parameters() if p.requires_grad]
    assert torch.allclose(fast, full, atol=1e-5)
    assert bool((fast[~batch.target_mask] == 0).all())
    for a, b in zip(g_fast, g_full, strict=True):
        assert torch.allclose(a, b, atol=1e-5)


def test_head_split_is_the_base_models_body_and_head_through_a_lora_wrapper(model):
    from peft import LoraConfig, get_peft_model

    if type(model).__name__ not in HEAD_ON_HIDDEN:
        assert head_split(model) is None
        return
    wrapped = get_peft_model(copy.deepcopy(model), LoraConfig(r=2, target_modules=["q_proj"]))
    inner = wrapped.get_base_model()
    assert head_split(model) == (model.model, model.lm_head)
    body, head = head_split(wrapped)
    assert body is inner.model and head is inner.lm_head


def test_zero_variance_group_contributes_zero_gradient(model):
    out = grpo_loss(model, TOKENS, MASK, [0.0, 0.0])
    out.loss.backward()
    assert grad_l2_norm(model.parameters()) == 0.0
    model.zero_grad()


def test_clip_at_ratio_one_has_reinforce_gradient(model):
    batch = pad_batch(TOKENS, MASK)
    with torch.no_grad():
        old = token_logprobs(model, batch)
    adv = [0.7, -1.3]
    grpo_loss(model, TOKENS, MASK, adv).loss.backward()
    g_plain = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    grpo_loss(model, TOKENS, MASK, adv, clip_eps=0.2, old_logprobs=old).loss.backward()
    g_clip = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    for a, b in zip(g_plain, g_clip, strict=True):
        assert torch.allclose(a, b, atol=1e-6)


def test_kl_to_itself_is_zero(model):
    batch = pad_batch(TOKENS, MASK)
    with torch.no_grad():
        ref = token_logprobs(model, batch)
        out = grpo_loss(model, TOKENS, MASK, [1.0, -1.0], kl_coef=0.1, ref_logprobs=ref)
    assert out.kl == pytest.approx(0.0, abs=1e-7)


def test_turn_spans_and_subsampling():
    mask = [False, True, True, False, True, False, False, True, True, True]
    assert action_turn_spans(mask) == [(1, 3), (4, 5), (7, 10)]
    kept = subsample_turns(mask, 2, np.random.default_rng(0))
    spans = action_turn_spans(kept)
    assert len(spans) == 2 and set(spans) <= {(1, 3), (4, 5), (7, 10)}
    assert subsample_turns(mask, 5, np.random.default_rng(0)) == mask
