"""The transformers backend: batched, seeded generation with the KV cache kept across turns.

One ``act()`` call generates one response for every live trajectory it is given, in one padded
batch. Each trajectory keeps its own compact KV cache (only its real tokens, no padding) between
calls; at step t it feeds only the new tokens (end of the previous assistant turn, the new user
turn, the assistant header), so a 30-step conversation is never re-encoded. The batch layout of
one call, per row i with P_i cached tokens and N_i new ones::

    [ pad x (Pmax - P_i) | past_i (P_i) | new_i (N_i) | pad x (Nmax - N_i) | generated ... ]

with an explicit attention mask (0 on pads) and explicit position_ids (0..P_i+N_i-1, then one
per generated token), so every row computes what it would compute alone. Pads are never queried
before a real token of the same row, so no softmax row is fully masked.

Ragged decoding: a row whose response ends (end-of-turn token, or max_new_tokens) leaves the
decode batch at once: its compact cache is stored and the last live row is moved into its
slot, so the next decode steps run on the live rows only (a prefix view of the buffers). A call
therefore costs one row-forward per generated token (``decode_rows`` counts them), not rows x
the longest response; the gate's token saving becomes a wall-clock saving.

Sampling uses one ``torch.Generator`` per trajectory, seeded from ``ActRequest.seed`` at step 1,
so a trajectory's tokens do not depend on which rows share the batch (up to float round-off of
different padded shapes; ``benchmarks/bench_policy.py`` measures how often that flips a token).
"""

from __future__ import annotations

import functools
import inspect
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from srollout.errors import SrolloutError, one_line
from srollout.policy.attention import use_packed_attention
from srollout.policy.base import ActRequest, ActResponse, TrajectoryTokens, TrajKey, logprob_summary
from srollout.policy.chat import Conversation, encode_text, end_of_turn_ids, first_turn_text
from srollout.policy.model_files import model_dtype


@dataclass
class _TrajState(Conversation):
    """A trajectory's conversation with its sampling generator and KV cache between calls.

    cache: per layer (keys, values), each [1, n_kv_heads, L_c, head_dim], L_c = L - len(pending).
    pending: recorded tokens not yet fed to the model (the last generated token).
    """

    generator: Any = None
    cache: list[tuple[Any, Any]] | None = None
    pending: list[int] = field(default_factory=list)


def sample_next(logits: Any, temperature: float, top_p: float, generator: Any) -> int:
    """One token from ``logits`` [V] (float32): greedy at temperature 0, else softmax(logits/T)
    restricted to the smallest top-p nucleus, drawn with the trajectory's own generator."""
    import torch

    if temperature <= 0.0:
        return int(torch.argmax(logits))
    probs = torch.softmax(logits.float() / temperature, dim=-1)
    if top_p < 1.0:
        sorted_p, order = torch.sort(probs, descending=True)
        cum = torch.cumsum(sorted_p, dim=-1)
        keep = cum - sorted_p < top_p  # keep a token while the mass before it is < top_p
        sorted_p = torch.where(keep, sorted_p, torch.zeros_like(sorted_p))
        probs = torch.zeros_like(probs).scatter(0, order, sorted_p)
    return int(torch.multinomial(probs, 1, generator=generator))


class TransformersPolicy:
    """A local Hugging Face causal LM (optionally with a peft LoRA adapter) as a :class:`Policy`.

    model_path: a directory with config.json, weights and a tokenizer with a chat template.
    adapter_path: a peft adapter directory, or None.
    temperature / top_p: sampling (temperature 0 = greedy).
    max_new_tokens: cap on one response's length (the end-of-turn token stops a row earlier).
    device: "cpu" or "cuda[:n]".
    kv_reuse: keep each trajectory's KV cache across turns (True) or re-encode the whole
        conversation every turn (False; for benchmarks and as a reference).
    max_batch_rows: rows per forward; larger ``act`` calls run in chunks of this size.
    bucket_ratio: rows are batched by context length: a row whose context (cached + new
        tokens) is shorter than ``bucket_ratio`` x the longest row of its batch goes to the next
        batch, so left padding wastes at most 1/bucket_ratio of a batch's attention and KV
        buffer (0, the default = one batch per max_batch_rows rows, in request order; on this
        project's CPU benchmarks 0.6 was not measurably faster, see docs/bench/engine_saving.md).
    """

    def __init__(
        self,
        model_path: str | Path,
        adapter_path: str | Path | None = None,
        *,
        temperature: float = 0.7,
        top_p: float = 1.0,
        max_new_tokens: int = 64,
        device: str = "cpu",
        kv_reuse: bool = True,
        max_batch_rows: int = 64,
        bucket_ratio: float = 0.0,
        dtype: str | None = None,
        model: Any = None,
        tokenizer: Any = None,
    ) -> None:
        import torch

        if temperature < 0:
            raise SrolloutError(f"temperature must be >= 0, got {temperature}")
        if not 0.0 < top_p <= 1.0:
            raise SrolloutError(f"top_p must be in (0, 1], got {top_p}")
        if max_new_tokens < 1:
            raise SrolloutError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
        self.model_path = Path(model_path)
        self.temperature = float(temperature)
        self.top_p = float(top_p)
        self.max_new_tokens = int(max_new_tokens)
        self.device = torch.device(device)
        self.kv_reuse = kv_reuse
        self.max_batch_rows = max(1, int(max_batch_rows))
        if not 0.0 <= bucket_ratio <= 1.0:
            raise SrolloutError(f"bucket_ratio must be in [0, 1], got {bucket_ratio}")
        self.bucket_ratio = float(bucket_ratio)
        self.dtype = dtype or model_dtype(model_path)  # float32, or bf16 where the model asks
        if model is None or tokenizer is None:
            model, tokenizer = load_model(model_path, adapter_path, device=device, dtype=self.dtype)
        # decode steps attend over the grouped KV heads as they are (no repeat_kv copy per step)
        use_packed_attention(model)
        self.model = model
        self.tokenizer = tokenizer
        # a prefill needs each row's last position's logits only: [rows, V], not [rows, n, V]
        base = model.get_base_model() if hasattr(model, "get_base_model") else model
        self._keep_arg = "logits_to_keep" in inspect.signature(base.forward).parameters
        self.name = f"transformers:{self.model_path.name}" + (
            f"+{Path(adapter_path).name}" if adapter_path else ""
        )
        self.eot_ids = end_of_turn_ids(tokenizer, getattr(model, "generation_config", None))
        self._eot_set = frozenset(self.eot_ids)
        self._pad_id = (
            tokenizer.pad_token_id if tokenizer.pad_token_id is not None else self.eot_ids[0]
        )
        cfg = model.config
        self.max_context = int(getattr(cfg, "max_position_embeddings", 1 << 30))
        self._states: dict[TrajKey, _TrajState] = {}
        self._prefixes: dict[str, tuple[list[int], list[tuple[Any, Any]]]] = {}
        self._prefix_version = -1
        # row-forwards run so far (a row counts once per forward it is in, prefill included):
        # equal to the tokens generated, since a row leaves the batch when its response ends
        self.decode_rows = 0

    # --- Policy protocol -------------------------------------------------------------------
    def act(self, requests: list[ActRequest]) -> list[ActResponse]:
        """One response per request, same order; rows generated together in length buckets."""
        feeds = [self._prepare(r) for r in requests]
        out: list[ActResponse | None] = [None] * len(requests)
        for rows in self._buckets(requests, feeds):
            responses = self._generate([requests[i].key for i in rows], [feeds[i] for i in rows])
            for i, resp in zip(rows, responses, strict=True):
                out[i] = resp
        return out  # type: ignore[return-value]

    def _buckets(self, requests: list[ActRequest], feeds: list[list[int]]) -> list[list[int]]:
        """Request indices in batches of similar context length (longest first; ``bucket_ratio``):
        in a pool that mixes groups at step 1 with groups at step 25, one padded batch would make
        every row attend over (and copy) the longest row's context."""
        if self.bucket_ratio <= 0.0:
            idx = list(range(len(requests)))
            return [
                idx[i : i + self.max_batch_rows] for i in range(0, len(idx), self.max_batch_rows)
            ]

        def context(i: int) -> int:
            state = self._states[requests[i].key]
            cached = (
                state.cache[0][0].shape[2] if (self.kv_reuse and state.cache is not None) else 0
            )
            return cached + len(feeds[i])

        lengths = {i: context(i) for i in range(len(requests))}
        buckets: list[list[int]] = []
        for i in sorted(lengths, key=lambda j: (-lengths[j], j)):
            head = buckets[-1][0] if buckets else None
            if (
                head is None
                or len(buckets[-1]) >= self.max_batch_rows
                or lengths[i] < self.bucket_ratio * lengths[head]
            ):
                buckets.append([i])
            else:
                buckets[-1].append(i)
        return buckets

    def finish(self, key: TrajKey) -> TrajectoryTokens | None:
        """End a trajectory: free its cache and return its tokens (None if never started)."""
        state = self._states.pop(key, None)
        return None if state is None else state.tokens()

    # --- beyond the protocol ---------------------------------------------------------------
    def force(self, request: ActRequest, text: str) -> None:
        """Record ``text`` as the trajectory's response to ``request`` without generating: the
        turn another policy played in its place (the default policy's self-correction rounds
        mix the model's turns with the expert's). Nothing runs now; the request's tokens and the
        response (with its end-of-turn token) are fed with the trajectory's next ``act``."""
        turn_ids = self._prepare(request)
        response_ids = encode_text(self.tokenizer, text) + [self.eot_ids[0]]
        self._record_response(request.key, response_ids, turn_ids + response_ids, text)

    @property
    def live(self) -> int:
        """Number of trajectories with state held."""
        return len(self._states)

    def load_adapter(self, adapter_path: str | Path) -> None:
        """Swap in a (new) peft adapter between rollouts (on-policy training): reloads the
        base model from ``model_path`` with that adapter. Live trajectories must be finished
        first, since their caches were computed with the old weights."""
        if self._states:
            raise SrolloutError(
                "cannot change the adapter while trajectories are live; finish them first"
            )
        self.model, _ = load_model(
            self.model_path, adapter_path, device=str(self.device), dtype=self.dtype
        )
        self._prefixes.clear()  # computed with the old weights
        self.name = f"transformers:{self.model_path.name}+{Path(adapter_path).name}"

    def _weights_version(self) -> int:
        """Sum of the parameters' in-place version counters (changes with every update)."""
        return sum(int(getattr(p, "_version", 0)) for p in self.model.parameters())

    def fits(self, request: ActRequest) -> bool:
        """Whether ``request``'s turn fits the model's context: the trajectory's tokens, this
        turn's injected tokens and ``max_new_tokens`` of response. :meth:`act` and :meth:`force`
        raise where this is False; this changes nothing."""
        state = self._states.get(request.key)
        if state is None or request.step == 1:
            state = _TrajState(request.system)
        n_turn = len(state.turn_ids(self.tokenizer, request.user))
        return self._within_context(len(state.token_ids) + n_turn)

    def _within_context(self, n_tokens: int) -> bool:
        """Whether ``n_tokens`` of trajectory plus ``max_new_tokens`` of response fit the
        context."""
        return n_tokens + self.max_new_tokens <= self.max_context

    # --- internals -------------------------------------------------------------------------
    def _prepare(self, req: ActRequest) -> list[int]:
        """Record this turn's new (injected) tokens and return all tokens to feed now."""
        import torch

        state = self._states.get(req.key)
        if state is None or req.step == 1:
            gen = torch.Generator(device="cpu")
            gen.manual_seed(int(req.seed) & 0xFFFF_FFFF_FFFF_FFFF)
            state = self._states[req.key] = _TrajState(req.system, generator=gen)
        new = state.add_turn(self.tokenizer, req.user)
        if not self._within_context(len(state.token_ids)):
            # checked before any forward: past the context the model would fail inside torch
            # (or silently extrapolate its positions)
            where = f"trajectory {req.key.group_id}/{req.key.traj_idx} at step {req.step}"
            if req.step <= 1:  # fewer steps cannot help: the first turn alone is too long
                raise SrolloutError(
                    f"{where}: the system prompt and the first observation are already "
                    f"{len(state.token_ids)} tokens, and with max_new_tokens "
                    f"{self.max_new_tokens} exceed the model's context of {self.max_context}: "
                    "the environment's first observation is too long for this model (an "
                    "observation should hold only the new text, docs/environments.md), or use "
                    "a model with a longer context"
                )
            raise SrolloutError(
                f"{where}: its {len(state.token_ids)} tokens + max_new_tokens "
                f"{self.max_new_tokens} exceed the model's context of {self.max_context} tokens; "
                "lower --T-max (or max_new_tokens), or use a model with a longer context"
            )
        if not self.kv_reuse:
            return list(state.token_ids)
        if state.cache is None and not state.pending:
            # step 1: start from the shared system-prompt cache when the tokens agree
            prefix_ids, prefix_kv = self._system_prefix(state.system)
            n = len(prefix_ids)
            if n and len(new) > n and new[:n] == prefix_ids:
                state.cache = prefix_kv
                return new[n:]
        fed = state.pending + new
        state.pending = []
        return fed

    def _system_prefix(self, system: str) -> tuple[list[int], list[tuple[Any, Any]]]:
        """Tokens of step 1 that do not depend on the user turn (the system turn), and their
        KV cache ([1, h, n, d] per layer), computed once per system prompt and shared by all
        trajectories (they only read it; compaction copies). ([], []) if there is none."""
        import torch

        # In-place weight updates (a GRPO step on a shared peft model, load_adapter_state) bump
        # the parameters' version counters: then the cached system KV is stale, drop it.
        version = self._weights_version()
        if version != self._prefix_version:
            self._prefixes.clear()
            self._prefix_version = version
        cached = self._prefixes.get(system)
        if cached is not None:
            return cached
        # the tokens two first turns with different user texts share are the system prefix
        with_a = encode_text(self.tokenizer, first_turn_text(self.tokenizer, system, "a"))
        with_b = encode_text(self.tokenizer, first_turn_text(self.tokenizer, system, "b"))
        n = 0
        while n < min(len(with_a), len(with_b)) and with_a[n] == with_b[n]:
            n += 1
        ids, kv = with_a[:n], []
        if n >= 8:
            from transformers import DynamicCache

            with torch.inference_mode():
                out = self.model(
                    input_ids=torch.tensor([ids], device=self.device),
                    past_key_values=DynamicCache(),
                    use_cache=True,
                    **({"logits_to_keep": 1} if self._keep_arg else {}),
                )
            kv = [
                (layer.keys.clone(), layer.values.clone()) for layer in out.past_key_values.layers
            ]
        else:
            ids = []
        self._prefixes[system] = (ids, kv)
        return ids, kv

    def _generate(self, keys: list[TrajKey], feeds: list[list[int]]) -> list[ActResponse]:
        """Generate one response per row, ragged (module docstring): rows live in *slots*
        0..n_live-1 of the batch tensors and cache buffers, and a row that ends gives its slot
        to the last live one."""
        import torch

        states = [self._states[k] for k in keys]
        n_rows = len(keys)
        dev = self.device
        past_len = [
            s.cache[0][0].shape[2] if (self.kv_reuse and s.cache is not None) else 0 for s in states
        ]
        p_max, n_max = max(past_len), max(len(f) for f in feeds)
        width = p_max + n_max + self.max_new_tokens  # every column the call can fill

        ids = torch.full((n_rows, n_max), self._pad_id, dtype=torch.long)
        mask = torch.zeros((n_rows, width), dtype=torch.long)
        pos = torch.zeros((n_rows, n_max), dtype=torch.long)
        for i, (f, p) in enumerate(zip(feeds, past_len, strict=False)):
            ids[i, : len(f)] = torch.tensor(f, dtype=torch.long)
            mask[i, p_max - p : p_max + len(f)] = 1
            pos[i, : len(f)] = torch.arange(p, p + len(f))
            pos[i, len(f) :] = p + len(f) - 1  # pads: any position; they are masked out
        cache = self._buffer_cache(states, past_len, p_max, width)
        last = torch.tensor([len(f) - 1 for f in feeds])

        generated: list[list[int]] = [[] for _ in range(n_rows)]
        logprobs: list[list[float]] = [[] for _ in range(n_rows)]  # raw: before T and top-p
        slot_row = list(range(n_rows))  # slot -> row; slots [0, n_live) are the live rows
        n_live = n_rows
        next_pos = torch.tensor([p + len(f) for p, f in zip(past_len, feeds, strict=False)])
        step_ids, step_pos = ids.to(dev), pos.to(dev)
        filled = p_max + n_max
        mask_dev = mask.to(dev)
        with torch.inference_mode():
            for t in range(self.max_new_tokens):
                at, keep = torch.zeros(n_live, dtype=torch.long), {}  # one fed token a row
                if t == 0 and self._keep_arg:  # the head on each row's last fed position alone
                    cols, at = torch.unique(last[:n_live], return_inverse=True)
                    keep = {"logits_to_keep": cols.to(dev)}
                elif t == 0:
                    at = last[:n_live]
                out = self.model(
                    input_ids=step_ids,
                    attention_mask=mask_dev[:n_live, :filled],
                    position_ids=step_pos,
                    past_key_values=cache,
                    use_cache=True,
                    **keep,
                )
                self.decode_rows += n_live
                logits = out.logits[torch.arange(n_live), at].float().cpu()
                raw = torch.log_softmax(logits, dim=-1)
                new_tok = torch.empty((n_live, 1), dtype=torch.long)
                ended = []
                for s in range(n_live):
                    i = slot_row[s]
                    tok = sample_next(logits[s], self.temperature, self.top_p, states[i].generator)
                    generated[i].append(tok)
                    logprobs[i].append(float(raw[s, tok]))
                    new_tok[s, 0] = tok
                    if tok in self._eot_set or t == self.max_new_tokens - 1:
                        ended.append(s)
                # Every generated token but a row's last has been fed, so an ended row's
                # cache is complete: store it, then fill its slot with the last live row.
                for s in reversed(ended):
                    i = slot_row[s]
                    if self.kv_reuse:
                        real = [*range(p_max - past_len[i], p_max + len(feeds[i]))]
                        real += range(p_max + n_max, p_max + n_max + len(generated[i]) - 1)
                        self._store_row(states[i], cache, s, real)
                    n_live -= 1
                    if s != n_live:
                        self._move_slot(cache, n_live, s, filled)
                        mask_dev[s] = mask_dev[n_live]
                        new_tok[s], next_pos[s], last[s] = (
                            new_tok[n_live],
                            next_pos[n_live],
                            last[n_live],
                        )
                        slot_row[s] = slot_row[n_live]
                if n_live == 0:
                    break
                for layer in cache.layers:
                    layer.keep_rows(n_live)
                mask_dev[:n_live, filled] = 1
                filled += 1
                step_ids, step_pos = (
                    new_tok[:n_live].to(dev),
                    next_pos[:n_live].unsqueeze(1).to(dev),
                )
                next_pos = next_pos + 1  # not in place: on CPU step_pos is a view of next_pos

        responses = []
        for i, key in enumerate(keys):
            gen = generated[i]
            text = self._record_response(key, gen, unfed=gen[-1:])
            mean, low = logprob_summary(logprobs[i])
            responses.append(
                ActResponse(
                    text=text,
                    n_prompt_tokens=len(feeds[i]),
                    n_gen_tokens=len(gen),
                    logprob_mean=mean,
                    logprob_min=low,
                )
            )
        return responses

    def _record_response(
        self, key: TrajKey, tokens: list[int], unfed: list[int], text: str | None = None
    ) -> str:
        """Append a response's ``tokens`` (generated, or forced with its ``text``) to the
        trajectory (:meth:`Conversation.add_response`); ``unfed``: the recorded tokens the model
        has not seen yet (fed with the next turn when the KV cache is kept). Returns its text."""
        state = self._states[key]
        text = state.add_response(self.tokenizer, tokens, self._eot_set, text)
        state.pending = list(unfed) if self.kv_reuse else []
        return text

    def _kv_shape(self) -> tuple[int, int, int]:
        """(layers, key/value heads, head dim) of the model."""
        cfg = self.model.config
        heads = cfg.num_attention_heads
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
        return cfg.num_hidden_layers, getattr(cfg, "num_key_value_heads", None) or heads, head_dim

    def _buffer_cache(
        self, states: list[_TrajState], past_len: list[int], p_max: int, width: int
    ) -> Any:
        """A cache whose layers are preallocated [B, h, width, d] buffers, each row's past
        left-padded into columns [p_max - P_i, p_max). Appending writes in place: no per-token
        re-concatenation of the whole cache."""
        import torch
        from transformers import DynamicCache

        n_layers, n_kv, head_dim = self._kv_shape()
        dtype = next(self.model.parameters()).dtype
        layers = []
        for layer in range(n_layers):
            k = torch.zeros((len(states), n_kv, width, head_dim), dtype=dtype, device=self.device)
            v = torch.zeros_like(k)
            for i, (s, p) in enumerate(zip(states, past_len, strict=False)):
                if p:
                    k[i, :, p_max - p : p_max] = s.cache[layer][0][0]
                    v[i, :, p_max - p : p_max] = s.cache[layer][1][0]
            layers.append(_buffer_layer_class()(k, v, p_max))
        cache = DynamicCache()
        cache.layers = layers
        return cache

    def _store_row(self, state: _TrajState, cache: Any, slot: int, cols: list[int]) -> None:
        """Keep for the row in ``slot`` only its real columns ``cols``: its past (P), the fed
        tokens (N), and the generated ones that were fed back (all but the last: pending)."""
        import torch

        index = torch.tensor(cols, device=self.device)
        state.cache = [
            (
                layer.buf_k[slot : slot + 1].index_select(2, index),
                layer.buf_v[slot : slot + 1].index_select(2, index),
            )
            for layer in cache.layers
        ]

    @staticmethod
    def _move_slot(cache: Any, src: int, dst: int, filled: int) -> None:
        """Copy slot ``src``'s filled columns [0, filled) of every layer's buffers into ``dst``."""
        for layer in cache.layers:
            layer.buf_k[dst, :, :filled] = layer.buf_k[src, :, :filled]
            layer.buf_v[dst, :, :filled] = layer.buf_v[src, :, :filled]


@functools.cache
def _buffer_layer_class() -> type:
    """A transformers cache layer over a preallocated buffer (defined lazily: heavy import)."""
    from transformers.cache_utils import DynamicLayer

    class BufferLayer(DynamicLayer):
        """keys/values are views [R, h, n, d] of buffers [B, h, width, d] (R = rows still
        decoding, slots 0..R-1); update writes the new states at column n (same column for
        every row, by the backend's layout)."""

        def __init__(self, buf_k: Any, buf_v: Any, n: int) -> None:
            super().__init__()
            self.buf_k, self.buf_v, self.n, self.rows = buf_k, buf_v, n, buf_k.shape[0]
            self.dtype, self.device = buf_k.dtype, buf_k.device
            self.is_initialized = True
            self._views()

        def _views(self) -> None:
            self.keys = self.buf_k[: self.rows, :, : self.n]
            self.values = self.buf_v[: self.rows, :, : self.n]

        def keep_rows(self, rows: int) -> None:
            """Decode only slots [0, rows) from now on (the caller moved live rows there)."""
            self.rows = rows
            self._views()

        def update(
            self, key_states: Any, value_states: Any, *args: Any, **kwargs: Any
        ) -> tuple[Any, Any]:
            end = self.n + key_states.shape[2]
            if end > self.buf_k.shape[2]:
                raise RuntimeError("KV buffer overflow (backend bug: width too small)")
            self.buf_k[: self.rows, :, self.n : end] = key_states
            self.buf_v[: self.rows, :, self.n : end] = value_states
            self.n = end
            self._views()
            return self.keys, self.values

        def get_seq_length(self) -> int:
            return self.n

    return BufferLayer


_LOAD_ERRORS = (OSError, ValueError, RuntimeError, KeyError, TypeError, AttributeError)


def load_model(
    model_path: str | Path,
    adapter_path: str | Path | None = None,
    *,
    device: str = "cpu",
    dtype: str = "float32",
) -> tuple[Any, Any]:
    """Load a local HF causal LM (+ optional peft adapter) and its tokenizer, in eval mode."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # one bar per weight load is noise in a rollout's output
    path = Path(model_path)
    if not (path / "config.json").is_file():
        raise SrolloutError(f"{path} is not a Hugging Face model directory (no config.json)")
    # the file checks (model_files) catch the damage seen so far; anything else the loaders refuse
    # (an unknown model_type, a config that does not fit the weights) is one line, not a traceback
    try:
        tokenizer = AutoTokenizer.from_pretrained(path)
        model = AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, dtype))
    except (*_LOAD_ERRORS, ImportError) as err:
        said = one_line(err) or type(err).__name__
        raise SrolloutError(f"{path}: transformers cannot load this model: {said}") from None
    if adapter_path is not None:
        apath = Path(adapter_path)
        if not (apath / "adapter_config.json").is_file():
            raise SrolloutError(f"{apath} is not a peft adapter directory (no adapter_config.json)")
        from peft import PeftModel

        try:
            model = PeftModel.from_pretrained(model, apath)
        except _LOAD_ERRORS as err:
            said = one_line(err) or type(err).__name__
            line = f"--adapter {apath}: peft cannot load it on {path}: {said}"
            raise SrolloutError(line) from None
    model.to(device)
    model.eval()
    return model, tokenizer
