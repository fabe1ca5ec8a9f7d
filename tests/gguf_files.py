"""Tiny GGUF files written with gguf's own writer: a 1-layer Llama with random weights and a
byte-level BPE tokenizer with ChatML specials, for the GGUF loader's tests (no wheel needed)."""

from __future__ import annotations

from pathlib import Path

CHATML = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] "
    "+ '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\n' }}{% endif %}"
)
HIDDEN, FF, HEADS, KV_HEADS, LAYERS = 64, 128, 2, 1, 1


def byte_tokens() -> list[str]:
    """GPT-2's byte-to-unicode alphabet: one token per byte, so any text tokenizes."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    chars, extra = [], 0
    for b in range(256):
        if b in keep:
            chars.append(chr(b))
        else:
            chars.append(chr(256 + extra))
            extra += 1
    return chars


def write_tiny_llama(
    path: Path, *, arch: str = "llama", seed: int = 0, tensor_type: str = "F32", context: int = 256
) -> Path:
    """A GGUF file of a 1-layer Llama (hidden 64) with random weights; ``tensor_type`` is the
    ggml type of the FFN weights (``F32``, ``Q8_0``, or e.g. ``I8`` for a type no loader reads);
    ``context``: its context length in tokens."""
    import gguf
    import numpy as np

    rng = np.random.default_rng(seed)
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    merges = ["Ġ t", "h e", "Ġt he"]  # a few, so the BPE has merges to read
    tokens = specials + byte_tokens() + ["Ġt", "he", "Ġthe"]
    vocab = len(tokens)
    w = gguf.GGUFWriter(str(path), arch)
    w.add_name("tiny-llama")
    w.add_block_count(LAYERS)
    w.add_context_length(context)
    w.add_embedding_length(HIDDEN)
    w.add_feed_forward_length(FF)
    w.add_head_count(HEADS)
    w.add_head_count_kv(KV_HEADS)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(vocab)
    w.add_rope_dimension_count(HIDDEN // HEADS)
    w.add_file_type(0)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_types([3] * len(specials) + [1] * (vocab - len(specials)))
    w.add_token_merges(merges)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_pad_token_id(0)
    w.add_add_bos_token(False)
    w.add_chat_template(CHATML)

    def rand(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) * 0.05).astype(np.float32)

    w.add_tensor("token_embd.weight", rand(vocab, HIDDEN))
    w.add_tensor("output_norm.weight", np.ones(HIDDEN, dtype=np.float32))
    head = HIDDEN // HEADS
    for i in range(LAYERS):
        p = f"blk.{i}."
        w.add_tensor(p + "attn_norm.weight", np.ones(HIDDEN, dtype=np.float32))
        w.add_tensor(p + "ffn_norm.weight", np.ones(HIDDEN, dtype=np.float32))
        w.add_tensor(p + "attn_q.weight", rand(HIDDEN, HIDDEN))
        w.add_tensor(p + "attn_k.weight", rand(KV_HEADS * head, HIDDEN))
        w.add_tensor(p + "attn_v.weight", rand(KV_HEADS * head, HIDDEN))
        w.add_tensor(p + "attn_output.weight", rand(HIDDEN, HIDDEN))
        for name, shape in (
            ("ffn_gate", (FF, HIDDEN)),
            ("ffn_up", (FF, HIDDEN)),
            ("ffn_down", (HIDDEN, FF)),
        ):
            data = rand(*shape)
            if tensor_type == "F32":
                w.add_tensor(p + name + ".weight", data)
            elif tensor_type == "I8":
                w.add_tensor(p + name + ".weight", (data * 100).astype(np.int8))
            else:
                qtype = gguf.GGMLQuantizationType[tensor_type]
                w.add_tensor(
                    p + name + ".weight", gguf.quants.quantize(data, qtype), raw_dtype=qtype
                )
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
