"""The default policy's model half: its byte-level BPE tokenizer, the small Qwen2 it trains, and
the supervised fine-tuning loop (:func:`sft`) over tokenized demonstrations, which
:mod:`srollout.default_policy.build` makes, driving a build through these."""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from srollout.default_policy.recipe import BuildConfig
from srollout.errors import SrolloutError
from srollout.policy.chat import (
    CHAT_TEMPLATES,
    END_OF_TEXT,
    IM_END,
    IM_START,
    ROLE_TOKENS,
    TokenizedChat,
)

QWEN2_PRETOKENIZE_REGEX = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|"""
    r""" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
)


def train_tokenizer(texts: Iterable[str], vocab_size: int, template: str = "chatml") -> Any:
    """A byte-level BPE ``PreTrainedTokenizerFast`` trained on ``texts``, with special tokens
    <|endoftext|> (pad), <|im_start|>, <|im_end|> (EOS) and the role tokens of the compact
    template, and the chat template ``template`` (``chatml`` or ``compact``)."""
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    # Exactly Qwen2's normalizer and pre-tokenizer: transformers 5 loads a qwen2 model's
    # tokenizer as Qwen2Tokenizer, which re-applies them, so any other choice would make the
    # loaded tokenizer split text differently from the one the SFT data was made with.
    tok = Tokenizer(models.BPE(unk_token=None, fuse_unk=False, byte_fallback=False))
    tok.normalizer = normalizers.NFC()
    split = pre_tokenizers.Split(Regex(QWEN2_PRETOKENIZE_REGEX), behavior="isolated", invert=False)
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.pre_tokenizer = pre_tokenizers.Sequence([split, byte_level])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[END_OF_TEXT, IM_START, IM_END, *ROLE_TOKENS.values()],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        min_frequency=2,
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token=IM_END,
        pad_token=END_OF_TEXT,
        unk_token=None,
        chat_template=CHAT_TEMPLATES[template],
        model_max_length=1 << 16,
        clean_up_tokenization_spaces=False,
    )


def make_model(tokenizer: Any, cfg: BuildConfig) -> Any:
    """A freshly initialised Qwen2ForCausalLM sized by ``cfg`` (seeded by ``cfg.seed``)."""
    import torch
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    im_end, eot = tokenizer.convert_tokens_to_ids([IM_END, END_OF_TEXT])
    heads = max(1, cfg.d_model // cfg.head_dim)
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=cfg.d_model,
        intermediate_size=cfg.d_ff,
        num_hidden_layers=cfg.n_layers,
        num_attention_heads=heads,
        num_key_value_heads=max(1, heads // cfg.gqa_groups),
        max_position_embeddings=cfg.max_context,
        rope_theta=10000.0,
        tie_word_embeddings=True,
        bos_token_id=eot,
        eos_token_id=im_end,
        pad_token_id=eot,
        use_cache=True,
    )
    torch.manual_seed(cfg.seed)
    model = Qwen2ForCausalLM(config)
    model.generation_config = GenerationConfig(
        bos_token_id=eot,
        eos_token_id=[im_end, eot],
        pad_token_id=eot,
        do_sample=True,
        temperature=0.7,
        top_p=1.0,
    )
    return model


# --- step 4: SFT ------------------------------------------------------------------------------
def make_batches(
    examples: Sequence[TokenizedChat], max_tokens: int, seed: int, epoch: int
) -> list[list[int]]:
    """Length-bucketed batches of example indices, each with ≤ ``max_tokens`` padded tokens,
    shuffled deterministically per (seed, epoch)."""
    rng = random.Random(seed * 1_000_003 + epoch)
    order = sorted(range(len(examples)), key=lambda i: (len(examples[i].token_ids), rng.random()))
    batches: list[list[int]] = []
    cur: list[int] = []
    for i in order:
        longest = len(examples[i].token_ids)  # ``order`` is by length: no earlier one is longer
        if cur and longest * (len(cur) + 1) > max_tokens:
            batches.append(cur)
            cur = []
        cur.append(i)
    if cur:
        batches.append(cur)
    rng.shuffle(batches)
    return batches


def shared_prefix_len(examples: Sequence[TokenizedChat]) -> int:
    """Length of the token prefix every example shares (the system turn), stopped before the
    first action token of any example."""
    first = examples[0].token_ids
    n = min(len(e.token_ids) for e in examples)
    for e in examples:
        # keep >= 1 non-action token after the prefix: the prefix's own last position is not scored
        n = min(n, e.action_mask.index(True) - 1 if True in e.action_mask else len(e.action_mask))
        k = 0
        while k < n and e.token_ids[k] == first[k]:
            k += 1
        n = k
    return n


def sft(
    model: Any,
    examples: Sequence[TokenizedChat],
    cfg: BuildConfig,
    pad_id: int,
    on_step: Callable[[int, int, float], None] | None = None,
    *,
    resume: tuple[int, Any] | None = None,
    checkpoint: Callable[[int, Any], None] | None = None,
) -> float:
    """Teacher-forced next-token loss on the loss-masked (assistant, non-noise) tokens, plus
    ``cfg.obs_loss_weight`` × the mean loss on the observation tokens (everything but actions,
    after the shared system prefix) when that weight is > 0; the head runs on the scored tokens
    alone (:func:`~srollout.training.loss.head_split`). The prefix all examples share (the system
    turn, which carries no loss) is encoded once per step without gradient and given to the batch
    as ``past_key_values``. AdamW, linear warm-up then cosine decay to 10 % of ``cfg.lr``; bf16
    autocast if ``cfg.bf16``. Returns the mean loss of the last epoch; calls ``on_step(step,
    total, loss)``. Resumable: ``checkpoint(step, optimizer)`` is called after every step (it
    decides whether to save); ``resume=(step, optimizer_state)`` skips the first ``step`` batches
    of the (seeded, hence identical) plan and continues with that optimizer state."""
    import torch
    import torch.nn.functional as F
    from transformers import DynamicCache

    from srollout.training.loss import head_split

    if (split := head_split(model)) is None:
        raise SrolloutError(f"sft: {type(model).__name__} has no lm_head over a body to split")
    body, head = split
    torch.manual_seed(cfg.seed)
    obs_w = cfg.obs_loss_weight
    n_pre = shared_prefix_len(examples)
    prefix = torch.tensor([examples[0].token_ids[:n_pre]], dtype=torch.long)
    rest = [slice_chat(e, n_pre, None) for e in examples]
    plan = [make_batches(rest, cfg.batch_tokens, cfg.seed, e) for e in range(cfg.epochs)]
    total = sum(len(p) for p in plan)
    warmup = max(1, int(0.05 * total))
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=0.01, betas=(0.9, 0.95))
    done = 0
    if resume is not None:
        done, state = resume
        opt.load_state_dict(state)

    def lr_at(step: int) -> float:
        if step < warmup:
            return cfg.lr * (step + 1) / warmup
        frac = (step - warmup) / max(1, total - warmup)
        return cfg.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))

    model.train()
    step, last_epoch_loss = 0, float("nan")
    for batches in plan:
        loss_sum, loss_n = 0.0, 0
        for batch in batches:
            if step < done:  # already trained before the restart
                step += 1
                continue
            rows = len(batch)
            length = max(len(rest[i].token_ids) for i in batch)
            ids = torch.full((rows, length), pad_id, dtype=torch.long)
            att = torch.zeros((rows, n_pre + length), dtype=torch.long)
            att[:, :n_pre] = 1
            # label of position j is token j+1; the prefix's last position predicts ids[:, 0]
            # (never an action token: the prefix stops before any)
            target = torch.full((rows, length), -100, dtype=torch.long)
            obs_target = torch.zeros((rows, length), dtype=torch.bool)
            for r, i in enumerate(batch):
                ex = rest[i]
                n = len(ex.token_ids)
                ids[r, :n] = torch.tensor(ex.token_ids)
                att[r, n_pre : n_pre + n] = 1
                obs = torch.zeros(n, dtype=torch.bool)
                if obs_w > 0:  # everything but the actions, unless the example says otherwise
                    obs[:] = torch.tensor(
                        [not a for a in ex.action_mask] if ex.obs_mask is None else ex.obs_mask
                    )
                scored = torch.tensor(ex.loss_mask) | obs
                target[r, : n - 1] = torch.where(scored[1:], ids[r, 1:n], -100)
                obs_target[r, : n - 1] = obs[1:]
            for g in opt.param_groups:
                g["lr"] = lr_at(step)
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=cfg.bf16):
                cache = None
                if n_pre:
                    with torch.no_grad():
                        pre = body(input_ids=prefix, use_cache=True).past_key_values
                    per_row = [  # each layer's prefix keys and values, one copy per row
                        tuple(t.expand(rows, -1, -1, -1).contiguous() for t in (c.keys, c.values))
                        for c in pre.layers
                    ]
                    cache = DynamicCache(ddp_cache_data=per_row)
                pos = torch.arange(n_pre, n_pre + length).unsqueeze(0).expand(rows, -1)
                hidden = body(
                    input_ids=ids,
                    attention_mask=att,
                    position_ids=pos,
                    past_key_values=cache,
                    use_cache=cache is not None,
                ).last_hidden_state
                keep = target != -100
                logits = head(hidden[keep])  # only where there is a loss: [n_loss, V]
            ce = F.cross_entropy(logits.float(), target[keep], reduction="none")
            on_obs = obs_target[keep]
            loss = ce[~on_obs].mean() if bool((~on_obs).any()) else ce.sum() * 0.0
            if obs_w > 0 and bool(on_obs.any()):
                loss = loss + obs_w * ce[on_obs].mean()
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            loss_sum += float(loss.detach())
            loss_n += 1
            step += 1
            if on_step:
                on_step(step, total, float(loss.detach()))
            if checkpoint:
                checkpoint(step, opt)
        last_epoch_loss = loss_sum / max(1, loss_n)
    model.eval()
    return last_epoch_loss


def slice_chat(ex: TokenizedChat, start: int, stop: int | None) -> TokenizedChat:
    """``ex[start:stop]``, every mask alike."""
    obs = None if ex.obs_mask is None else ex.obs_mask[start:stop]
    return TokenizedChat(
        ex.token_ids[start:stop], ex.action_mask[start:stop], ex.loss_mask[start:stop], obs
    )
