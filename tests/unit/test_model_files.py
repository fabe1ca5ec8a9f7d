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
