"""One rollout-options type (srollout.config.RolloutOptions) and one CLI declaration of it
(srollout.cli.rollout_options), shared by collect, ab-rollout and train-onpolicy."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from srollout.cli.rollout_options import (
    ROLLOUT_OPTIONS,
    RUN_OPTIONS,
    config_options,
    config_values,
    flag,
)
from srollout.config import AbRolloutConfig, CollectConfig, RolloutOptions


def test_collect_and_ab_rollout_share_the_rollout_fields_and_their_checks():
    shared = [f.name for f in dataclasses.fields(RolloutOptions)]
    assert shared == list(ROLLOUT_OPTIONS)
    for cls in (CollectConfig, AbRolloutConfig):
        assert issubclass(cls, RolloutOptions)
        assert [f.name for f in dataclasses.fields(cls)][: len(shared)] == shared
    # a stage restates a field only for its own default or help
    assert (CollectConfig().groups, AbRolloutConfig().groups) == (100, 24)
    # the shared checks run in both
    for cls in (CollectConfig, AbRolloutConfig):
        with pytest.raises(Exception, match="--G must be >= 2"):
            cls(G=1)


def test_flags_follow_the_field_names():
    assert [flag(n) for n in ("T_max", "d_L", "signal_K", "top_p", "G")] == [
        "--T-max",
        "--d-L",
        "--signal-K",
        "--top-p",
        "--G",
    ]


def test_config_values_apply_quick_and_parse_signal_K():
    given = {"groups": None, "T_max": None, "signal_K": "2,4", "quick": False}
    assert config_values(CollectConfig, given) == {
        "groups": 100,
        "T_max": 30,
        "signal_K": (2, 4),
        "quick": False,
    }
    assert config_values(AbRolloutConfig, given)["groups"] == 24
    quick = config_values(CollectConfig, {**given, "quick": True})
    assert (quick["groups"], quick["T_max"]) == (8, 15)
    # an explicit value wins over --quick
    assert config_values(CollectConfig, {**given, "quick": True, "groups": 3})["groups"] == 3


def _app(**kw: Any) -> tuple[typer.Typer, list[dict[str, Any]]]:
    seen: list[dict[str, Any]] = []
    app = typer.Typer()
    names = ("G", "T_max", "signal_K", "gate", "quick")

    @app.command()
    @config_options(
        CollectConfig, names, order=("T_max", "extra", "G", "signal_K", "gate", "quick"), **kw
    )
    def command(options: dict[str, Any], extra: int = 7) -> None:
        seen.append({**options, "extra": extra})

    return app, seen


def test_the_decorator_declares_the_options_in_order_and_passes_them_as_one_dict():
    app, seen = _app()
    runner = CliRunner()
    result = runner.invoke(app, ["--G", "4", "--T-max", "6", "--signal-K", "2,3", "--extra", "9"])
    assert result.exit_code == 0, result.output
    assert seen == [
        {"G": 4, "T_max": 6, "signal_K": "2,3", "gate": None, "quick": False, "extra": 9}
    ]
    runner.invoke(app, [])
    assert seen[1] == {
        "G": 8,
        "T_max": None,
        "signal_K": "5,10,15,20",
        "gate": None,
        "quick": False,
        "extra": 7,
    }
    text = runner.invoke(app, ["--help"], env={"COLUMNS": "200", "TERM": "dumb"}).output
    order = [
        text.index(f"{o} ")
        for o in ("--T-max", "--extra", "--G", "--signal-K", "--gate", "--quick")
    ]
    assert order == sorted(order)
    assert "[default: 30]" in text  # T_max's default depends on --quick: named in its help


def test_an_order_that_misses_an_option_is_refused():
    with pytest.raises(TypeError, match="order must list"):
        config_options(CollectConfig, ("G", "T_max"), order=("G",))(lambda options: None)


def test_preset_options_default_to_none():
    app, seen = _app(from_preset=("G",))
    CliRunner().invoke(app, [])
    assert seen[0]["G"] is None


def test_the_run_options_are_fields_of_every_rollout_stage():
    for cls in (CollectConfig, AbRolloutConfig):
        assert set(RUN_OPTIONS) <= {f.name for f in dataclasses.fields(cls)}


@pytest.mark.parametrize(
    "command, config, own",
    [
        ("train-onpolicy", "TrainOnpolicyConfig", {"workers"}),
        ("train-offpolicy", "TrainOffpolicyConfig", set()),
        ("analyze", "AnalyzeConfig", set()),
        ("what-if", "WhatIfConfig", set()),
        ("sweep", "SweepConfig,GateFitConfig,StallFitConfig", set()),
        ("ab-rollout", "AbRolloutConfig", {"workers"}),
        ("collect", "CollectConfig", {"workers"}),
        ("serve", "ServeConfig", set()),
        (
            "policy build",
            "BuildConfig",
            {"out", "replace_shipped", "force", "base", "resume", "sft_from"},
        ),
    ],
)
def test_every_field_of_these_configs_is_an_option_declared_once(command, config, own):
    """The command's parameters are its config's fields (each once, its flag from the field's
    name, its help the field's), plus only the command's own; a tuple field is a comma list."""
    import typer.main

    import srollout.config as configs
    from srollout.cli.app import app
    from srollout.config import help_for
    from srollout.default_policy.build import BuildConfig

    classes = [
        BuildConfig if n == "BuildConfig" else getattr(configs, n) for n in config.split(",")
    ]
    cmd = typer.main.get_command(app)
    for word in command.split():
        cmd = cmd.commands[word]
    params = {p.name: p for p in cmd.params if p.name != "help"}
    fields = {f.name: cls for cls in classes for f in dataclasses.fields(cls)}
    hidden = {p.name for p in params.values() if getattr(p, "hidden", False)}
    assert set(params) - hidden == set(fields) | own and hidden <= {"precision_floor"}
    for name, cls in fields.items():
        p = params[name]
        if p.param_type_name == "option":
            assert p.opts[0] == flag(name) or p.opts[0].startswith(flag(name) + "/"), p.opts
            assert p.help.startswith(help_for(cls, name)[:40])


def test_a_tuple_field_is_read_as_a_comma_list():
    from srollout.cli.rollout_options import parse_lists
    from srollout.config import AnalyzeConfig, TrainOnpolicyConfig

    parsed = parse_lists(
        TrainOnpolicyConfig,
        {"seeds": "7,13", "arms": "baseline, stall", "lora_targets": "q_proj", "G": 4},
    )
    assert parsed == {
        "seeds": (7, 13),
        "arms": ("baseline", "stall"),
        "lora_targets": ("q_proj",),
        "G": 4,
    }
    assert parse_lists(AnalyzeConfig, {"K": None}) == {"K": None}  # not given: the default
    with pytest.raises(Exception, match="--seeds: seeds must be >= 0"):
        parse_lists(TrainOnpolicyConfig, {"seeds": "7,-1"})
    with pytest.raises(Exception, match="--K: expected integers separated by commas"):
        parse_lists(AnalyzeConfig, {"K": "5,x"})


def test_backend_auto_is_vllm_for_the_smollm2_models_where_installed(tmp_path, monkeypatch):
    # resolved in the config, so the manifest names the backend a run used
    import importlib.util

    installed = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: name == "vllm" or installed(name))
    out = tmp_path / "run"
    assert CollectConfig(model="smollm2-alfworld", out=out).backend == "vllm"
    assert CollectConfig(model="smollm2-135m", out=out).backend == "vllm"
    assert CollectConfig(out=out).backend == "transformers"  # the default policy: in process
    assert CollectConfig(model="smollm2-alfworld", out=out, backend="transformers").backend == (
        "transformers"
    )
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)  # no vLLM
    assert CollectConfig(model="smollm2-alfworld", out=out).backend == "transformers"
