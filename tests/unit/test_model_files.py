"""check_model_dir / check_safetensors: a damaged model file is named, in one line, before
loading."""

from __future__ import annotations

import json
import struct

import pytest

from srollout.errors import SrolloutError
from srollout.policy.model_files import check_model_dir, check_safetensors


def write_safetensors(path, n_floats: int = 4) -> int:
    """A real safetensors file by hand: one float32 tensor of ``n_floats`` values. Returns its size
    (8 + header + 4 * n_floats bytes)."""
    header = json.dumps(
        {"w": {"dtype": "F32", "shape": [n_floats], "data_offsets": [0, 4 * n_floats]}}
    ).encode()
    path.write_bytes(struct.pack("<Q", len(header)) + header + b"\0" * (4 * n_floats))
    return 8 + len(header) + 4 * n_floats


def model_dir(tmp_path):
    d = tmp_path / "m"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"model_type": "qwen2"}))
    write_safetensors(d / "model.safetensors")
    (d / "tokenizer.json").write_text("{}")
    return d


def test_a_whole_file_passes_and_its_size_is_what_the_header_says(tmp_path):
    size = write_safetensors(tmp_path / "w.safetensors", n_floats=4)
    assert (tmp_path / "w.safetensors").stat().st_size == size  # 8 + header + 16
    check_safetensors(tmp_path / "w.safetensors")


@pytest.mark.parametrize(("cut", "word"), [(1, "truncated"), (-3, "trailing bytes")])
def test_one_byte_short_or_extra_is_named(tmp_path, cut, word):
    f = tmp_path / "w.safetensors"
    size = write_safetensors(f)
    data = f.read_bytes()
    f.write_bytes(data[: size - cut] if cut > 0 else data + b"\0" * -cut)
    with pytest.raises(SrolloutError, match=word) as err:
        check_safetensors(f)
    assert str(f) in str(err.value) and "\n" not in str(err.value)
    assert f"the header says {size}" in str(err.value)


def test_a_file_cut_inside_its_header(tmp_path):
    f = tmp_path / "w.safetensors"
    write_safetensors(f)
    f.write_bytes(f.read_bytes()[:20])
    with pytest.raises(SrolloutError, match="truncated"):
        check_safetensors(f)


def test_model_dir_names_the_broken_config_and_the_rebuild_command(tmp_path):
    d = model_dir(tmp_path)
    check_model_dir(d)
    (d / "config.json").write_text('{"model_type": "qwen2",')
    with pytest.raises(SrolloutError, match="config.json: not valid JSON") as err:
        check_model_dir(d, rebuild="srollout policy build --replace-shipped")
    assert str(err.value).endswith("rebuild it with `srollout policy build --replace-shipped`")


def test_model_dir_without_weights_or_model_type(tmp_path):
    d = model_dir(tmp_path)
    (d / "model.safetensors").unlink()
    with pytest.raises(SrolloutError, match=r"model.safetensors: missing \(no weights"):
        check_model_dir(d)
    write_safetensors(d / "model.safetensors")
    (d / "config.json").write_text("{}")
    with pytest.raises(SrolloutError, match="no model_type"):
        check_model_dir(d)


def test_model_dir_with_a_broken_tokenizer(tmp_path):
    d = model_dir(tmp_path)
    (d / "tokenizer.json").write_text("{")
    with pytest.raises(SrolloutError, match="tokenizer.json: not valid JSON"):
        check_model_dir(d)
    check_model_dir(d, tokenizer=False)


def test_a_model_runs_in_bf16_only_where_its_srollout_json_asks_and_the_cpu_has_it(
    tmp_path, monkeypatch
):
    from srollout.policy import model_files

    monkeypatch.setattr(model_files, "native_bf16", lambda: True)
    assert model_files.model_dtype(tmp_path) == "float32"  # no srollout.json: the default
    (tmp_path / "srollout.json").write_text(json.dumps({"system_prompt": "x"}))
    assert model_files.model_dtype(tmp_path) == "float32"
    (tmp_path / "srollout.json").write_text(json.dumps({"system_prompt": "x", "dtype": "bfloat16"}))
    assert model_files.model_dtype(tmp_path) == "bfloat16"
    monkeypatch.setattr(model_files, "native_bf16", lambda: False)  # emulated bf16 is slow
    assert model_files.model_dtype(tmp_path) == "float32"
    (tmp_path / "srollout.json").write_text(json.dumps({"system_prompt": "x", "dtype": "fp16"}))
    with pytest.raises(SrolloutError, match=r"srollout.json: dtype 'fp16': give float32 or bf"):
        model_files.model_dtype(tmp_path)
    (tmp_path / "srollout.json").write_text("{")
    with pytest.raises(SrolloutError, match=r"srollout.json: not valid JSON"):
        model_files.model_dtype(tmp_path)
    # what the vLLM engine is given on a CPU (the transformers backend takes the same dtype)
    from srollout.policy import vllm_backend

    monkeypatch.setattr(vllm_backend, "on_cpu", lambda: True)
    monkeypatch.setattr(model_files, "native_bf16", lambda: True)
    (tmp_path / "srollout.json").write_text(json.dumps({"system_prompt": "x", "dtype": "bfloat16"}))
    kwargs = dict(lora=False, max_lora_rank=8, max_model_len=None, gpu_memory_utilization=0.5)
    assert (
        vllm_backend.engine_kwargs(tmp_path, **kwargs, enforce_eager=False)["dtype"] == "bfloat16"
    )
