"""The default policy the package ships: its recipe is the code's, it loads with no build, and a
damaged copy is one line naming the file and the command that rebuilds it."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import pytest

from srollout.default_policy import REBUILD_SHIPPED, SHIPPED_DIR, default_policy
from srollout.default_policy.build import BUILD_VERSION, config_hash
from srollout.default_policy.recipe import BuildConfig


def _build() -> dict:
    return json.loads((SHIPPED_DIR / "build.json").read_text())


def test_the_shipped_build_is_the_recipe_in_code():
    # A recipe change in BuildConfig without `srollout policy build --replace-shipped` fails here,
    # so the package never carries weights of another recipe. bf16 is what the build machine
    # used (fp32 where its CPU has no native bf16), so it is taken from the record.
    info = _build()
    recipe = dataclasses.replace(BuildConfig(), bf16=info["config"]["bf16"])
    in_code = json.loads(json.dumps(dataclasses.asdict(recipe)))  # tuples -> lists, as stored
    assert info["config"] == in_code
    assert info["config_hash"] == config_hash(recipe)
    assert info["builder"] == f"srollout default policy {BUILD_VERSION}"
    assert info["precision"] == ("bf16 autocast" if recipe.bf16 else "fp32")
    assert {"cpu", "native_bf16", "torch", "date"} <= set(info["built_on"])


def test_the_shipped_model_is_whole_and_small():
    assert default_policy() == SHIPPED_DIR
    total = sum(f.stat().st_size for f in SHIPPED_DIR.iterdir())
    assert total <= 15 * 2**20, f"{total / 2**20:.1f} MiB in the repository"
    cfg = json.loads((SHIPPED_DIR / "config.json").read_text())
    info = _build()
    assert (cfg["hidden_size"], cfg["num_hidden_layers"]) == (
        info["config"]["d_model"],
        info["config"]["n_layers"],
    )
    assert json.loads((SHIPPED_DIR / "tokenizer_config.json").read_text())["chat_template"]


def test_the_shipped_model_loads_and_plays_greedy_groups(run_cli, tmp_path):
    pytest.importorskip("torch")
    import polars as pl

    out = tmp_path / "run"
    res = run_cli(
        "collect",
        "--groups",
        "2",
        "--G",
        "2",
        "--T-max",
        "4",
        "--temperature",
        "0",
        "--signal-K",
        "2",
        "--out",
        out,
    )
    assert res.exit_code == 0, res
    steps = pl.read_parquet(out / "steps.parquet")
    # greedy: both trajectories of a group take the same actions; the model plays the game
    per = steps.pivot(on="traj_idx", index=["group_id", "step"], values="action")
    assert per.height >= 2 and (per["0"] == per["1"]).all()
    assert steps.filter(pl.col("step") == 1)["valid"].all()
    model = json.loads((out / "manifest.json").read_text())["model"]
    assert model["shipped_default"] and model["path"] == str(SHIPPED_DIR)
    assert model["config_hash"] == _build()["config_hash"] and len(model["weights_sha256"]) == 16


def _damaged(tmp_path: Path, how: str) -> Path:
    copy = tmp_path / "model"
    shutil.copytree(SHIPPED_DIR, copy)
    if how == "truncated":
        data = (copy / "model.safetensors").read_bytes()
        (copy / "model.safetensors").write_bytes(data[: len(data) // 2])
    elif how == "missing":
        (copy / "model.safetensors").unlink()
    else:
        (copy / "config.json").write_text("{ not json")
    return copy


@pytest.mark.parametrize(
    ("how", "file"),
    [
        ("truncated", "model.safetensors"),
        ("missing", "model.safetensors"),
        ("config", "config.json"),
    ],
)
def test_a_damaged_default_is_one_line_naming_the_file_and_the_rebuild(
    run_cli, tmp_path, monkeypatch, how, file
):
    monkeypatch.setattr("srollout.policy.shipped.SHIPPED_DIR", _damaged(tmp_path, how))
    for args in (
        ["collect", "--groups", "1", "--G", "2", "--T-max", "2", "--out", tmp_path / "run"],
        ["policy", "info", "default"],
    ):
        res = run_cli(*args)
        assert res.exit_code == 2, res
        err = " ".join(res.stderr.split())
        assert file in err and REBUILD_SHIPPED in err, err
        assert "Traceback" not in res.stderr + res.stdout


def test_info_says_the_shipped_model_is_in_use_and_compares_a_cache_rebuild(
    run_cli, tmp_path, monkeypatch
):
    from srollout.default_policy.build import default_policy_dir

    monkeypatch.setenv("SROLLOUT_HOME", str(tmp_path / "home"))
    res = run_cli("policy", "info", "default")
    assert res.exit_code == 0, res
    assert "the shipped model" in res.stdout and "cache rebuild" not in res.stdout
    assert "bf16 autocast" in res.stdout or "fp32" in res.stdout
    shutil.copytree(SHIPPED_DIR, default_policy_dir())  # a rebuild with bit-identical weights
    res = run_cli("policy", "info", "default")
    assert "weights identical to the shipped" in " ".join(res.stdout.split())
