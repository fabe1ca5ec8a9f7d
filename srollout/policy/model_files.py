"""Check a Hugging Face model directory before anything loads it: one line per damaged file.

transformers and safetensors answer a broken file with a traceback deep inside their loaders
(a truncated ``model.safetensors`` even loads partly). Reading the few bytes that say whether a
file is whole costs milliseconds, so every command checks first and names the file.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

from srollout.errors import SrolloutError

WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
                "pytorch_model.bin.index.json")


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


def check_safetensors(path: Path, hint: str = "") -> None:
    """A safetensors file is whole: its header parses and the tensors it lists end exactly at
    the end of the file (8-byte little-endian header length, JSON header, then the data)."""
    try:
        size = path.stat().st_size
        with path.open("rb") as f:
            head = f.read(8)
            if len(head) < 8:
                raise SrolloutError(f"{path}: truncated ({size} bytes, no safetensors header){hint}")
            (n,) = struct.unpack("<Q", head)
            if n > size - 8:
                raise SrolloutError(f"{path}: truncated (header of {n} bytes, file of {size}){hint}")
            header = json.loads(f.read(n))
    except FileNotFoundError:
        raise SrolloutError(f"{path}: missing{hint}") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise SrolloutError(f"{path}: not a safetensors file ({err}){hint}") from None
    ends = [v["data_offsets"][1] for k, v in header.items() if k != "__metadata__" and isinstance(v, dict)]
    if not ends:
        raise SrolloutError(f"{path}: holds no tensors{hint}")
    want = 8 + n + max(ends)
    if size != want:
        raise SrolloutError(f"{path}: {'truncated' if size < want else 'has trailing bytes'} "
                            f"({size} bytes, the header says {want}){hint}")


def check_model_dir(path: Path, *, rebuild: str | None = None, tokenizer: bool = True) -> None:
    """Raise one :class:`SrolloutError` line naming the first file of ``path`` that cannot load.

    Checks config.json (parses, names a ``model_type``), the weights (a whole safetensors file,
    or the index / ``.bin`` transformers also reads), and with ``tokenizer`` the tokenizer files
    that exist (tokenizer.json, tokenizer_config.json parse). ``rebuild``: the command that
    makes the directory again, added to the message.
    """
    hint = f"; rebuild it with `{rebuild}`" if rebuild else ""
    if not path.is_dir():
        raise SrolloutError(f"{path}: no such model directory{hint}")
    config = _read_json(path / "config.json", hint)
    if "model_type" not in config:
        raise SrolloutError(f"{path / 'config.json'}: no model_type, not a transformers model config{hint}")
    present = [n for n in WEIGHT_FILES if (path / n).is_file()]
    if not present:
        raise SrolloutError(f"{path / WEIGHT_FILES[0]}: missing (no weights in {path}){hint}")
    if present[0] == "model.safetensors":
        check_safetensors(path / "model.safetensors", hint)
    elif present[0].endswith(".index.json"):
        index = _read_json(path / present[0], hint)
        for shard in sorted(set(index.get("weight_map", {}).values())):
            if shard.endswith(".safetensors"):
                check_safetensors(path / shard, hint)
            elif not (path / shard).is_file():
                raise SrolloutError(f"{path / shard}: missing (named in {present[0]}){hint}")
    if tokenizer:
        for name in ("tokenizer.json", "tokenizer_config.json"):
            if (path / name).is_file():
                _read_json(path / name, hint)


def model_provenance(path: Path, shipped: Path) -> dict:
    """What a run's manifest records of the model it rolled out: the directory, whether it is the
    shipped default policy (``shipped``), its build's config hash and precision (built models),
    and the first 16 hex digits of the weights' sha256, so two runs can be told apart by their
    weights."""
    import hashlib

    path = Path(path)
    record: dict = {"path": str(path), "shipped_default": path.resolve() == Path(shipped).resolve()}
    build = path / "build.json"
    if build.is_file():
        info = json.loads(build.read_text())
        record.update(config_hash=info.get("config_hash"), precision=info.get("precision"))
    weights = path / "model.safetensors"
    if weights.is_file():
        digest = hashlib.sha256()
        with weights.open("rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
        record["weights_sha256"] = digest.hexdigest()[:16]
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
        raise SrolloutError(f"{adapter / 'adapter_model.safetensors'}: missing (no adapter weights)")
    if (adapter / "adapter_model.safetensors").is_file():
        check_safetensors(adapter / "adapter_model.safetensors")
    base = Path(str(cfg.get("base_model_name_or_path") or "")).expanduser()
    if str(base) and (base / "config.json").is_file() and base.resolve() != model.resolve():
        theirs = _read_json(base / "config.json", "")
        ours = _read_json(model / "config.json", "")
        differ = [k for k in _ARCH_KEYS if theirs.get(k) != ours.get(k)]
        if differ:
            raise SrolloutError(f"--adapter {adapter}: trained on {base}, whose {', '.join(differ)} differ from "
                                f"{model}'s; pass that model as --model")
