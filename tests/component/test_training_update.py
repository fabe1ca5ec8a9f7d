"""One GRPO update on a tiny real Qwen2 + LoRA (CPU): micro-batching, dilution, zero-variance."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from srollout.training.lora import (
    OFFPOLICY_LORA,
    adapter_state,
    attach_lora,
    make_optimizer,
    trainable_parameters,
)
from srollout.training.update import (
    GroupOutcome,
    grpo_update,
    samples_from_groups,
    truncate_after_last_action,
)

torch.set_num_threads(1)


def _model(seed: int = 0):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    cfg = Qwen2Config(
        vocab_size=50,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
    )
    model = attach_lora(Qwen2ForCausalLM(cfg), OFFPOLICY_LORA, seed=seed)
    # B starts at zero, which would make A's gradient zero: give B values so both get gradient
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn_like(p) * 0.1)
    return model


def _group(gid: str, rewards, seed: int) -> GroupOutcome:
    rng = np.random.default_rng(seed)
    ids, masks = [], []
    for _ in rewards:
        n = int(rng.integers(8, 14))
        ids.append(rng.integers(1, 50, n).tolist())
        masks.append([False, False, False] + [bool(x) for x in rng.integers(0, 2, n - 3)])
    return GroupOutcome(gid, list(rewards), ids, masks)


MIXED = [_group("m1", [1, 0, 0, 1], 1), _group("m2", [0, 0, 1, 0], 2)]
ZERO_VAR = [_group("z1", [0, 0, 0, 0], 3), _group("z2", [1, 1, 1, 1], 4)]


def _grads(model):
    return torch.cat([p.grad.flatten() for p in trainable_parameters(model)])


def test_micro_batches_give_the_one_pass_gradient():
    samples = samples_from_groups(MIXED + ZERO_VAR)
    grads = []
    for micro in (1, 3, 16):
        model = _model()
        opt = make_optimizer(model, lr=0.0)  # lr 0: the step leaves weights alone, we read the norm
        stats = grpo_update(model, opt, samples, micro_batch=micro)
        grads.append(stats.grad_l2)
        assert stats.n_traj == 16 and stats.zero_adv_frac == pytest.approx(0.5)
    assert grads[0] == pytest.approx(grads[1], rel=1e-5) and grads[0] == pytest.approx(
        grads[2], rel=1e-5
    )


def test_dropping_zero_variance_groups_scales_the_gradient_by_N_over_N_kept():
    """§5.4's dilution: with L = -1/N sum A_i log p, the 8 zero-advantage trajectories add
    nothing to the numerator, so removing them multiplies the gradient by 16/8 = 2 exactly."""
    full, kept = samples_from_groups(MIXED + ZERO_VAR), samples_from_groups(MIXED)
    norms = []
    for samples in (full, kept):
        model = _model()
        stats = grpo_update(model, make_optimizer(model, lr=0.0), samples)
        norms.append(stats.grad_l2)
    assert norms[0] > 0
    assert norms[1] / norms[0] == pytest.approx(16 / 8, rel=1e-5)
    # token_mean divides by action tokens instead: the ratio is the token-count ratio
    tok = [sum(sum(s.action_mask[1:]) for s in x) for x in (full, kept)]
    norms = []
    for samples in (full, kept):
        model = _model()
        norms.append(
            grpo_update(
                model, make_optimizer(model, lr=0.0), samples, denominator="token_mean"
            ).grad_l2
        )
    assert norms[1] / norms[0] == pytest.approx(tok[0] / tok[1], rel=1e-5)


def test_zero_variance_batch_has_zero_gradient_and_leaves_the_adapter_unchanged():
    model = _model()
    before = adapter_state(model)
    stats = grpo_update(model, make_optimizer(model, lr=1e-2), samples_from_groups(ZERO_VAR))
    assert stats.grad_l2 == 0.0 and stats.zero_adv_frac == 1.0 and stats.stepped
    after = adapter_state(model)
    assert all(torch.equal(before[k], after[k]) for k in before)
    # ... while a mixed batch moves it
    grpo_update(model, make_optimizer(model, lr=1e-2), samples_from_groups(MIXED))
    assert any(not torch.equal(before[k], v) for k, v in adapter_state(model).items())


def test_empty_batch_takes_no_step():
    model = _model()
    stats = grpo_update(model, make_optimizer(model, lr=1e-2), [])
    assert not stats.stepped and stats.n_traj == 0 and stats.grad_l2 == 0.0


def test_kl_and_clipping_run_and_kl_starts_at_zero():
    """At B = 0 the adapter is the identity, so KL to the base model is 0 (and so is its
    gradient); the clipped surrogate with old = current logprobs has ratio 1, whose gradient
    d(ratio)/dθ = d log p/dθ equals REINFORCE's."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from srollout.training.lora import OFFPOLICY_LORA, attach_lora

    torch.manual_seed(0)
    cfg = Qwen2Config(
        vocab_size=50,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
    )
    model = attach_lora(Qwen2ForCausalLM(cfg), OFFPOLICY_LORA, seed=0)
    samples = samples_from_groups(MIXED)
    plain = grpo_update(model, make_optimizer(model, lr=0.0), samples)
    both = grpo_update(model, make_optimizer(model, lr=0.0), samples, clip_eps=0.2, kl_coef=0.1)
    assert both.kl == pytest.approx(0.0, abs=1e-7) and both.clip_frac == 0.0
    assert both.grad_l2 > 0 and both.grad_l2 == pytest.approx(plain.grad_l2, rel=1e-4)


def test_truncate_after_last_action():
    ids, mask = truncate_after_last_action([1, 2, 3, 4, 5], [False, True, False, True, False])
    assert ids == [1, 2, 3, 4] and mask == [False, True, False, True]


def test_checkpointed_layers_recompute_in_the_update_alone_and_give_the_same_step():
    """A model marked for gradient checkpointing (as load_trainable marks one over 50M
    parameters) runs each decoder layer twice in an update (forward, then the recompute of the
    backward pass) and ends with the same weights; outside the update its layers are in eval
    mode again, so a rollout on the shared module keeps its KV cache."""
    from transformers.modeling_layers import GradientCheckpointingLayer

    samples = samples_from_groups(MIXED + ZERO_VAR)
    after, calls = [], []
    for checkpointed in (False, True):
        model = _model()
        if checkpointed:
            model.get_base_model().gradient_checkpointing_enable({"use_reentrant": False})
        layers = [m for m in model.modules() if isinstance(m, GradientCheckpointingLayer)]
        seen: list[int] = []
        for m in layers:  # count forward runs (a recompute runs forward, not the module's hooks)
            m.forward = lambda *a, _f=m.forward, _s=seen, **k: (_s.append(1), _f(*a, **k))[1]
        grpo_update(model, make_optimizer(model, lr=1e-2), samples, micro_batch=16)
        calls.append(len(seen))
        after.append(torch.cat([p.detach().flatten() for p in trainable_parameters(model)]))
        assert not any(m.training for m in model.modules())
        with torch.no_grad():
            out = model(input_ids=torch.tensor([[1, 2, 3]]), use_cache=True)
        assert out.past_key_values is not None and out.past_key_values.get_seq_length() == 3
    assert calls == [2, 4]  # 2 layers, one micro-batch: once each, then twice each
    assert torch.allclose(after[0], after[1], atol=1e-6)


def test_load_trainable_checkpoints_only_models_over_the_bound(tiny_policy, monkeypatch):
    from srollout.training import model as model_mod

    def marked() -> bool:
        tm = model_mod.load_trainable(tiny_policy, OFFPOLICY_LORA, seed=0)
        return any(getattr(m, "gradient_checkpointing", False) for m in tm.model.modules())

    assert not marked()  # ~30k parameters: nothing worth recomputing
    monkeypatch.setattr(model_mod, "CHECKPOINT_ABOVE", 0)
    assert marked()
