"""Policies behind one interface: transformers (CPU/GPU, KV cache, LoRA), vLLM, and non-LLM experts.

``make_policy`` is what stages call; the backends import torch/transformers/vllm lazily, so
importing this package is cheap.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from srollout.errors import ArgumentError, SrolloutError
from srollout.policy.base import ActRequest, ActResponse, Policy, TrajectoryTokens, TrajKey

POLICY_KINDS = ("lm", "expert", "noisy-expert")
BACKENDS = ("transformers", "vllm", "vllm-server")

__all__ = [
    "ActRequest",
    "ActResponse",
    "Policy",
    "TrajKey",
    "TrajectoryTokens",
    "POLICY_KINDS",
    "BACKENDS",
    "make_policy",
    "preflight",
    "resolve_model",
]


def resolve_model(model: str | Path | None) -> Path:
    """The model directory ``model`` names: ``"default"``/None the shipped default policy, a
    named model (:mod:`srollout.policy.named`), a ``.gguf`` file converted once
    (:mod:`srollout.policy.gguf`), else a local Hugging Face model directory. Checked file by
    file first (:func:`srollout.policy.model_files.check_model_dir`), so a damaged one is one
    line naming the file, not a traceback from the loader."""
    if model is None or str(model) == "default":
        from srollout.policy.shipped import default_policy

        return default_policy()
    from srollout.policy.model_files import check_model_dir
    from srollout.policy.named import NAMED_MODELS, named_model

    if str(model) in NAMED_MODELS:
        return named_model(str(model))
    path = Path(model).expanduser()
    if path.suffix.lower() == ".gguf" or (path.is_file() and _starts_gguf(path)):
        from srollout.policy.gguf import converted_model

        return converted_model(path)
    if not path.is_dir():
        raise SrolloutError(
            f"--model {model}: no such directory (a local "
            "Hugging Face model directory, a .gguf file, `default`, "
            f"{', '.join(sorted(NAMED_MODELS))})"
        )
    if not (path / "config.json").is_file():
        raise SrolloutError(f"--model {model}: not a Hugging Face model directory (no config.json)")
    check_model_dir(path)
    return path


def _starts_gguf(path: Path) -> bool:
    with path.open("rb") as f:
        return f.read(4) == b"GGUF"


def preflight(
    kind: str,
    model: str | Path | None,
    backend: str,
    *,
    adapter: str | Path | None = None,
    base_url: str | None = None,
    model_dir: Path | None = None,
) -> None:
    """The checks a stage runs before it writes anything: the model's and the adapter's files,
    vLLM installed and importable (``vllm``), the server answering and safe for seeded requests
    (``vllm-server``, :mod:`srollout.policy.server_probe`). Each
    failure is one line (:class:`SrolloutError`); nothing is loaded. model_dir: ``model`` as
    :func:`resolve_model` already gave it (a stage's plan), not resolved again."""
    if kind != "lm":
        return
    path = model_dir if model_dir is not None else resolve_model(model)
    if adapter is not None:
        from srollout.policy.model_files import check_adapter

        check_adapter(Path(adapter), path)
    if backend == "vllm":
        from srollout.policy.vllm_backend import require_vllm

        require_vllm()
    elif backend == "vllm-server":
        from srollout.policy.server_probe import check_server
        from srollout.policy.vllm_server import ServerClient

        check_server(ServerClient(_server_url(base_url)))  # one seeded requests would kill: refused


def _server_url(base_url: str | None) -> str:
    """The vLLM server's URL, which the ``vllm-server`` backend needs (one check for preflight and
    make_policy; the CLI names the flag, --base-url)."""
    if base_url is None:
        raise ArgumentError("backend vllm-server needs {base_url:name}", base_url=base_url)
    return base_url


def make_policy(
    kind: str = "lm",
    model: str | Path | None = "default",
    backend: str = "transformers",
    temperature: float = 0.7,
    top_p: float = 1.0,
    *,
    adapter: str | Path | None = None,
    max_new_tokens: int = 64,
    device: str = "cpu",
    noise: float = 0.3,
    seed: int = 0,
    base_url: str | None = None,
    model_dir: Path | None = None,
    **backend_kwargs: Any,
) -> Policy:
    """Build the policy a stage rolls out.

    kind: ``lm`` (a language model through ``backend``), ``expert`` or ``noisy-expert``
        (planner-driven, :mod:`srollout.policy.experts`; ``noise`` is the noisy expert's ε).
    model: ``default`` or a local HF model directory; adapter: a peft LoRA directory.
    backend: ``transformers``, ``vllm`` (in process) or ``vllm-server`` (``base_url`` names the
        server). Extra keyword arguments go to the backend.
    model_dir: ``model`` as :func:`resolve_model` already gave it (a stage's plan resolves it
        once); None: resolved here.
    """
    if kind not in POLICY_KINDS:
        raise SrolloutError(f"--policy {kind!r}: choose one of {', '.join(POLICY_KINDS)}")
    if kind != "lm":
        from srollout.policy import experts

        if kind == "expert":
            return experts.ExpertPolicy(seed=seed)
        return experts.NoisyExpertPolicy(eps=noise, seed=seed)
    if backend not in BACKENDS:
        raise SrolloutError(f"--backend {backend!r}: choose one of {', '.join(BACKENDS)}")
    if temperature < 0:
        raise SrolloutError(f"--temperature must be >= 0, got {temperature}")
    if adapter is not None and not Path(adapter).is_dir():
        raise SrolloutError(f"--adapter {adapter}: no such directory")
    url = _server_url(base_url) if backend == "vllm-server" else None
    if backend == "vllm":
        from srollout.policy.vllm_backend import require_vllm

        require_vllm()  # fail fast, before the model is read
    path = model_dir if model_dir is not None else resolve_model(model)
    sampling = dict(temperature=temperature, top_p=top_p, max_new_tokens=max_new_tokens)
    if backend == "vllm-server":
        from srollout.policy.vllm_server import VLLMServerPolicy

        return VLLMServerPolicy(url, path, adapter, **sampling, **backend_kwargs)
    if backend == "vllm":
        from srollout.policy.model_files import check_adapter
        from srollout.policy.vllm_backend import VLLMPolicy

        if adapter is not None:  # before vLLM loads the model
            check_adapter(Path(adapter), path)
        return VLLMPolicy(path, adapter, **sampling, **backend_kwargs)
    from srollout.policy.transformers_backend import TransformersPolicy

    return TransformersPolicy(path, adapter, device=device, **sampling, **backend_kwargs)
