"""`srollout policy info|build` through Typer's runner."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")
from typer.testing import CliRunner  # noqa: E402

from srollout.cli.policy import policy_app  # noqa: E402
from srollout.errors import SrolloutError  # noqa: E402


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from tiny_policy import build_tiny_policy

    return build_tiny_policy(tmp_path_factory.mktemp("cli") / "m")


def test_info_shows_the_model(tiny):
    res = CliRunner().invoke(policy_app, ["info", str(tiny)])
    assert res.exit_code == 0, res.output
    assert "Qwen2ForCausalLM" in res.output
    assert "chat template" in res.output and "yes" in res.output
    assert "parameters" in res.output


def test_info_on_a_non_model_is_a_user_error(tmp_path):
    res = CliRunner().invoke(policy_app, ["info", str(tmp_path)])
    assert isinstance(res.exception, SrolloutError)


def test_info_default_without_the_shipped_model_says_how_to_rebuild(tmp_path, monkeypatch):
    monkeypatch.setattr("srollout.policy.shipped.SHIPPED_DIR", tmp_path / "absent")
    res = CliRunner().invoke(policy_app, ["info", "default"])
    assert isinstance(res.exception, SrolloutError)
    assert "srollout policy build --replace-shipped" in str(res.exception)


def test_build_rejects_bad_sizes(tmp_path):
    res = CliRunner().invoke(policy_app, ["build", "--out", str(tmp_path / "m"), "--epochs", "0"])
    assert isinstance(res.exception, SrolloutError)


def test_build_small_policy_end_to_end(tmp_path, monkeypatch):
    # the real pipeline on the real engine: 6 train games, a 1-layer model (seconds)
    pytest.importorskip("alfworld")
    monkeypatch.setenv("SROLLOUT_HOME", str(tmp_path / "home"))
    out = tmp_path / "m"
    args = [
        "build",
        "--out",
        str(out),
        "--n-demo-tasks",
        "6",
        "--demos-per-task",
        "1",
        "--d-model",
        "48",
        "--n-layers",
        "1",
        "--threads",
        "1",
    ]
    res = CliRunner().invoke(policy_app, args)
    assert res.exit_code == 0, res.output
    # off a terminal each phase is the stages' bar, printing plain lines; a fresh home
    # generates its 6 games first
    assert "generating games: 6/6 games" in res.output, res.output
    assert "demonstrations: 6/6 episodes" in res.output, res.output
    assert res.output.index("generating games: 6/6") < res.output.index("demonstrations: 6/6")
    assert "SFT: " in res.output and " steps loss " in res.output
    assert ": SFT in " in res.output  # the precision used is said (bf16 autocast or fp32)
    for name in (
        "config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
        "build.json",
        "srollout.json",
    ):
        assert (out / name).is_file()
    # the default build is fine-tuned on its own short prompt, which every stage then sends
    from srollout.default_policy.build import DEFAULT_POLICY_PROMPT
    from srollout.envs.prompts import system_prompt_for
    from srollout.policy.chat import first_turn_text
    from srollout.stages.rollout_setup import plan_model, plan_rollout

    assert system_prompt_for(out) == DEFAULT_POLICY_PROMPT
    from srollout.config import CollectConfig

    config = CollectConfig(model=out)
    assert plan_model(config) == out
    assert plan_rollout(config, check_env=False).prompter().system(None) == DEFAULT_POLICY_PROMPT
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(out)  # the saved tokenizer renders the compact template
    assert first_turn_text(tok, "S", "U") == "<|system|>S<|im_end|><|user|>U<|im_end|><|assistant|>"
    again = CliRunner().invoke(policy_app, args)
    assert "already built" in again.output


@pytest.mark.parametrize(
    "option, value, message",
    [
        ("--take", "eager", "BuildConfig.take: expected one of planned, greedy"),
        ("--difficulty", "huge", "BuildConfig.difficulty: expected one of small, medium"),
        ("--user-template", "Obs: {obs}", "`user_template` must be a string with {observation}"),
    ],
)
def test_build_refuses_a_bad_recipe_option_before_any_work(
    option, value, message, tmp_path, monkeypatch
):
    import re

    monkeypatch.setenv("SROLLOUT_HOME", str(tmp_path / "home"))
    res = CliRunner().invoke(policy_app, ["build", option, value])
    assert isinstance(res.exception, SrolloutError)
    assert re.search(re.escape(message), str(res.exception))
    assert not (tmp_path / "home").exists()  # no games generated, nothing cached


@pytest.mark.parametrize(
    "args, message",
    [
        (["--base", "smollm2-135m", "--epochs", "3"], "--epochs do not apply (only --seed, --th"),
        (["--sft-from", "x"], "--sft-from: only with --base (an adapter build)"),
        (["--base", "smollm2-135m", "--sft-from", "nowhere"], "--sft-from nowhere: not a finis"),
    ],
)
def test_adapter_build_options_are_checked_before_any_work(args, message, tmp_path, monkeypatch):
    monkeypatch.setenv("SROLLOUT_HOME", str(tmp_path / "home"))
    res = CliRunner().invoke(policy_app, ["build", "--out", str(tmp_path / "a"), *args])
    assert isinstance(res.exception, SrolloutError), res.output
    assert message in str(res.exception)
    assert not (tmp_path / "a").exists() and not (tmp_path / ".a.work").exists()


AT_DEFAULTS = [
    "--correction-rounds",
    "0",
    "--correction-beta",
    "0.5",
    "--correction-beta-decay",
    "1",
]


@pytest.mark.parametrize(
    "args, rounds, beta, decay", [([], 2, 0.3, 0.0), (AT_DEFAULTS, 0, 0.5, 1.0)]
)
def test_an_adapter_build_takes_a_dagger_option_given_even_at_the_configs_default(
    args, rounds, beta, decay, tmp_path, monkeypatch
):
    # the shipped recipe has 2 rounds from beta 0.3 (decay 0: the model alone in round 2); 0
    # rounds (SFT only), beta 0.5 and decay 1 are BuildConfig's defaults, and given, they still
    # win over the recipe's
    seen = []

    def fake_build(recipe, *a, **k):
        seen.append(recipe)
        raise SrolloutError("stop here")

    monkeypatch.setattr("srollout.default_policy.adapter_build.build_adapter", fake_build)
    args = ["build", "--base", "smollm2-135m", "--out", str(tmp_path / "a"), *args]
    res = CliRunner().invoke(policy_app, args)
    assert "stop here" in str(res.exception), res.output
    (recipe,) = seen
    sft = recipe.sft
    assert (sft.correction_rounds, sft.correction_beta, sft.correction_beta_decay) == (
        rounds,
        beta,
        decay,
    )
    assert recipe.sft.correction_branches == 250  # not given: the recipe's


def test_build_takes_the_recipe_options_dagger_included(tmp_path, monkeypatch):
    import json

    pytest.importorskip("alfworld")
    monkeypatch.setenv("SROLLOUT_HOME", str(tmp_path / "home"))
    out = tmp_path / "m"
    args = [
        "build",
        "--out",
        str(out),
        "--n-demo-tasks",
        "6",
        "--demos-per-task",
        "1",
        "--d-model",
        "48",
        "--n-layers",
        "1",
        "--threads",
        "1",
        "--take",
        "greedy",
        "--user-template",
        r"Observation: {observation}\nTask: {task}.",  # a typed \n
        "--max-context",
        "8192",
        "--correction-rounds",
        "1",
        "--correction-tasks",
        "2",
        "--correction-beta",
        "1",
        "--correction-relabel",
    ]
    res = CliRunner().invoke(policy_app, args)
    assert res.exit_code == 0, res.output
    info = json.loads((out / "build.json").read_text())
    cfg = info["config"]
    template = "Observation: {observation}\nTask: {task}."
    assert (cfg["take"], cfg["user_template"], cfg["max_context"]) == ("greedy", template, 8192)
    assert cfg["correction_relabel"] is True  # off by default
    # one DAgger round: 2 tasks x G=4, the expert playing every step (beta 1) wins them all
    (r,) = info["dagger_rounds"]
    assert (r["trajectories"], r["won"], r["model_steps"], r["past_context"]) == (8, 8, 0, 0)
    assert json.loads((out / "srollout.json").read_text())["user_template"] == template


@pytest.mark.slow  # ~46 s on 2 loaded cores: three builds in a fresh home (games generated)
def test_a_build_is_deterministic_from_its_seed(tmp_path, monkeypatch):
    # the real pipeline twice with one seed (two worker processes for the demonstrations, so
    # their split cannot leak in): the same tokenizer and bit-identical weights; another seed
    # plays other episodes and starts from other weights
    pytest.importorskip("alfworld")
    import torch
    from safetensors.torch import load_file

    monkeypatch.setenv("SROLLOUT_HOME", str(tmp_path / "home"))

    def build(name: str, seed: int) -> tuple[dict, str]:
        out = tmp_path / name
        args = [
            "build",
            "--out",
            str(out),
            "--n-demo-tasks",
            "4",
            "--demos-per-task",
            "1",
            "--d-model",
            "32",
            "--n-layers",
            "1",
            "--threads",
            "2",
            "--seed",
            str(seed),
        ]
        res = CliRunner().invoke(policy_app, args)
        assert res.exit_code == 0, res.output
        return load_file(out / "model.safetensors"), (out / "tokenizer.json").read_text()

    a, tok_a = build("a", 0)
    b, tok_b = build("b", 0)
    c, _ = build("c", 1)
    assert tok_a == tok_b
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert any(not torch.equal(a[k], c[k]) for k in a if a[k].shape == c[k].shape)


def test_every_size_of_the_recipe_is_checked_before_the_build():
    from srollout.default_policy.build import check_build_config
    from srollout.default_policy.recipe import BuildConfig

    check_build_config(
        BuildConfig(correction_replay=0, correction_rounds=0, seed=0)
    )  # 0 means none
    for field in ("d_ff", "head_dim", "batch_tokens", "correction_G"):
        with pytest.raises(
            SrolloutError,
            match=rf"BuildConfig.{field} \(--{field.replace('_', '-')}\) must be >= 1, got 0",
        ):
            check_build_config(BuildConfig(**{field: 0}))
    res = CliRunner().invoke(policy_app, ["build", "--out", "/nonexistent/m", "--d-ff", "0"])
    assert isinstance(res.exception, SrolloutError) and "--d-ff" in str(res.exception)
