"""Rollouts against a running vLLM OpenAI-compatible server (``--backend vllm-server``).

Large trainers keep inference servers apart from rollout workers; this backend is the rollout
side. It needs no vLLM on the client, only the model's tokenizer: each trajectory's prompt is
sent as token ids (``/v1/completions`` with ``prompt`` = ids and ``return_token_ids``), built
by the same :class:`~srollout.policy.vllm_backend.TokenConversations` as the in-process backend,
with the same per-step seeds, so the token ids, the action mask and (given one vLLM version and
device) the sampled tokens are those of ``--backend vllm``.

One ``act`` sends one request per live trajectory, all at once from a thread pool, so the
server's scheduler batches them as the in-process engine batches one ``generate`` call. A LoRA
adapter is loaded into the server at run time (``/v1/load_lora_adapter``; the server must run
with ``VLLM_ALLOW_RUNTIME_LORA_UPDATING=True``, as ``srollout serve --lora`` starts it) under a
fresh name per load, so no prefix cache computed with old weights is reused, and the adapter it
replaces is unloaded.

Start a server for the default policy or any model directory with ``srollout serve [MODEL]``.
"""

from __future__ import annotations

import http.client
import json
import threading
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from srollout.errors import SrolloutError
from srollout.policy.base import ActRequest, ActResponse, TrajectoryTokens, TrajKey
from srollout.policy.server_probe import PROBE_TIMEOUT_S, check_server, death_line

TIMEOUT_S = 600.0  # one completion; a CPU server under load can take minutes for a long batch


class ServerHTTPError(SrolloutError):
    """The server answered with an HTTP error: ``status`` and its own message (``said``)."""

    def __init__(self, line: str, *, status: int, said: str) -> None:
        super().__init__(line)
        self.status, self.said = status, said


class ServerClient:
    """A small JSON client for one vLLM server (stdlib only; one keep-alive connection per
    thread)."""

    def __init__(self, base_url: str, timeout: float = TIMEOUT_S) -> None:
        url = base_url.rstrip("/")
        parts = urlsplit(url if "://" in url else f"http://{url}")
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise SrolloutError(f"--base-url {base_url!r}: expected http://HOST:PORT")
        self.base_url = f"{parts.scheme}://{parts.netloc}"
        self._prefix = parts.path.removesuffix("/v1")
        self._scheme, self._host, self._port = parts.scheme, parts.hostname, parts.port
        self.timeout = timeout
        self._local = threading.local()

    def _conn(self, timeout: float) -> http.client.HTTPConnection:
        conn = getattr(self._local, "conn", None)
        if conn is None or conn.timeout != timeout:
            cls = (
                http.client.HTTPSConnection
                if self._scheme == "https"
                else http.client.HTTPConnection
            )
            conn = cls(self._host, self._port, timeout=timeout)
            self._local.conn = conn
        return conn

    def call(
        self, method: str, path: str, body: dict | None = None, *, timeout: float | None = None
    ) -> Any:
        """``method path`` with a JSON body; the parsed JSON answer (a one-line error otherwise)."""
        t = self.timeout if timeout is None else timeout
        data = None if body is None else json.dumps(body).encode()
        headers = {"Content-Type": "application/json"} if data is not None else {}
        for attempt in (0, 1):  # a kept-alive connection the server closed is retried once, fresh
            conn = self._conn(t)
            try:
                conn.request(method, self._prefix + path, body=data, headers=headers)
                resp = conn.getresponse()
                raw = resp.read()
                break
            except (ConnectionError, http.client.HTTPException, OSError) as err:
                conn.close()
                self._local.conn = None
                if attempt == 1 or isinstance(err, (ConnectionRefusedError, TimeoutError)):
                    raise SrolloutError(
                        f"--base-url {self.base_url}: no vLLM server answers "
                        f"({err.__class__.__name__}: {err}); start one with `srollout serve`"
                    ) from None
        if resp.status >= 400:
            try:
                msg = json.loads(raw).get("error", {})
                msg = msg.get("message", msg) if isinstance(msg, dict) else msg
            except (ValueError, AttributeError):
                msg = raw[:200].decode(errors="replace")
            said = str(msg).splitlines()[0] if msg else ""
            raise ServerHTTPError(
                f"vLLM server {self.base_url}{path}: HTTP {resp.status}: {said}",
                status=resp.status,
                said=said,
            )
        try:
            return json.loads(raw) if raw else None
        except ValueError:
            return raw.decode(errors="replace")

    def health(self) -> int | None:
        """``/health``'s HTTP status (200: the engine lives; 503: it is dead), None if no
        answer."""
        try:
            self.call("GET", "/health", timeout=PROBE_TIMEOUT_S)
        except ServerHTTPError as err:
            return err.status
        except SrolloutError:
            return None
        return 200


class VLLMServerPolicy:
    """A vLLM server as a :class:`Policy` (same options and outputs as :class:`VLLMPolicy`).

    base_url: ``http://HOST:PORT`` of the server; model_path: the local model directory whose
    tokenizer builds the prompts (it must be the model the server serves: checked by tokenizing
    a probe text on both sides); adapter_path: a peft LoRA adapter to load into the server.
    """

    def __init__(
        self,
        base_url: str,
        model_path: str | Path,
        adapter_path: str | Path | None = None,
        *,
        temperature: float = 0.7,
        top_p: float = 1.0,
        max_new_tokens: int = 64,
        max_workers: int = 64,
    ) -> None:
        from transformers import AutoTokenizer

        from srollout.policy.model_files import check_model_dir
        from srollout.policy.vllm_backend import TokenConversations

        self.model_path = Path(model_path)
        check_model_dir(self.model_path)
        self.client = ServerClient(base_url)
        # what the server says about itself; refused before any seeded request if they kill it
        self.facts = check_server(self.client)
        self.served = self.facts.model
        self.tokenizer = AutoTokenizer.from_pretrained(self.model_path)
        self._check_same_tokenizer()
        self.temperature, self.top_p, self.max_new_tokens = (
            float(temperature),
            float(top_p),
            int(max_new_tokens),
        )
        self.conversations = TokenConversations(self.tokenizer)
        self.pool = ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="vllm-client")
        self._target = self.served
        self._lora_id = 0
        self._session = uuid.uuid4().hex[:8]
        self.name = f"vllm-server:{self.served}"
        if adapter_path is not None:
            self.load_adapter(adapter_path)

    def _check_same_tokenizer(self) -> None:
        from srollout.policy.chat import encode_text

        probe = "Observation: You arrive at cabinet 1. On the cabinet 1, you see a mug 2."
        theirs = self.client.call(
            "POST",
            "/tokenize",
            {"model": self.served, "prompt": probe, "add_special_tokens": False},
        )
        if theirs.get("tokens") != encode_text(self.tokenizer, probe):
            raise SrolloutError(
                f"the server at {self.client.base_url} serves {self.served!r}, whose tokenizer "
                f"differs from {self.model_path}'s; pass the served model's directory as --model"
            )

    def load_adapter(self, adapter_path: str | Path) -> None:
        """Load a LoRA adapter into the server under a fresh name and use it from the next
        ``act``."""
        from srollout.policy.model_files import check_adapter

        path = Path(adapter_path).resolve()
        check_adapter(path, self.model_path)
        self._lora_id += 1
        # unique per client: one server may serve many rollout workers and runs
        name = f"srollout-{self._session}-{self._lora_id}-{path.name}"
        self.client.call(
            "POST", "/v1/load_lora_adapter", {"lora_name": name, "lora_path": str(path)}
        )
        old, self._target = self._target, name
        if old != self.served:  # the adapter it replaces is not used again: free its slot
            self.client.call("POST", "/v1/unload_lora_adapter", {"lora_name": old})
        self.name = f"vllm-server:{self.served}+{path.name}#{self._lora_id}"

    def _complete(self, ids: list[int], seed: int) -> tuple[list[int], list[float]]:
        """The generated ids and each one's raw log-probability (``logprobs: 0``: the sampled
        token's own, in ``choices[0].logprobs.token_logprobs``; [] from a server that omits
        them)."""
        body = {
            "model": self._target,
            "prompt": ids,
            "max_tokens": self.max_new_tokens,
            "temperature": self.temperature,
            "top_p": self.top_p,
            "seed": seed,
            "stop_token_ids": list(self.conversations.eot_ids),
            "return_token_ids": True,
            "skip_special_tokens": True,
            "logprobs": 0,
        }
        try:
            out = self.client.call("POST", "/v1/completions", body)
        except SrolloutError as err:
            if getattr(err, "status", 500) < 500:  # this request's own fault: the server lives
                raise
            said = getattr(err, "said", None)  # None: no HTTP answer at all
            line = death_line(self.client.base_url, said, self.client.health())
            if line is None:
                raise
            raise SrolloutError(line) from None
        choice = out["choices"][0]
        if choice.get("token_ids") is None:
            raise SrolloutError(
                f"the server at {self.client.base_url} "
                "returned no token ids (vLLM >= 0.10.2 needed)"
            )
        logprobs = (choice.get("logprobs") or {}).get("token_logprobs") or []
        return list(choice["token_ids"]), [float(x) for x in logprobs if x is not None]

    def act(self, requests: list[ActRequest]) -> list[ActResponse]:
        """One response per request, same order; every request in flight at once."""
        from srollout.policy.vllm_backend import step_seed

        prompts = [self.conversations.prompt(r) for r in requests]
        futures = [
            self.pool.submit(self._complete, ids, step_seed(r.seed, r.step))
            for r, (ids, _) in zip(requests, prompts, strict=True)
        ]
        responses = []
        for r, (_, n), f in zip(requests, prompts, futures, strict=True):
            ids, logprobs = f.result()
            responses.append(self.conversations.record(r, ids, n, logprobs))
        return responses

    def finish(self, key: TrajKey) -> TrajectoryTokens | None:
        """End a trajectory and return its tokens (None if never started)."""
        return self.conversations.finish(key)
