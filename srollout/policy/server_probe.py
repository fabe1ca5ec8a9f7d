"""What srollout learns about a vLLM server it did not start, before its first seeded request.

A vLLM server on a CPU with chunked prefill on (vLLM's default) dies on seeded requests whose
prompts are split over engine steps (it rewinds ``gen.set_offset(gen.get_offset() - 4)`` in
``gpu_model_runner.py``, which a CPU generator cannot do). Why, the GET endpoints read (none reaches
the engine) and what each answer decides: docs/scaling.md, "vLLM servers srollout did not start".
"""

from __future__ import annotations

import os
import re
import sys
from dataclasses import dataclass, field
from typing import Any

from srollout.errors import SrolloutError

# Set to 1 to roll out against a server whose config cannot be read (no /server_info): for a
# GPU server, where seeded chunked prefill is fine, that you cannot restart in dev mode.
UNCHECKED_ENV = "SROLLOUT_UNCHECKED_SERVER"
PROBE_TIMEOUT_S = 5.0  # one GET about the server, before a run
FIX_CPU = "restart it with --no-enable-chunked-prefill --dtype float32, or use `srollout serve`"


@dataclass(frozen=True)
class ServerFacts:
    """What a vLLM server told about itself; None: it did not say.

    version: vLLM's version (``/version``); model, max_model_len: the served model
    (``/v1/models``); device (``cpu``, ``cuda``, ...), chunked_prefill, max_num_batched_tokens,
    dtype: from ``/server_info``; cache: ``vllm:cache_config_info``'s labels (``/metrics``);
    missing: the endpoints that did not answer, in the order asked.
    """

    version: str | None = None
    model: str | None = None
    max_model_len: int | None = None
    device: str | None = None
    chunked_prefill: bool | None = None
    max_num_batched_tokens: int | None = None
    dtype: str | None = None
    cache: dict[str, str] = field(default_factory=dict)
    missing: tuple[str, ...] = ()

    def summary(self) -> str:
        """One line: ``vLLM 0.32.0, model M, cpu, bfloat16, chunked prefill on``."""
        parts = [
            f"vLLM {self.version or '?'}",
            f"model {self.model or '?'}",
            self.device or "device ?",
            self.dtype or "dtype ?",
        ]
        if self.chunked_prefill is None:
            parts.append("chunked prefill ?")
        else:
            parts.append(f"chunked prefill {'on' if self.chunked_prefill else 'off'}")
        return ", ".join(parts)


@dataclass(frozen=True)
class SeedCheck:
    """Whether seeded requests are safe on a server: error (refuse, one line) or warning (go on,
    one line) or neither (safe)."""

    error: str | None = None
    warning: str | None = None


def parse_models(answer: Any) -> tuple[str | None, int | None]:
    """The served base model's id and max_model_len from ``/v1/models``'s JSON (LoRA adapters,
    which name a ``parent``, are skipped)."""
    data = answer.get("data", []) if isinstance(answer, dict) else []
    for m in data:
        if isinstance(m, dict) and not m.get("parent") and m.get("id"):
            n = m.get("max_model_len")
            return str(m["id"]), int(n) if isinstance(n, int) else None
    return None, None


_INFO_LINE = re.compile(r"^vllm:cache_config_info\{(?P<labels>.*)\}\s+\S+\s*$")
_LABEL = re.compile(r'(?P<k>[A-Za-z_][A-Za-z0-9_]*)="(?P<v>(?:[^"\\]|\\.)*)"')


def parse_cache_config_info(metrics: str) -> dict[str, str]:
    """The labels of ``vllm:cache_config_info`` in Prometheus text ({} if absent)."""
    for line in metrics.splitlines():
        m = _INFO_LINE.match(line.strip())
        if m:
            return {k: v.replace('\\"', '"') for k, v in _LABEL.findall(m["labels"])}
    return {}


def parse_server_info(answer: Any) -> dict[str, Any]:
    """device, chunked_prefill, max_num_batched_tokens and dtype from ``/server_info``'s JSON
    (``config_format=json``); a key is absent when the answer does not hold it."""
    config = answer.get("vllm_config") if isinstance(answer, dict) else None
    if not isinstance(config, dict):
        return {}
    out: dict[str, Any] = {}
    device = (config.get("device_config") or {}).get("device")
    if isinstance(device, str):
        out["device"] = device.split(":")[0]
    sched = config.get("scheduler_config") or {}
    if isinstance(sched.get("enable_chunked_prefill"), bool):
        out["chunked_prefill"] = sched["enable_chunked_prefill"]
    if isinstance(sched.get("max_num_batched_tokens"), int):
        out["max_num_batched_tokens"] = sched["max_num_batched_tokens"]
    dtype = (config.get("model_config") or {}).get("dtype")
    if isinstance(dtype, str):
        out["dtype"] = dtype.removeprefix("torch.")
    return out


def learn(get: Any) -> ServerFacts:
    """Ask a server about itself. ``get(path)``: the answer to ``GET path`` (parsed JSON or text),
    or None when the server has no such endpoint or it fails."""
    missing: list[str] = []
    version = get("/version")
    if not isinstance(version, dict):
        missing.append("/version")
    model, max_len = parse_models(get("/v1/models"))
    metrics = get("/metrics")
    cache = parse_cache_config_info(metrics) if isinstance(metrics, str) else {}
    if not cache:
        missing.append("/metrics")
    info = get("/server_info?config_format=json")
    config = parse_server_info(info)
    if not config:
        missing.append("/server_info")
    return ServerFacts(
        version=str(version["version"]) if isinstance(version, dict) else None,
        model=model,
        max_model_len=max_len,
        cache=cache,
        missing=tuple(missing),
        **config,
    )


def check_seeded(facts: ServerFacts, url: str, *, unchecked_ok: bool = False) -> SeedCheck:
    """Whether srollout may send seeded requests to the server at ``url``; ``unchecked_ok``:
    ``SROLLOUT_UNCHECKED_SERVER=1``. The decisions and why: docs/scaling.md's table."""
    where = f"the vLLM server at {url}"
    if facts.device == "cpu" and facts.chunked_prefill:
        return SeedCheck(
            error=f"{where} runs on a CPU with chunked prefill on: its engine dies on the first "
            "seeded prompt prefilled in more than one step (CPU Generator does not use offset); "
            + FIX_CPU
        )
    if facts.device is None or facts.chunked_prefill is None:
        unknown = "its device and whether chunked prefill is on"
        if unchecked_ok:
            return SeedCheck(
                warning=f"{where}: not checked ({unknown}: no /server_info), going on as "
                f"{UNCHECKED_ENV}=1 asks; a CPU server with chunked prefill on dies on the first "
                "seeded request"
            )
        return SeedCheck(
            error=f"{where} does not say {unknown} (vLLM shows them at /server_info only with "
            "VLLM_SERVER_DEV_MODE=1), and a CPU server with chunked prefill on dies on seeded "
            "requests: restart it with VLLM_SERVER_DEV_MODE=1 (on a CPU also "
            "--no-enable-chunked-prefill --dtype float32), use `srollout serve`, or set "
            f"{UNCHECKED_ENV}=1 for a GPU server"
        )
    return SeedCheck()


_warned: set[str] = set()


def check_server(client: Any) -> ServerFacts:
    """Learn what ``client``'s server says about itself (GET requests only) and raise a one-line
    :class:`SrolloutError` if seeded requests could kill it; a warning goes to stderr once per
    process and server."""

    def get(path: str) -> Any:
        try:
            return client.call("GET", path, timeout=PROBE_TIMEOUT_S)
        except SrolloutError as err:
            if getattr(err, "status", None) is None:  # no answer at all: say so, as before
                raise
            return None

    facts = learn(get)
    if facts.model is None:
        raise SrolloutError(f"--base-url {client.base_url}: the server lists no model")
    verdict = check_seeded(
        facts, client.base_url, unchecked_ok=os.environ.get(UNCHECKED_ENV) == "1"
    )
    if verdict.error:
        raise SrolloutError(verdict.error)
    if verdict.warning and client.base_url not in _warned:
        _warned.add(client.base_url)
        print(f"warning: {verdict.warning}", file=sys.stderr)
    return facts


def death_line(url: str, said: str | None, health: int | None) -> str | None:
    """The one line for a generation request that failed with the server's message ``said``
    (None: no HTTP answer), given what ``/health`` answered afterwards (its status; None: no
    answer): the server died, or None when it still lives (the failure was that request's)."""
    if health == 200:
        return None
    why = f"its engine said: {said.strip()}" if said and said.strip() else "it stopped answering"
    return f"the vLLM server at {url} died during the run ({why})"
