"""Check a Hugging Face model directory before anything loads it: one line per damaged file.

transformers and safetensors answer a broken file with a traceback deep inside their loaders
(a truncated ``model.safetensors`` even loads partly). Reading the few bytes that say whether a
file is whole costs milliseconds, so every command checks first and names the file.
"""

from __future__ import annotations

import functools
import hashlib
import json
import struct
from pathlib import Path

from srollout.errors import SrolloutError

WEIGHT_FILES = (
    "model.safetensors",
    "model.safetensors.index.json",
    "pytorch_model.bin",
    "pytorch_model.bin.index.json",
)
# what transformers builds a tokenizer from (fast tokenizer, sentencepiece, BPE or WordPiece files)
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "vocab.txt", "spiece.model")


def native_bf16() -> bool:
    """Whether this CPU computes bf16 in hardware (AVX512-BF16 or AMX). Without it torch emulates
    bf16 and autocast makes SFT far slower, not faster (measured on an AVX2-only AMD EPYC: a
    256×768 linear layer's forward+backward took 533 ms in bf16 against 12 ms in fp32)."""
    import torch

    probes = ("_is_avx512_bf16_supported", "_is_amx_tile_supported")
    return any(bool(getattr(torch.cpu, name, lambda: False)()) for name in probes)


def model_dtype(model_dir: str | Path) -> str:
    """The precision a rollout backend runs ``model_dir`` in on a CPU: ``bfloat16`` where its
    srollout.json asks for it (``"dtype"``) and the CPU computes bf16 natively, else ``float32``
    (SmolLM2 in bf16: twice the tokens per second, docs/smollm2-alfworld.md)."""
    f = Path(model_dir) / "srollout.json"
    asked = _read_json(f, "").get("dtype", "float32") if f.is_file() else "float32"
    if asked not in ("float32", "bfloat16"):
        raise SrolloutError(f"{f}: dtype {asked!r}: give float32 or bfloat16")
    return "bfloat16" if asked == "bfloat16" and native_bf16() else "float32"


def _read_json(path: Path, hint: str) -> dict:
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise SrolloutError(f"{path}: missing{hint}") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise SrolloutError(f"{path}: not valid JSON ({err}){hint}") from None
    if not isinstance(data, dict):
        raise SrolloutError(f"{path}: expected a JSON object{hint}")
    return data


def safetensors_shapes(path: Path) -> dict[str, list[int]]:
    """Tensor name -> shape from a (checked) safetensors file's header; nothing else is read."""
    with Path(path).open("rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
    return {
        k: list(v["shape"])
        for k, v in header.items()
        if k != "__metadata__" and isinstance(v, dict)
    }


def check_safetensors(path: Path, hint: str = "") -> None:
    """A safetensors file is whole: its header parses and the tensors it lists end exactly at
    the end of the file (8-byte little-endian header length, JSON header, then the data)."""
    try:
        size = path.stat().st_size
        with path.open("rb") as f:
            head = f.read(8)
            if len(head) < 8:
                raise SrolloutError(
                    f"{path}: truncated ({size} bytes, no safetensors header){hint}"
                )
            (n,) = struct.unpack("<Q", head)
            if n > size - 8:
                raise SrolloutError(
                    f"{path}: truncated (header of {n} bytes, file of {size}){hint}"
                )
            header = json.loads(f.read(n))
    except FileNotFoundError:
        raise SrolloutError(f"{path}: missing{hint}") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise SrolloutError(f"{path}: not a safetensors file ({err}){hint}") from None
    ends = [
        v["data_offsets"][1]
        for k, v in header.items()
        if k != "__metadata__" and isinstance(v, dict)
    ]
    if not ends:
        raise SrolloutError(f"{path}: holds no tensors{hint}")
    want = 8 + n + max(ends)
    if size != want:
        raise SrolloutError(
            f"{path}: {'truncated' if size < want else 'has trailing bytes'} "
            f"({size} bytes, the header says {want}){hint}"
        )


def check_model_dir(path: Path, *, rebuild: str | None = None, tokenizer: bool = True) -> None:
    """Raise one :class:`SrolloutError` line naming the first file of ``path`` that cannot load.

    Checks config.json (parses, names a ``model_type``), the weights (a whole safetensors file,
    or the index / ``.bin`` transformers also reads), and with ``tokenizer`` the tokenizer files
    that exist (tokenizer.json, tokenizer_config.json parse). ``rebuild``: the command that
    makes the directory again, added to the message. A stage checks its model once, when its
    plan resolves ``--model`` (:func:`srollout.stages.rollout_setup.plan_model`).
    """
    hint = f"; rebuild it with `{rebuild}`" if rebuild else ""
    if not path.is_dir():
        raise SrolloutError(f"{path}: no such model directory{hint}")
    config = _read_json(path / "config.json", hint)
    if "model_type" not in config:
        raise SrolloutError(
            f"{path / 'config.json'}: no model_type, not a transformers model config{hint}"
        )
    known = _known_model_types()
    if known is not None and config["model_type"] not in known:
        raise SrolloutError(
            f"{path / 'config.json'}: model_type {config['model_type']!r} is not one this "
            f"transformers knows (a newer release, or a config of something else){hint}"
        )
    present = [n for n in WEIGHT_FILES if (path / n).is_file()]
    if not present:
        raise SrolloutError(f"{path / WEIGHT_FILES[0]}: missing (no weights in {path}){hint}")
    if present[0] == "model.safetensors":
        check_safetensors(path / "model.safetensors", hint)
        _check_embedding(path, config, hint)
    elif present[0].endswith(".index.json"):
        index = _read_json(path / present[0], hint)
        for shard in sorted(set(index.get("weight_map", {}).values())):
            if shard.endswith(".safetensors"):
                check_safetensors(path / shard, hint)
            elif not (path / shard).is_file():
                raise SrolloutError(f"{path / shard}: missing (named in {present[0]}){hint}")
    if tokenizer:
        if not any((path / n).is_file() for n in TOKENIZER_FILES):
            raise SrolloutError(
                f"{path}: no tokenizer files ({', '.join(TOKENIZER_FILES[:2])}, …){hint}"
            )
        for name in ("tokenizer.json", "tokenizer_config.json"):
            if (path / name).is_file():
                _read_json(path / name, hint)


def _known_model_types() -> frozenset[str] | None:
    """The model types transformers can build (its auto-config table; the module is light), or
    None when transformers is not installed (then the loader has the last word)."""
    try:
        from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES
    except ImportError:
        return None
    return frozenset(CONFIG_MAPPING_NAMES)


def _check_embedding(path: Path, config: dict, hint: str) -> None:
    """The token embedding in the weights has the shape config.json describes ([vocab_size,
    hidden_size]): a config.json from another model otherwise fails deep inside the loader."""
    vocab, hidden = config.get("vocab_size"), config.get("hidden_size")
    if not isinstance(vocab, int) or not isinstance(hidden, int):
        return
    shapes = safetensors_shapes(path / "model.safetensors")
    embed = next((k for k in shapes if k.endswith("embed_tokens.weight")), None)
    if embed is not None and shapes[embed] != [vocab, hidden]:
        raise SrolloutError(
            f"{path / 'config.json'}: says vocab_size {vocab} and hidden_size {hidden}, but the "
            f"weights' {embed} is {shapes[embed]}; config.json and model.safetensors are of "
            f"different models{hint}"
        )


def file_sha256(path: Path) -> str:
    """Hex sha256 of a file, read in 1 MiB blocks; hashed once per process while its size and
    mtime stay the same (every ``resolve_model`` call would re-read a 93 MB GGUF, ~0.3 s)."""
    path = Path(path).resolve()
    stat = path.stat()
    return _sha256(path, stat.st_size, stat.st_mtime_ns)


@functools.cache
def _sha256(path: Path, size: int, mtime_ns: int) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def model_provenance(path: Path, shipped: Path) -> dict:
    """What a run's manifest records of the model it rolled out: the directory, whether it is the
    shipped default policy (``shipped``), its build's config hash and precision (built models),
    and the first 16 hex digits of the weights' sha256, so two runs can be told apart by their
    weights (hashed once per process, :func:`file_sha256`)."""
    path = Path(path)
    record: dict = {"path": str(path), "shipped_default": path.resolve() == Path(shipped).resolve()}
    build = path / "build.json"
    if build.is_file():
        info = json.loads(build.read_text())
        record.update(config_hash=info.get("config_hash"), precision=info.get("precision"))
    weights = path / "model.safetensors"
    if weights.is_file():
        record["weights_sha256"] = file_sha256(weights)[:16]
    return record


_ARCH_KEYS = ("model_type", "hidden_size", "num_hidden_layers", "num_attention_heads", "vocab_size")


def check_adapter(adapter: Path, model: Path) -> None:
    """A peft LoRA adapter directory that can go on ``model``: adapter_config.json parses, and the
    base model it was trained on (``base_model_name_or_path``, when that directory exists here)
    has the same architecture as ``model`` (model type, sizes, vocabulary)."""
    adapter, model = Path(adapter), Path(model)
    if not adapter.is_dir():
        raise SrolloutError(f"--adapter {adapter}: no such directory")
    cfg = _read_json(adapter / "adapter_config.json", " (not a peft adapter directory)")
    if not any((adapter / n).is_file() for n in ("adapter_model.safetensors", "adapter_model.bin")):
        raise SrolloutError(
            f"{adapter / 'adapter_model.safetensors'}: missing (no adapter weights)"
        )
    if (adapter / "adapter_model.safetensors").is_file():
        check_safetensors(adapter / "adapter_model.safetensors")
        if (model / "model.safetensors").is_file():
            _check_adapter_shapes(adapter, model)
    base = Path(str(cfg.get("base_model_name_or_path") or "")).expanduser()
    if str(base) and (base / "config.json").is_file() and base.resolve() != model.resolve():
        theirs = _read_json(base / "config.json", "")
        ours = _read_json(model / "config.json", "")
        differ = [k for k in _ARCH_KEYS if theirs.get(k) != ours.get(k)]
        if differ:
            raise SrolloutError(
                f"--adapter {adapter}: trained on {base}, whose {', '.join(differ)} differ from "
                f"{model}'s; pass that model as --model"
            )


def _check_adapter_shapes(adapter: Path, model: Path) -> None:
    """Every LoRA matrix of the adapter fits the module of ``model`` it goes on: lora_A is
    [r, in_features] and lora_B [out_features, r] of that module's 2-D weight (stored [out, in],
    or [in, out] by GPT-2-style Conv1D layers, hence "one of its sizes"). An adapter trained on
    another base model fails here, by name, instead of deep in peft's loader. A module whose
    weight cannot be found under a known naming is left to peft."""
    base = safetensors_shapes(model / "model.safetensors")
    for key, shape in sorted(safetensors_shapes(adapter / "adapter_model.safetensors").items()):
        for part, dim in ((".lora_A.weight", 1), (".lora_B.weight", 0)):
            if not key.endswith(part) or len(shape) != 2:
                continue
            module = key[: -len(part)].removeprefix("base_model.model.")
            names = module.split(".")
            target = next(
                (
                    base[w]
                    for i in range(len(names))
                    if (w := ".".join(names[i:]) + ".weight") in base
                ),
                None,
            )
            if target is not None and len(target) == 2 and shape[dim] not in target:
                raise SrolloutError(
                    f"--adapter {adapter}: {key} is {shape} but {model}'s {module}.weight is "
                    f"{target}; it was trained on another base model (pass that model as --model)"
                )
