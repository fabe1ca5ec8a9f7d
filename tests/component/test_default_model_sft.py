"""The default policy's SFT objective, checked against a plain full-sequence forward pass."""

from __future__ import annotations

import dataclasses

import pytest

torch = pytest.importorskip("torch")


def _setup(template: str):
    from tiny_policy import TINY_CONFIG, synthetic_demos

    from srollout.default_policy.build import demo_texts
    from srollout.default_policy.sft import make_model, train_tokenizer
    from srollout.policy.chat import IM_END, tokenize_chat

    torch.set_num_threads(1)
    demos = synthetic_demos(6, seed=3)
    cfg = dataclasses.replace(
        TINY_CONFIG, template=template, epochs=1, lr=0.0, batch_tokens=1 << 20
    )
    tok = train_tokenizer(demo_texts(demos, template), cfg.vocab_size, template)
    im_end = tok.convert_tokens_to_ids(IM_END)
    examples = [tokenize_chat(tok, d.system, d.turns, im_end) for d in demos]
    return cfg, tok, examples, make_model(tok, cfg)


def _reference(model, examples, obs_w: float) -> float:
    """Mean CE on loss tokens + obs_w x mean CE on observation tokens after the shared system
    prefix (the constant system turn is not a target), one plain forward per example."""
    import torch.nn.functional as F

    from srollout.default_policy.sft import shared_prefix_len

    n_pre = shared_prefix_len(examples)

    act_sum = act_n = obs_sum = obs_n = 0.0
    for ex in examples:
        ids = torch.tensor([ex.token_ids])
        with torch.no_grad():
            logits = model(ids).logits[0, :-1].float()
        ce = F.cross_entropy(logits, ids[0, 1:], reduction="none")
        loss = torch.tensor(ex.loss_mask[1:])
        obs = (
            ~torch.tensor(ex.action_mask[1:])
            if ex.obs_mask is None
            else torch.tensor(ex.obs_mask[1:])
        )
        obs[:n_pre] = False  # targets 1..n_pre: the system prefix
        act_sum += float(ce[loss].sum())
        act_n += int(loss.sum())
        obs_sum += float(ce[obs].sum())
        obs_n += int(obs.sum())
    return act_sum / act_n + obs_w * obs_sum / obs_n


@pytest.mark.parametrize("obs_w", [0.0, 0.5])
def test_sft_loss_is_action_ce_plus_weighted_observation_ce(obs_w):
    # lr 0: one batch holding every example; the loss sft reports must equal the reference
    # computed without the shared-prefix cache; noise actions are in neither term
    from srollout.default_policy.sft import sft

    cfg, tok, examples, model = _setup("compact")
    cfg = dataclasses.replace(cfg, obs_loss_weight=obs_w)
    seen = []
    model.train()
    sft(model, examples, cfg, tok.pad_token_id, lambda s, t, loss: seen.append(loss))
    assert len(seen) == 1
    assert seen[0] == pytest.approx(_reference(model.eval(), examples, obs_w), rel=1e-4)
    noise_tokens = sum(
        a and not m for ex in examples for a, m in zip(ex.action_mask, ex.loss_mask, strict=True)
    )
    assert noise_tokens > 0  # the synthetic demos do hold noise turns


def test_sft_refuses_a_model_whose_head_it_cannot_split_in_one_line():
    from transformers import GPT2Config, GPT2LMHeadModel

    from srollout.default_policy.sft import sft
    from srollout.errors import SrolloutError

    cfg, tok, examples, _ = _setup("compact")
    gpt2 = GPT2LMHeadModel(GPT2Config(vocab_size=cfg.vocab_size, n_embd=16, n_layer=1, n_head=2))
    with pytest.raises(SrolloutError, match=r"^sft: GPT2LMHeadModel has no lm_head over a body"):
        sft(gpt2, examples, cfg, tok.pad_token_id)


def test_an_obs_mask_keeps_its_examples_observations_out_of_the_loss():
    # a DAgger branch teaches its last action only: obs_mask all False on two of the six
    # examples; the reported loss must be the reference that skips their observation tokens,
    # which differs from the one that counts them
    from srollout.default_policy.sft import sft

    cfg, tok, examples, model = _setup("compact")
    cfg = dataclasses.replace(cfg, obs_loss_weight=0.5)
    masked = [
        ex._replace(obs_mask=[False] * len(ex.token_ids)) if i < 2 else ex
        for i, ex in enumerate(examples)
    ]
    seen = []
    model.train()
    sft(model, masked, cfg, tok.pad_token_id, lambda s, t, loss: seen.append(loss))
    want, unmasked = _reference(model.eval(), masked, 0.5), _reference(model, examples, 0.5)
    # measured: sft is 2e-7 off the masked reference, the two references 1.2e-3 apart
    assert abs(seen[0] - want) < 1e-5 < 1e-4 < abs(unmasked - want)


def test_observation_loss_changes_the_update():
    from srollout.default_policy.sft import sft

    finals = []
    for obs_w in (0.0, 0.5):
        cfg, tok, examples, model = _setup("compact")
        cfg = dataclasses.replace(cfg, obs_loss_weight=obs_w, lr=1e-2, epochs=2)
        sft(model, examples, cfg, tok.pad_token_id)
        finals.append(_reference(model, examples, 0.0))
    assert finals[0] != pytest.approx(finals[1], rel=1e-3)


def test_bf16_only_where_the_cpu_has_it_and_the_cache_key_follows(monkeypatch, tmp_path):
    from srollout.default_policy import build as dm
    from srollout.default_policy.recipe import BuildConfig

    monkeypatch.setenv("SROLLOUT_HOME", str(tmp_path))
    cfg = BuildConfig()
    assert cfg.bf16
    monkeypatch.setattr(dm, "native_bf16", lambda: True)
    native = dm.default_policy_dir(cfg)
    assert dm.effective_config(cfg) is cfg
    assert native.name == f"default-{dm.BUILD_VERSION}-{dm.config_hash(cfg)}"
    monkeypatch.setattr(dm, "native_bf16", lambda: False)
    fallback = dm.effective_config(cfg)
    assert not fallback.bf16 and dataclasses.replace(fallback, bf16=True) == cfg
    # an fp32-trained model gets its own directory: the same as asking for fp32 outright
    assert dm.default_policy_dir(cfg) != native
    assert dm.default_policy_dir(cfg) == dm.default_policy_dir(dataclasses.replace(cfg, bf16=False))


def test_options_added_since_v5_keep_the_v5_cache_key_until_they_change_the_build():
    # the two v5 builds measured in docs/benchmarks.md: bf16 5f0694242274, fp32 528086900d8d;
    # the demonstrations of the default config are those v5 trained on (checked episode for episode)
    from srollout.default_policy.build import BUILD_VERSION, config_hash
    from srollout.default_policy.recipe import BuildConfig

    cfg = BuildConfig()
    assert BUILD_VERSION == "v5"
    assert config_hash(cfg) == "5f0694242274"
    assert config_hash(dataclasses.replace(cfg, bf16=False)) == "528086900d8d"
    # a rounds setting without rounds changes nothing; anything that changes the build does
    assert config_hash(dataclasses.replace(cfg, correction_tasks=10)) == "5f0694242274"
    changed = [
        dataclasses.replace(cfg, **kw)
        for kw in (
            {"take": "greedy"},
            {"thoughts": "react"},
            {"correction_rounds": 1},
            {"user_template": "Observation: {observation}\nTask: {task}."},
            {"epochs": 2},
        )
    ]
    hashes = {config_hash(c) for c in changed}
    assert len(hashes) == len(changed) and "5f0694242274" not in hashes
    # the q3 recipe build of 2026-11-25 (docs/benchmarks.md) keeps its key after correction_relabel
    # came in off; turned on it names another model
    q3 = dataclasses.replace(
        cfg,
        take="greedy",
        max_context=8192,
        epochs=3,
        correction_rounds=2,
        user_template="Observation: {observation}\nTask: {task}.\nActions: {actions}.",
    )
    assert config_hash(q3) == "87812bf28342"
    assert config_hash(dataclasses.replace(q3, correction_relabel=True)) not in {
        "87812bf28342",
        *hashes,
    }


def test_round_examples_cut_the_won_and_drop_a_branch_too_long_to_keep_its_label():
    from tiny_policy import synthetic_demos

    from srollout.default_policy.build import round_examples
    from srollout.default_policy.dagger import relabel_branches
    from srollout.policy.chat import IM_END, tokenize_chat

    _, tok, _, _ = _setup("compact")
    d = synthetic_demos(1, seed=5)[0]
    im_end = tok.convert_tokens_to_ids(IM_END)
    full = tokenize_chat(tok, d.system, d.turns, im_end)
    short, long_ = relabel_branches(
        d.turns, [(1, "Action: look"), (len(d.turns) - 1, "Action: look")]
    )
    n_short = len(tokenize_chat(tok, d.system, short, im_end).token_ids)
    limit = n_short + 1
    assert (
        len(full.token_ids) > limit
        and len(tokenize_chat(tok, d.system, long_, im_end).token_ids) > limit
    )
    won, branch = round_examples(
        tok, [(d.system, d.turns)], [(d.system, short), (d.system, long_)], limit
    )
    # the won conversation is cut to the limit with the observation loss on; the short branch is
    # whole, trains only its last response and no observation; the long one is gone
    assert won.token_ids == full.token_ids[:limit] and won.obs_mask is None
    assert len(branch.token_ids) == n_short and branch.obs_mask == [False] * n_short
    last = tokenize_chat(tok, d.system, short, im_end)
    assert (
        branch.loss_mask == last.loss_mask
        and sum(branch.loss_mask)
        == len(tok("Action: look", add_special_tokens=False)["input_ids"]) + 1
    )
