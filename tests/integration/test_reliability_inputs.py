"""Damaged model, tokenizer, adapter and gate files: one line and exit 2 from every command that
takes them, never a traceback, and no run directory left behind (docs/reliability.md).

Every (damage, command) pair goes through the CLI's entry point in this process (`run_cli`:
``srollout.cli.app.main``, the console script's own function); each damage also goes once
through a real `srollout` process, whose whole stderr must be that one line.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _rewrite_json(path: Path, change: Callable[[dict], None]) -> None:
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))


def _no_chat_template(model: Path) -> None:
    (model / "chat_template.jinja").unlink(missing_ok=True)
    _rewrite_json(model / "tokenizer_config.json", lambda c: c.pop("chat_template", None))


# damage -> (how to make it from a copy of the shipped model, the words the one line must hold)
MODEL_DAMAGE: dict[str, tuple[Callable[[Path], None], str]] = {
    "config-unparseable": (
        lambda m: (m / "config.json").write_text("{bad"),
        "config.json: not valid JSON",
    ),
    "config-missing": (lambda m: (m / "config.json").unlink(), "no config.json"),
    "config-unknown-type": (
        lambda m: _rewrite_json(m / "config.json", lambda c: c.update(model_type="nosuch")),
        "model_type 'nosuch' is not one this transformers knows",
    ),
    "config-of-another-model": (
        lambda m: _rewrite_json(m / "config.json", lambda c: c.update(hidden_size=128)),
        "config.json and model.safetensors are of different models",
    ),
    "weights-truncated": (
        lambda m: os.truncate(m / "model.safetensors", 100_000),
        "model.safetensors: truncated",
    ),
    "weights-missing": (lambda m: (m / "model.safetensors").unlink(), "model.safetensors: missing"),
    "tokenizer-unparseable": (
        lambda m: (m / "tokenizer.json").write_text('{"x":'),
        "tokenizer.json: not valid JSON",
    ),
    "tokenizer-missing": (lambda m: (m / "tokenizer.json").unlink(), "no tokenizer files"),
    "no-chat-template": (_no_chat_template, "has no chat template"),
}
# commands that read the recorded token ids only, or never build a prompt, do not need a template
NEEDS_TEMPLATE = ("collect", "ab-rollout", "train-onpolicy")

GATE_DAMAGE: dict[str, tuple[str | bytes, str]] = {
    "another-kind": ('{"kind": "learned", "version": 1}', "gate is missing"),
    "unknown-kind": ('{"kind": "magic", "version": 1}', "unknown gate kind 'magic'"),
    "not-an-object": ("[1, 2]", "a gate must be a JSON object"),
    "not-json": ("{kind: threshold", "not valid JSON"),
    "binary": (b"PAR1\x00\x15\x04\xff\xfe", "cannot read gate file"),
    "out-of-range": (
        '{"kind": "threshold", "version": 1, "rule": "r1", "K": 10, "d_L": 5, "t_high": null}',
        "d_L must be in [0, 1]",
    ),
    "audited-nan-floor": (
        '{"kind": "audited", "version": 1, "audit": 0.5, "precision_floor": NaN, "base": '
        '{"kind": "threshold", "rule": "r1", "K": 10, "d_L": 0.1, "t_high": null}}',
        "precision_floor must be a number in (0.0, 1.0], got nan",
    ),
    "audited-no-base": (
        '{"kind": "audited", "version": 1, "audit": 0.5, "precision_floor": 0.85}',
        "gate is missing 'base'",
    ),
    "newer-version": (
        '{"kind": "threshold", "version": 99, "rule": "r1", "K": 10, "d_L": 0.1, "t_high": null}',
        "version 99 is not supported",
    ),
}


@pytest.fixture(scope="module")
def lm_buffer(tmp_path_factory, default_model) -> Path:
    """A tiny collect run of the shipped policy (token ids recorded): train-offpolicy's input."""
    from srollout.config import CollectConfig
    from srollout.stages.collect import run_collect

    out = tmp_path_factory.mktemp("buffer") / "run"
    run_collect(CollectConfig(groups=2, G=2, T_max=3, signal_K=(2,), out=out), progress=False)
    return out


def _commands(model: Path, out: Path, buffer: Path) -> dict[str, list[str]]:
    m = str(model)
    return {
        "collect": [
            "collect",
            "--model",
            m,
            "--groups",
            "1",
            "--G",
            "2",
            "--T-max",
            "3",
            "--out",
            str(out),
        ],
        "ab-rollout": [
            "ab-rollout",
            "--model",
            m,
            "--groups",
            "1",
            "--G",
            "2",
            "--T-max",
            "3",
            "--K",
            "2",
            "--out",
            str(out),
        ],
        "train-onpolicy": [
            "train-onpolicy",
            "--preset",
            "tiny",
            "--seeds",
            "7",
            "--iterations",
            "1",
            "--model",
            m,
            "--out",
            str(out),
        ],
        "train-offpolicy": [
            "train-offpolicy",
            str(buffer),
            "--steps",
            "1",
            "--K",
            "2",
            "--groups-per-step",
            "2",
            "--model",
            m,
            "--out",
            str(out),
        ],
        "serve": ["serve", m, "--dry-run"],
        "policy info": ["policy", "info", m],
    }


def _damaged(tmp_path: Path, default_model: Path, damage: str) -> Path:
    model = tmp_path / f"model-{damage}"
    shutil.copytree(default_model, model)
    MODEL_DAMAGE[damage][0](model)
    return model


def _one_line_exit_2(res, words: str, out: Path | None) -> None:
    assert res.exit_code == 2, (res.exit_code, res.stderr[-1500:])
    lines = [line for line in res.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and words in lines[0], res.stderr
    assert "Traceback" not in res.stderr + res.stdout
    if out is not None:
        assert not out.exists(), f"{out} was left behind"


@pytest.mark.parametrize("damage", list(MODEL_DAMAGE))
def test_a_damaged_model_is_one_line_for_every_command(
    damage, run_cli, default_model, lm_buffer, tmp_path
):
    model = _damaged(tmp_path, default_model, damage)
    out = tmp_path / "out"
    for command, args in _commands(model, out, lm_buffer).items():
        if damage == "no-chat-template" and command not in NEEDS_TEMPLATE:
            continue
        words = MODEL_DAMAGE[damage][1]
        _one_line_exit_2(run_cli(*args), words, out if "--out" in args else None)


def test_an_adapter_of_another_base_model_is_one_line(run_cli, default_model, tmp_path):
    """A LoRA adapter trained on a smaller Qwen2 (hidden 128), whose base is not on this machine."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, Qwen2Config

    torch.manual_seed(0)
    other = AutoModelForCausalLM.from_config(
        Qwen2Config(
            hidden_size=128,
            intermediate_size=256,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            vocab_size=712,
        )
    )
    adapter = tmp_path / "adapter"
    lora = LoraConfig(r=2, lora_alpha=4, target_modules=["q_proj", "v_proj"])
    get_peft_model(other, lora).save_pretrained(adapter)
    _rewrite_json(
        adapter / "adapter_config.json",
        lambda c: c.update(base_model_name_or_path="someone/other-model"),
    )
    out = tmp_path / "out"
    for command in ("collect", "ab-rollout"):
        args = [
            command,
            "--adapter",
            str(adapter),
            "--groups",
            "1",
            "--G",
            "2",
            "--T-max",
            "3",
            "--K",
            "2",
            "--out",
            str(out),
        ]
        _one_line_exit_2(run_cli(*args), "it was trained on another base model", out)


@pytest.mark.parametrize("damage", list(GATE_DAMAGE))
def test_a_bad_gate_file_is_one_line_for_every_command(damage, run_cli, lm_buffer, tmp_path):
    content, words = GATE_DAMAGE[damage]
    gate = tmp_path / "gate.json"
    gate.write_bytes(content if isinstance(content, bytes) else content.encode())
    out = tmp_path / "out"
    for args in (
        [
            "collect",
            "--policy",
            "noisy-expert",
            "--gate",
            gate,
            "--groups",
            "1",
            "--G",
            "2",
            "--T-max",
            "12",
        ],
        [
            "ab-rollout",
            "--policy",
            "noisy-expert",
            "--gate",
            gate,
            "--groups",
            "1",
            "--G",
            "2",
            "--T-max",
            "12",
        ],
        ["train-onpolicy", "--preset", "tiny", "--seeds", "7", "--iterations", "1", "--gate", gate],
        ["train-offpolicy", lm_buffer, "--steps", "1", "--groups-per-step", "2", "--gate", gate],
    ):
        _one_line_exit_2(run_cli(*args, "--out", out), words, out)


# In a real process the damages found from the files alone take about a second; the others are
# found once torch and transformers are loaded, 4-9 s each on 2 loaded cores: slow.
QUICK_IN_A_PROCESS = ("config-unparseable", "config-missing", "gate")


@pytest.mark.parametrize(
    "damage",
    [
        d if d in QUICK_IN_A_PROCESS else pytest.param(d, marks=pytest.mark.slow)
        for d in [*MODEL_DAMAGE, "gate"]
    ],
)
def test_a_real_process_prints_only_the_line(damage, default_model, tmp_path):
    """The same through a real `srollout` process: its whole stderr is the one line, exit 2."""
    out = tmp_path / "out"
    if damage == "gate":
        gate = tmp_path / "gate.json"
        gate.write_text('{"kind": "learned", "version": 1}')
        args = ["collect", "--policy", "noisy-expert", "--gate", str(gate), "--out", str(out)]
        words = "gate is missing"
    else:
        model = _damaged(tmp_path, default_model, damage)
        args = [
            "collect",
            "--model",
            str(model),
            "--groups",
            "1",
            "--G",
            "2",
            "--T-max",
            "3",
            "--out",
            str(out),
        ]
        words = MODEL_DAMAGE[damage][1]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "COLUMNS": "400"}
    env.pop("SROLLOUT_DEBUG", None)
    done = subprocess.run(
        [sys.executable, "-m", "srollout.cli.app", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd=ROOT,
    )
    assert done.returncode == 2, done.stderr[-1500:]
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and words in lines[0], done.stderr
    assert not out.exists()


def test_an_adapter_of_the_same_base_model_passes_the_check(default_model, tmp_path):
    """The check must not refuse what peft would load: a fresh LoRA adapter on the shipped model."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from srollout.policy.model_files import check_adapter

    model = AutoModelForCausalLM.from_pretrained(default_model)
    adapter = tmp_path / "adapter"
    lora = LoraConfig(
        r=4, lora_alpha=8, target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "up_proj"]
    )
    get_peft_model(model, lora).save_pretrained(adapter)
    check_adapter(adapter, default_model)
