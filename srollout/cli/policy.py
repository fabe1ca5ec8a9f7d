"""`srollout policy build|info`: build the default policy explicitly, or show a model's facts."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import typer

from srollout.cli.rollout_options import config_options, parse_lists
from srollout.config import help_for
from srollout.default_policy.recipe import BuildConfig
from srollout.errors import SrolloutError

policy_app = typer.Typer(
    name="policy",
    help="Rebuild the default policy the package ships, or inspect a model directory.",
    no_args_is_help=True,
    add_completion=False,
)

_D = BuildConfig()


BUILD_OPTIONS = tuple(f.name for f in dataclasses.fields(BuildConfig))


def _build_help(name: str) -> str:
    text = help_for(BuildConfig, name)
    return (
        text + " A literal \\n on the command line is a newline."
        if name == "user_template"
        else text
    )


@policy_app.command("build")
@config_options(
    BuildConfig,
    BUILD_OPTIONS,
    order=("out", "replace_shipped", "base", "resume", "sft_from", *BUILD_OPTIONS, "force"),
    help=_build_help,
    from_preset=[n for n in BUILD_OPTIONS if "correction_" in n],  # None: the recipe's
)
def build(
    options: dict[str, Any],
    out: Path | None = typer.Option(None, help="Write here instead of the $SROLLOUT_HOME cache."),  # noqa: B008
    replace_shipped: bool = typer.Option(
        False,
        "--replace-shipped",
        help="Then copy the build over the default policy the package ships (a clone or an "
        "editable install).",
    ),
    force: bool = typer.Option(
        False, "--force", help="Rebuild even if the cache already holds this config."
    ),
    base: str | None = typer.Option(
        None,
        "--base",
        help="Train the LoRA adapter of this named model instead (`smollm2-135m`: the adapter "
        "behind --model smollm2-alfworld), from its recipe; only --seed, --threads and the "
        "--correction-* DAgger options change it.",
    ),
    resume: bool = typer.Option(
        False, "--resume", help="With --base: continue an interrupted adapter build."
    ),
    sft_from: Path | None = typer.Option(  # noqa: B008
        None,
        "--sft-from",
        help="With --base: take the SFT phase, and any DAgger rounds of the same settings, from "
        "this finished adapter build of the same SFT recipe, and run only the rounds still to do.",
    ),
) -> None:
    """Rebuild the default policy (demonstrations -> BPE tokenizer -> Qwen2 -> SFT) from its recipe
    and seed into the cache, or --out DIR; --replace-shipped puts it in the package. With --base,
    train and ship the LoRA adapter of a real pretrained model instead."""
    import shutil

    if base is not None:
        _build_adapter(options, base, out, replace_shipped, force, resume, sft_from)
        return
    if sft_from is not None:
        raise SrolloutError("--sft-from: only with --base (an adapter build)")
    from srollout.console import make_console
    from srollout.default_policy import replace_shipped as put_in_package
    from srollout.default_policy.build import (
        build_default_policy,
        check_build_config,
        default_policy_dir,
        is_built,
    )

    values = {k: v for k, v in parse_lists(BuildConfig, options).items() if v is not None}
    values["user_template"] = values["user_template"].replace("\\n", "\n")
    cfg = BuildConfig(**values)
    check_build_config(cfg)  # before the cache lookup: a bad option is named, not hashed
    if replace_shipped and cfg != _D:
        raise SrolloutError(
            "--replace-shipped builds the default recipe only; drop the recipe options, "
            "or build with --out DIR and pass --model DIR"
        )
    target = out or default_policy_dir(cfg)
    console = make_console()
    if out is not None and out.exists() and not is_built(out) and any(out.iterdir()):
        raise SrolloutError(
            f"--out {out}: exists and is not a finished build; choose another directory"
        )
    if is_built(target) and not force:
        console.print(f"already built: {target} (use --force to rebuild)")
        extra = {}
    else:
        if force and target.exists():
            shutil.rmtree(target)
        res = build_default_policy(cfg, out=target)
        extra = {"build wall-clock": f"{res.seconds:.0f} s"}
    if replace_shipped:
        extra["shipped"] = str(put_in_package(target))
    _show(target, console, extra=extra)


def _build_adapter(
    options: dict[str, Any],
    base: str,
    out: Path | None,
    ship: bool,
    force: bool,
    resume: bool,
    sft_from: Path | None,
) -> None:
    """`policy build --base NAME`: the adapter recipe of NAME (seed and threads may change)."""
    import shutil

    from srollout.console import make_console
    from srollout.default_policy.adapter_build import (
        adapter_dir,
        build_adapter,
        recipe_for,
        replace_shipped_adapter,
    )

    values = {k: v for k, v in parse_lists(BuildConfig, options).items() if v is not None}
    given = {k: v for k, v in values.items() if v != getattr(_D, k) or "correction_" in k}
    free = {k: v for k, v in given.items() if k in ("seed", "threads") or "correction_" in k}
    if changed := ["--" + k.replace("_", "-") for k in given if k not in free]:
        raise SrolloutError(
            f"--base {base}: the adapter has its own recipe; {', '.join(changed)} do not apply "
            "(only --seed, --threads and the --correction-* DAgger options)"
        )
    recipe = recipe_for(base, **free)
    target = out or adapter_dir(recipe)
    console = make_console()
    import json
    import time

    from srollout.config import CollectConfig, DistConfig
    from srollout.default_policy.adapter_build import eval_config, record_eval
    from srollout.stages.collect import auto_workers, run_collect

    trained = (target / "build.json").is_file() and not force
    if trained and "figures" in json.loads((target / "build.json").read_text()):
        console.print(f"already built: {target} (use --force to rebuild)")
    else:
        if not trained:
            if force and target.exists():
                shutil.rmtree(target)
            res = build_adapter(recipe, target, resume=resume, sft_from=sft_from)
            console.print(
                f"adapter of {base}: {res.n_demos} demos, {res.n_tokens:,} tokens, final loss "
                f"{res.final_loss:.4f}, {res.seconds:.0f} s -> {target}",
                highlight=False,
            )
        console.print(f"step 6: the eval collect ({recipe.eval_groups} eval groups)")
        t0 = time.perf_counter()
        config = CollectConfig(**eval_config(target, recipe))
        workers, why = auto_workers(config)  # as `srollout collect` runs it by default
        console.print(f"--workers auto: {why}", style="dim", highlight=False, markup=False)
        run_collect(config, console=console, dist=DistConfig(workers=workers))
        figures = record_eval(target, config.out, time.perf_counter() - t0)
        console.print(", ".join(f"{k}: {v}" for k, v in figures.items()), highlight=False)
    if ship:
        console.print(f"shipped: {replace_shipped_adapter(target)}")


@policy_app.command("info")
def info(
    model: str = typer.Argument(
        "default",
        help="`default`, `smollm2-135m`, `smollm2-alfworld`, a .gguf file or a local Hugging "
        "Face model directory.",
    ),
) -> None:
    """Show a model directory's architecture, size, tokenizer and (for built ones) build record;
    for `default`, which model `--model default` uses and whether the cache holds a rebuild."""
    from srollout.console import make_console
    from srollout.policy import resolve_model

    path = resolve_model(model)  # checks every file: a damaged model is one line, exit 2
    extra: dict[str, str] = {}
    if model == "default":
        extra = _default_in_use(path)
    _show(path, make_console(), extra=extra)


def _default_in_use(shipped: Path) -> dict[str, str]:
    """Rows saying which model `--model default` loads and how a cached rebuild compares."""
    import hashlib

    from srollout.default_policy.build import default_policy_dir, is_built

    def digest(p: Path) -> str:
        return hashlib.sha256((p / "model.safetensors").read_bytes()).hexdigest()

    rows = {"in use for --model default": f"the shipped model ({shipped})"}
    cached = default_policy_dir()
    if is_built(cached):
        same = digest(cached) == digest(shipped)
        rows["cache rebuild"] = (
            f"{cached} ({'weights identical to' if same else 'differs from'} "
            "the shipped; not used by default)"
        )
    return rows


def _show(path: Path, console, extra: dict[str, str] | None = None) -> None:
    from rich.table import Table

    cfg = json.loads((path / "config.json").read_text())
    rows = {
        "path": str(path),
        "architecture": ", ".join(cfg.get("architectures", [])) or cfg.get("model_type", "?"),
        "hidden / layers / heads": f"{cfg.get('hidden_size')} / {cfg.get('num_hidden_layers')} / "
        f"{cfg.get('num_attention_heads')}",
        "vocab": str(cfg.get("vocab_size")),
        "context": str(cfg.get("max_position_embeddings")),
    }
    tok_cfg = path / "tokenizer_config.json"
    if tok_cfg.is_file():
        rows["chat template"] = (
            "yes"
            if json.loads(tok_cfg.read_text()).get("chat_template")
            or (path / "chat_template.jinja").is_file()
            else "no"
        )
    named = path / "named.json"  # a named model: the base with a shipped adapter merged in
    if named.is_file():
        made = json.loads(named.read_text())
        rows["made from"] = f"{made['base']} + the adapter {made['adapter']}"
        adapter_build = Path(made["adapter"]) / "build.json"
        if adapter_build.is_file():
            b = json.loads(adapter_build.read_text())
            rows["adapter"] = f"{b['n_params_adapter']:,} parameters, {b['precision']}"
            rows["adapter SFT data"] = f"{b['n_demos']} demos, {b['n_tokens']:,} tokens"
            rows["adapter built"] = f"{b['built_on']['cpu']}, {b['built_on']['date']}"
            for name, value in (b.get("figures") or {}).items():
                rows[name] = str(value)
    build_json = path / "build.json"
    if build_json.is_file():
        b = json.loads(build_json.read_text())
        rows["parameters"] = f"{b['n_params']:,}"
        if "precision" in b or "config" in b:
            rows["precision"] = b.get("precision") or (
                "bf16 autocast" if b["config"].get("bf16") else "fp32"
            )
        if "built_on" in b:
            m = b["built_on"]
            rows["built on"] = (
                f"{m.get('cpu')}, {m.get('cores')} cores, {m.get('date')} (torch {m.get('torch')})"
            )
        if "seed" in b.get("config", {}):
            rows["seed"] = str(b["config"]["seed"])
        rows["SFT data"] = (
            f"{b['n_demos']} demos, {b['n_tokens']:,} tokens ({b['n_loss_tokens']:,} with loss)"
        )
        rows["final SFT loss"] = f"{b['final_loss']:.4f}"
        rows["built in"] = f"{(b.get('wall_clock_seconds') or {}).get('total', b['seconds']):.0f} s"
        rows["config hash"] = b["config_hash"]
        for name, value in (b.get("figures") or {}).items():
            rows[name] = str(value)
    rows.update(extra or {})
    table = Table(title="policy", show_header=False)
    for k, v in rows.items():
        table.add_row(k, v)
    console.print(table)


def register(app: typer.Typer) -> None:
    """Add the `policy` sub-app to the main app."""
    app.add_typer(policy_app, name="policy")
