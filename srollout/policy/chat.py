"""Render a multi-turn chat into token ids turn by turn, the way the policy sees it.

A stateful backend never re-tokenizes the conversation: at step 1 it feeds the tokens of
``[system, user_1]`` plus the assistant header; at step t > 1 it feeds only the *delta* — the
end of the previous assistant turn (what the chat template puts after the content, minus the
end-of-turn token the model already generated), the new user turn and the next assistant header.
The SFT data of the default policy is tokenized with the same functions, so training sequences
and inference sequences agree token for token.

Any Hugging Face chat template works as long as rendering is incremental (rendering a longer
conversation starts with the rendering of the shorter one), which holds for Qwen/ChatML-style
templates; otherwise :class:`SrolloutError` names the problem.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NamedTuple

from srollout.errors import SrolloutError
from srollout.policy.base import TrajectoryTokens

# ChatML, as Qwen2 uses it, without Qwen's default system prompt (srollout always sends one).
CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
# The default policy's own template: one special token per role, no role names or newlines to
# spend tokens on (2 template tokens per message instead of ChatML's ~5). Still incremental.
ROLE_TOKENS = {"system": "<|system|>", "user": "<|user|>", "assistant": "<|assistant|>"}
COMPACT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|' + message['role'] + '|>' + message['content'] + '<|im_end|>' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>' }}{% endif %}"
)
CHAT_TEMPLATES = {"chatml": CHATML_TEMPLATE, "compact": COMPACT_TEMPLATE}
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
END_OF_TEXT = "<|endoftext|>"


class Turn(NamedTuple):
    """One step of a conversation as the SFT data holds it.

    user: the user turn (observation, ReAct-formatted).
    assistant: the assistant's response text (without the end-of-turn token).
    trained: whether the response's tokens carry loss (False for injected noise actions).
    """

    user: str
    assistant: str
    trained: bool = True


class TokenizedChat(NamedTuple):
    """token_ids: [L] ints; action_mask: [L] bools, True on the assistant's tokens and its
    end-of-turn token; loss_mask: [L] bools, action_mask restricted to trained turns;
    obs_mask: [L] bools, the environment tokens an observation loss may train (None: every
    token off the action mask)."""

    token_ids: list[int]
    action_mask: list[bool]
    loss_mask: list[bool]
    obs_mask: list[bool] | None = None


def _render(tokenizer: Any, messages: list[dict[str, str]], generation_prompt: bool) -> str:
    return tokenizer.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=generation_prompt
    )


def encode_text(tokenizer: Any, text: str) -> list[int]:
    """Token ids of ``text`` with special tokens parsed but none added (no BOS)."""
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def end_of_turn_ids(tokenizer: Any, generation_config: Any = None) -> tuple[int, ...]:
    """Token ids that end an assistant turn: ``<|im_end|>`` if the vocabulary has it, the
    tokenizer's EOS and the generation config's ``eos_token_id`` (int or list)."""
    ids: list[int] = []
    im_end = tokenizer.convert_tokens_to_ids(IM_END) if IM_END in tokenizer.get_vocab() else None
    if im_end is not None:
        ids.append(int(im_end))
    if tokenizer.eos_token_id is not None:
        ids.append(int(tokenizer.eos_token_id))
    eos = getattr(generation_config, "eos_token_id", None) if generation_config else None
    if isinstance(eos, int):
        ids.append(eos)
    elif eos:
        ids.extend(int(e) for e in eos)
    out = tuple(dict.fromkeys(ids))
    if not out:
        raise SrolloutError("the tokenizer has no end-of-turn token (no <|im_end|> and no EOS)")
    return out


def first_turn_text(tokenizer: Any, system: str, user: str) -> str:
    """Text fed at step 1: system + first user turn + the assistant header."""
    if getattr(tokenizer, "chat_template", None) is None:
        raise SrolloutError(
            f"the tokenizer of {getattr(tokenizer, 'name_or_path', 'the model')} has no chat "
            "template; use a chat/instruct model or add `chat_template` to tokenizer_config.json"
        )
    return _render(
        tokenizer, [{"role": "system", "content": system}, {"role": "user", "content": user}], True
    )


def next_turn_text(
    tokenizer: Any,
    system: str,
    prev_user: str,
    prev_assistant: str,
    user: str,
    generated_end: str | None,
) -> str:
    """The delta (module docstring) fed at step t > 1, after the model produced
    ``prev_assistant`` and ``generated_end`` (its end-of-turn text, if any). Only a 3-message
    window is rendered: the delta of an incremental template does not depend on older turns,
    and this keeps each turn O(1)."""
    window = [{"role": "system", "content": system}, {"role": "user", "content": prev_user}]
    prompt = _render(tokenizer, window, True)
    window.append({"role": "assistant", "content": prev_assistant})
    full = _render(tokenizer, window, False)
    window.append({"role": "user", "content": user})
    nxt = _render(tokenizer, window, True)
    if not full.startswith(prompt + prev_assistant) or not nxt.startswith(full):
        raise SrolloutError(
            "the model's chat template does not render turns incrementally (a longer "
            "conversation must start with the rendering of the shorter one); use a ChatML/Qwen-"
            "style template"
        )
    tail = full[len(prompt) + len(prev_assistant) :]
    if generated_end and tail.startswith(generated_end):
        tail = tail[len(generated_end) :]
    return tail + nxt[len(full) :]


def tokenize_chat(
    tokenizer: Any, system: str, turns: list[Turn], end_of_turn_id: int
) -> TokenizedChat:
    """Tokenize a whole conversation exactly as the backend feeds and generates it.

    Each assistant response is ``encode(text) + [end_of_turn_id]`` (what the model must
    generate); the rest comes from :func:`first_turn_text` / :func:`next_turn_text`.
    Returns [L] token ids with the action mask and the loss mask (noise turns untrained).
    """
    end_text = tokenizer.decode([end_of_turn_id], skip_special_tokens=False)
    ids: list[int] = []
    action: list[bool] = []
    loss: list[bool] = []
    for t, turn in enumerate(turns):
        if t == 0:
            text = first_turn_text(tokenizer, system, turn.user)
        else:
            prev = turns[t - 1]
            text = next_turn_text(tokenizer, system, prev.user, prev.assistant, turn.user, end_text)
        fed = encode_text(tokenizer, text)
        ids += fed
        action += [False] * len(fed)
        loss += [False] * len(fed)
        gen = encode_text(tokenizer, turn.assistant) + [end_of_turn_id]
        ids += gen
        action += [True] * len(gen)
        loss += [turn.trained] * len(gen)
    return TokenizedChat(ids, action, loss)


@dataclass
class Conversation:
    """One trajectory's token sequence between ``act`` calls, as every backend keeps it (never
    re-tokenized: what is recorded is what the model saw): ``token_ids`` / ``action_mask`` [L],
    and what the next turn's template needs (last user text, response content, end-of-turn)."""

    system: str
    token_ids: list[int] = field(default_factory=list)
    action_mask: list[bool] = field(default_factory=list)
    last_user: str = ""
    last_text: str = ""
    last_end: str | None = None

    def turn_ids(self, tokenizer: Any, user: str) -> list[int]:
        """The tokens injected for the turn with ``user``: the system and first user message on
        an empty conversation, else the close of the last response and the new user message."""
        if not self.token_ids:
            return encode_text(tokenizer, first_turn_text(tokenizer, self.system, user))
        text = next_turn_text(
            tokenizer, self.system, self.last_user, self.last_text, user, self.last_end
        )
        return encode_text(tokenizer, text)

    def add_turn(self, tokenizer: Any, user: str) -> list[int]:
        """Append the turn with ``user`` (:meth:`turn_ids`); return its tokens."""
        new = self.turn_ids(tokenizer, user)
        self.token_ids += new
        self.action_mask += [False] * len(new)
        self.last_user = user
        return new

    def add_response(
        self, tokenizer: Any, tokens: list[int], eot: frozenset[int], text: str | None = None
    ) -> str:
        """Append a response's ``tokens`` (an end-of-turn id in ``eot`` last, if the turn ended)
        as action tokens; ``text``: its content for the next turn's template (default: the
        tokens without the end-of-turn id, decoded). Returns that text."""
        ended = bool(tokens) and tokens[-1] in eot
        if text is None:
            text = tokenizer.decode(tokens[:-1] if ended else tokens, skip_special_tokens=True)
        self.token_ids += tokens
        self.action_mask += [True] * len(tokens)
        self.last_text = text
        self.last_end = tokenizer.decode(tokens[-1:], skip_special_tokens=False) if ended else None
        return text

    def tokens(self) -> TrajectoryTokens:
        return TrajectoryTokens(token_ids=list(self.token_ids), action_mask=list(self.action_mask))
