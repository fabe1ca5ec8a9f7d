"""The vLLM backend (extra ``gpu``): same :class:`Policy` interface, seeded sampling, LoRA.

vLLM is stateless per request; its automatic prefix caching plays the role of the transformers
backend's per-trajectory KV cache (the conversation prefix of step t is cached from step t-1).
Each trajectory keeps its own token ids (we feed token ids, never re-tokenize the history), so
the recorded sequence is exactly what the model saw. Per-request sampling seeds are derived from
the trajectory seed and the step, so a trajectory's sampling does not depend on batch-mates.
A LoRA adapter is served through ``LoRARequest``; :meth:`VLLMPolicy.load_adapter` registers a
new adapter under a new name and id, so no prefix cache computed with old weights is reused.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from srollout.errors import NotAvailableError, SrolloutError
from srollout.policy.base import ActRequest, ActResponse, TrajectoryTokens, TrajKey
from srollout.policy.chat import encode_text, end_of_turn_ids, first_turn_text, next_turn_text


def require_vllm() -> Any:
    """Import vllm, or raise a one-line error that says how to get it."""
    try:
        import vllm
    except ImportError as err:
        raise NotAvailableError(
            "the vllm backend needs the `gpu` extra and a CUDA GPU: pip install 'srollout[gpu]' "
            f"({err.__class__.__name__}: {err})"
        ) from None
    import torch

    if not torch.cuda.is_available():
        raise NotAvailableError("the vllm backend needs a CUDA GPU; none is visible (use --backend transformers)")
    return vllm


def step_seed(seed: int, step: int) -> int:
    """Per-request vLLM seed of one trajectory's step: a fixed mix of (seed, step) in [0, 2^31)."""
    return (int(seed) * 1_000_003 + int(step) * 7_919) % (2**31 - 1)


class VLLMPolicy:
    """A local HF model served by vLLM as a :class:`Policy` (same options as the transformers one).

    model_path: HF model directory; adapter_path: peft LoRA adapter or None;
    max_lora_rank: the largest adapter rank to accept (vLLM sizes its LoRA slots by it).
    """

    def __init__(
        self,
        model_path: str | Path,
        adapter_path: str | Path | None = None,
        *,
        temperature: float = 0.7,
        top_p: float = 1.0,
        max_new_tokens: int = 64,
        gpu_memory_utilization: float = 0.5,
        max_lora_rank: int = 16,
        max_model_len: int | None = None,
        enforce_eager: bool = False,
    ) -> None:
        vllm = require_vllm()
        from transformers import AutoTokenizer

        self.model_path = Path(model_path)
        if not (self.model_path / "config.json").is_file():
            raise SrolloutError(f"{self.model_path} is not a Hugging Face model directory (no config.json)")
        self.temperature = float(temperature)
        self.top_p = float(top_p)
        self.max_new_tokens = int(max_new_tokens)
        self.tokenizer = AutoTokenizer.from_pretrained(self.model_path)
        kwargs: dict[str, Any] = dict(
            model=str(self.model_path),
            enable_prefix_caching=True,
            gpu_memory_utilization=gpu_memory_utilization,
            enable_lora=True,
            max_lora_rank=max_lora_rank,
            enforce_eager=enforce_eager,
            seed=0,
        )
        if max_model_len:
            kwargs["max_model_len"] = max_model_len
        self.llm = vllm.LLM(**kwargs)
        self.eot_ids = end_of_turn_ids(self.tokenizer, None)
        self._eot_set = frozenset(self.eot_ids)
        self._lora: Any = None
        self._lora_id = 0
        self.name = f"vllm:{self.model_path.name}"
        if adapter_path is not None:
            self.load_adapter(adapter_path)
        self._states: dict[TrajKey, dict[str, Any]] = {}

    def load_adapter(self, adapter_path: str | Path) -> None:
        """Serve a new LoRA adapter under a fresh name and id (hot swap, no stale prefix cache)."""
        from vllm.lora.request import LoRARequest

        path = Path(adapter_path)
        if not (path / "adapter_config.json").is_file():
            raise SrolloutError(f"{path} is not a peft adapter directory (no adapter_config.json)")
        self._lora_id += 1
        self._lora = LoRARequest(f"adapter-{self._lora_id}", self._lora_id, str(path))
        self.name = f"vllm:{self.model_path.name}+{path.name}#{self._lora_id}"

    def act(self, requests: list[ActRequest]) -> list[ActResponse]:
        """One response per request, same order, in one ``LLM.generate`` call."""
        from vllm import SamplingParams

        prompts, params, fed = [], [], []
        for r in requests:
            st = self._states.get(r.key)
            if st is None or r.step == 1:
                st = {"system": r.system, "ids": [], "mask": []}
                self._states[r.key] = st
                text = first_turn_text(self.tokenizer, r.system, r.user)
            else:
                text = next_turn_text(
                    self.tokenizer, st["system"], st["user"], st["text"], r.user, st["end"]
                )
            new = encode_text(self.tokenizer, text)
            st["ids"] += new
            st["mask"] += [False] * len(new)
            st["user"] = r.user
            fed.append(len(new))
            prompts.append({"prompt_token_ids": list(st["ids"])})
            params.append(
                SamplingParams(
                    temperature=self.temperature,
                    top_p=self.top_p,
                    max_tokens=self.max_new_tokens,
                    seed=step_seed(r.seed, r.step),
                    stop_token_ids=list(self.eot_ids),
                    skip_special_tokens=True,
                )
            )
        outs = self.llm.generate(prompts, params, lora_request=self._lora, use_tqdm=False)
        responses = []
        for r, out, n_fed in zip(requests, outs, fed, strict=False):
            st = self._states[r.key]
            gen = list(out.outputs[0].token_ids)
            st["ids"] += gen
            st["mask"] += [True] * len(gen)
            ended = bool(gen) and gen[-1] in self._eot_set
            content = gen[:-1] if ended else gen
            st["text"] = self.tokenizer.decode(content, skip_special_tokens=True)
            st["end"] = self.tokenizer.decode(gen[-1:], skip_special_tokens=False) if ended else None
            responses.append(ActResponse(text=st["text"], n_prompt_tokens=n_fed, n_gen_tokens=len(gen)))
        return responses

    def finish(self, key: TrajKey) -> TrajectoryTokens | None:
        """End a trajectory and return its tokens (None if never started)."""
        st = self._states.pop(key, None)
        if st is None:
            return None
        return TrajectoryTokens(token_ids=list(st["ids"]), action_mask=list(st["mask"]))
