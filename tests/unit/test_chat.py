"""Incremental ChatML rendering, SFT tokenization masks and the sampler, with hand-written text."""

from __future__ import annotations

import pytest

from srollout.errors import SrolloutError
from srollout.policy.chat import (
    Turn,
    end_of_turn_ids,
    first_turn_text,
    next_turn_text,
    tokenize_chat,
)

pytest.importorskip("tokenizers")


@pytest.fixture(scope="module")
def tok():
    from srollout.default_policy.sft import train_tokenizer

    texts = [
        "user\nYou are in a room. Nothing happens.",
        "assistant\nThought: go.\nAction: go to desk 1",
    ] * 20
    return train_tokenizer(texts, vocab_size=300)


def test_first_turn_is_chatml_with_assistant_header(tok):
    assert first_turn_text(tok, "S", "U") == (
        "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nU<|im_end|>\n<|im_start|>assistant\n"
    )


def test_next_turn_drops_the_generated_end_of_turn(tok):
    # the model generated "<|im_end|>" itself: feed only the newline, then the new user turn
    got = next_turn_text(tok, "S", "U1", "A1", "U2", "<|im_end|>")
    assert got == "\n<|im_start|>user\nU2<|im_end|>\n<|im_start|>assistant\n"


def test_next_turn_injects_end_of_turn_when_the_model_was_cut(tok):
    # max_new_tokens hit: the end-of-turn token is injected (it is not the model's)
    got = next_turn_text(tok, "S", "U1", "A1", "U2", None)
    assert got == "<|im_end|>\n<|im_start|>user\nU2<|im_end|>\n<|im_start|>assistant\n"


def test_non_incremental_template_is_refused(tok):
    import copy

    bad = copy.deepcopy(tok)
    # renders only the last message: a longer chat does not start with the shorter one
    bad.chat_template = "{{ messages[-1]['content'] }}{% if add_generation_prompt %}>{% endif %}"
    with pytest.raises(SrolloutError, match="incrementally"):
        next_turn_text(bad, "S", "U1", "A1", "U2", None)


def test_missing_chat_template_is_a_user_error(tok):
    import copy

    bad = copy.deepcopy(tok)
    bad.chat_template = None
    with pytest.raises(SrolloutError, match="chat template"):
        first_turn_text(bad, "S", "U")


def test_end_of_turn_is_im_end_first(tok):
    ids = end_of_turn_ids(tok)
    assert tok.convert_ids_to_tokens(ids[0]) == "<|im_end|>"


def test_tokenize_chat_masks(tok):
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    turns = [
        Turn("You are in a room.", "Action: go to desk 1", True),
        Turn("Nothing happens.", "Action: go to desk 1", False),  # noise turn: no loss
    ]
    chat = tokenize_chat(tok, "S", turns, im_end)
    assert len(chat.token_ids) == len(chat.action_mask) == len(chat.loss_mask)
    # the text round-trips through the template
    assert tok.decode(chat.token_ids) == (
        "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nYou are in a room.<|im_end|>\n"
        "<|im_start|>assistant\nAction: go to desk 1<|im_end|>\n<|im_start|>user\nNothing happens."
        "<|im_end|>\n<|im_start|>assistant\nAction: go to desk 1<|im_end|>"
    )
    # two runs of action tokens, each = response + <|im_end|>; loss only on the first
    runs, cur = [], []
    for i, m in enumerate(chat.action_mask):
        if m:
            cur.append(i)
        elif cur:
            runs.append(cur)
            cur = []
    runs.append(cur)
    assert len(runs) == 2
    for r in runs:
        assert tok.decode([chat.token_ids[i] for i in r]) == "Action: go to desk 1<|im_end|>"
    assert all(chat.loss_mask[i] for i in runs[0])
    assert not any(chat.loss_mask[i] for i in runs[1])
    assert sum(chat.loss_mask) == len(runs[0])
    # no observation token is ever an action token
    assert all(not chat.action_mask[i] for i in range(runs[0][0]))


def test_sampler_greedy_top_p_and_seed():
    import torch

    from srollout.policy.transformers_backend import sample_next

    logits = torch.tensor([0.0, 2.0, 1.0, -1.0])
    assert sample_next(logits, 0.0, 1.0, None) == 1
    g = torch.Generator().manual_seed(0)
    # top-p 0.5: softmax mass of token 1 alone is e^2/(1+e^2+e+1/e) = 0.64 > 0.5, so only token 1
    # survives
    assert {sample_next(logits, 1.0, 0.5, g) for _ in range(50)} == {1}
    a = [sample_next(logits, 1.0, 1.0, torch.Generator().manual_seed(7)) for _ in range(3)]
    g1, g2 = torch.Generator().manual_seed(7), torch.Generator().manual_seed(7)
    s1 = [sample_next(logits, 1.0, 1.0, g1) for _ in range(40)]
    s2 = [sample_next(logits, 1.0, 1.0, g2) for _ in range(40)]
    assert s1 == s2 and len(set(a)) == 1
    assert len(set(s1)) >= 3  # temperature 1 really samples


def test_demonstration_responses_keep_only_the_action_unless_thoughts_are_asked_for():
    from srollout.default_policy.dagger import demo_response as _response

    expert = (
        "Thought: I need to find the mug. Not checked: desk 1, shelf 2. I will check desk "
        "1.\nAction: go to desk 1"
    )
    assert _response(expert, thoughts="none") == "Action: go to desk 1"
    assert _response(expert, thoughts="react") == expert
    pad = "Thought: Find mug. Unchecked: desk 1, shelf 2.\nAction: go to desk 1"
    assert _response(pad, thoughts="scratchpad") == pad
    # the engine's dialect survives (normalised, as the parser returns it)
    assert (
        _response("Thought: put it.\nAction: move mug 1 to shelf 2", thoughts="none")
        == "Action: move mug 1 to shelf 2"
    )


@pytest.fixture(scope="module")
def compact_tok():
    from srollout.default_policy.sft import train_tokenizer

    texts = ["You are in a room. Nothing happens.", "Action: go to desk 1"] * 20
    return train_tokenizer(texts, vocab_size=300, template="compact")


def test_compact_template_spends_one_token_per_role(compact_tok):
    tok = compact_tok
    assert first_turn_text(tok, "S", "U") == "<|system|>S<|im_end|><|user|>U<|im_end|><|assistant|>"
    # the model generated <|im_end|> itself: the next turn is only the user turn and the header
    assert (
        next_turn_text(tok, "S", "U1", "A1", "U2", "<|im_end|>")
        == "<|user|>U2<|im_end|><|assistant|>"
    )
    assert (
        next_turn_text(tok, "S", "U1", "A1", "U2", None)
        == "<|im_end|><|user|>U2<|im_end|><|assistant|>"
    )
    for role in ("<|system|>", "<|user|>", "<|assistant|>", "<|im_end|>"):
        assert len(tok(role, add_special_tokens=False)["input_ids"]) == 1
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    chat = tokenize_chat(
        tok, "S", [Turn("U1", "Action: go to desk 1"), Turn("U2", "Action: look")], im_end
    )
    assert tok.decode(chat.token_ids) == (
        "<|system|>S<|im_end|><|user|>U1<|im_end|><|assistant|>Action: go to desk 1<|im_end|>"
        "<|user|>U2<|im_end|><|assistant|>Action: look<|im_end|>"
    )
    # template tokens around the two turns: system (2) + per turn user (2) + header (1) + S, U1, U2
    n_template = sum(
        1
        for i in chat.token_ids
        if tok.convert_ids_to_tokens(i) in ("<|system|>", "<|user|>", "<|assistant|>", "<|im_end|>")
    )
    assert n_template == 2 + 2 * (2 + 1) + 2  # + the 2 generated <|im_end|>
