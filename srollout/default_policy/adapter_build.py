"""The LoRA adapter that makes SmolLM2-135M-Instruct an ALFWorld policy (``smollm2-alfworld``).

``srollout policy build --base smollm2-135m`` runs it:
1. noisy-expert demonstrations of the train set, as the default policy's build makes them
   (:func:`srollout.default_policy.build.make_demonstrations`; only won episodes; noise actions
   stay in the context untrained), cached in the work directory;
2. the base model (the installed GGUF, converted once) in float32, a fresh LoRA adapter on every
   attention and MLP projection (peft; the base stays frozen);
3. SFT on the action tokens with the model's own tokenizer and chat template
   (:func:`srollout.default_policy.sft.sft`, bf16 autocast where the CPU has native bf16), the
   adapter and optimizer saved every ``checkpoint_every`` steps so ``--resume`` continues exactly;
4. the adapter, its recipe, the base file's sha256 and the policy's prompt (srollout.json) written
   atomically to the output directory.

5. the eval figures (:func:`eval_config`, :func:`record_eval`; the CLI runs the collect): a
   default collect (G 8, T_max 30, temperature
   0.7) of ``eval_groups`` tasks of the eval split with the adapter merged on the base, kept
   beside the adapter (``<out>-eval``), its valid actions, success and group labels written into
   build.json (``figures``); the collect resumes too, and a finished build without figures gets
   them on the next run of the command.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any, NamedTuple

from srollout.default_policy.recipe import BuildConfig
from srollout.errors import SrolloutError

ADAPTER_BUILD_VERSION = "a1"
SMOLLM2_PROMPT = (
    "You are an agent in a household (ALFWorld). Each turn you see an observation. "
    "Reply with exactly one action in the form: Action: <action>"
)


@dataclasses.dataclass(frozen=True)
class AdapterRecipe:
    """How a LoRA adapter for a named base model is trained (build.json records it).

    base: the model the adapter goes on; sft: the demonstrations and SFT settings (the default
    policy's recipe fields); r / alpha / targets: the LoRA shape; checkpoint_every: SFT steps
    between resumable checkpoints."""

    base: str = "smollm2-135m"
    sft: BuildConfig = BuildConfig(
        seed=0,
        n_demo_tasks=160,
        demos_per_task=2,
        noise=(0.1, 0.3),
        invalid_fraction=0.5,
        thoughts="none",
        prompt="short",
        epochs=1,
        lr=1e-3,
        obs_loss_weight=0.0,
        batch_tokens=2048,
        max_context=4096,
    )
    r: int = 8
    alpha: int = 16
    targets: tuple[str, ...] = (
        "q_proj",
        "k_proj",
        "v_proj",
        "o_proj",
        "gate_proj",
        "up_proj",
        "down_proj",
    )
    checkpoint_every: int = 5
    eval_groups: int = 40


RECIPES = {"smollm2-135m": AdapterRecipe()}


class AdapterBuild(NamedTuple):
    """path: the adapter directory; n_demos / n_tokens: SFT data; final_loss; seconds."""

    path: Path
    n_demos: int
    n_tokens: int
    final_loss: float
    seconds: float


def recipe_for(base: str, seed: int | None = None, threads: int | None = None) -> AdapterRecipe:
    """The shipped recipe of ``base``, with another seed or thread count if given."""
    if base not in RECIPES:
        raise SrolloutError(
            f"--base {base}: no adapter recipe for it (recipes: {', '.join(RECIPES)})"
        )
    recipe = RECIPES[base]
    changes = {k: v for k, v in (("seed", seed), ("threads", threads)) if v is not None}
    return dataclasses.replace(recipe, sft=dataclasses.replace(recipe.sft, **changes))


def adapter_dir(recipe: AdapterRecipe) -> Path:
    """``$SROLLOUT_HOME/models/adapter-<base>-<version>-<12 hex of the recipe>`` (not created)."""
    import hashlib

    from srollout.home import srollout_home

    payload = json.dumps(
        {"version": ADAPTER_BUILD_VERSION, **dataclasses.asdict(recipe)},
        sort_keys=True,
        default=str,
    )
    digest = hashlib.sha256(payload.encode()).hexdigest()[:12]
    return srollout_home() / "models" / f"adapter-{recipe.base}-{ADAPTER_BUILD_VERSION}-{digest}"


def replace_shipped_adapter(built: Path) -> Path:
    """Copy a finished adapter build over the one the package ships (temp dir, then renames)."""
    from srollout.policy.named import SMOLLM2_ADAPTER_DIR

    if not (built / "build.json").is_file():
        raise SrolloutError(f"{built}: not a finished adapter build")
    target = SMOLLM2_ADAPTER_DIR
    if not os.access(target.parent, os.W_OK):
        raise SrolloutError(f"{target.parent}: not writable (an installed wheel)")
    tmp = Path(tempfile.mkdtemp(prefix=".smollm2.", dir=target.parent))
    old = target.parent / f".smollm2.old-{os.getpid()}"
    for f in sorted(built.iterdir()):
        if f.is_file() and f.name != "README.md":
            shutil.copy2(f, tmp / f.name)
    tmp.chmod(0o755)
    if target.exists():
        os.replace(target, old)
    os.replace(tmp, target)
    shutil.rmtree(old, ignore_errors=True)
    return target


def _work_dir(out: Path) -> Path:
    return out.parent / f".{out.name}.work"


def build_adapter(
    recipe: AdapterRecipe, out: Path, *, resume: bool = False, quiet: bool = False
) -> AdapterBuild:
    """Train the adapter of ``recipe`` into ``out`` (steps 1-4 of the module docstring).

    A work directory beside ``out`` holds the demonstrations and the latest checkpoint; without
    ``resume`` an existing one is refused (one line), with it the build continues from there."""
    import torch

    from srollout.console import make_console
    from srollout.default_policy.build import build_machine, effective_config
    from srollout.progress import PhaseBars
    from srollout.training.lora import LoraSettings, attach_lora

    out = Path(out)
    work = _work_dir(out)
    if out.exists():
        raise SrolloutError(f"--out {out}: exists; choose another directory or remove it")
    if work.exists() and not resume:
        raise SrolloutError(
            f"{work}: an unfinished build is there; add --resume to continue it, or remove it"
        )
    work.mkdir(parents=True, exist_ok=True)
    cfg = effective_config(recipe.sft)
    torch.set_num_threads(cfg.threads)
    t0 = time.perf_counter()
    console = make_console()
    with PhaseBars(console, enabled=not quiet, unit={"demonstrations": "episodes"}) as bars:
        demos = _demos(cfg, work, bars.phase("demonstrations"))
        base_dir, model, tokenizer = _base(recipe.base)
        examples = _examples(tokenizer, demos, cfg.max_context)
        lora = LoraSettings(recipe.r, recipe.alpha, recipe.targets)
        peft_model = attach_lora(model, lora, cfg.seed)
        start, earlier = _load_checkpoint(work, peft_model)
        sft_bar = bars.phase("SFT (LoRA)")
        n_tokens = sum(len(e.token_ids) for e in examples)

        def on_step(step: int, total: int, loss: float) -> None:
            sft_bar(step, total, f"loss {loss:.3f}")

        def checkpoint(step: int, opt: Any) -> None:
            if step % recipe.checkpoint_every == 0:
                elapsed = earlier + time.perf_counter() - t0
                _save_checkpoint(work, peft_model, opt, step, elapsed)

        from srollout.default_policy.sft import sft

        inner = peft_model.base_model.model  # the causal LM with LoRA layers in place
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
        loss = sft(inner, examples, cfg, pad, on_step, resume=start, checkpoint=checkpoint)
    seconds = earlier + time.perf_counter() - t0
    info = {
        "builder": f"srollout adapter {ADAPTER_BUILD_VERSION}",
        "base": recipe.base,
        "base_sha256": json.loads((base_dir / "gguf.json").read_text()).get("sha256")
        if (base_dir / "gguf.json").is_file()
        else None,
        "recipe": dataclasses.asdict(dataclasses.replace(recipe, sft=cfg)),
        "precision": "bf16 autocast" if cfg.bf16 else "fp32",
        "built_on": build_machine(),
        "n_params_base": sum(
            p.numel() for n, p in peft_model.named_parameters() if "lora_" not in n
        ),
        "n_params_adapter": sum(
            p.numel() for n, p in peft_model.named_parameters() if "lora_" in n
        ),
        "n_demos": len(demos),
        "n_tokens": n_tokens,
        "n_loss_tokens": sum(sum(e.loss_mask) for e in examples),
        "final_loss": loss,
        "seconds": round(seconds),
        "system_prompt": SMOLLM2_PROMPT,
    }
    _save(peft_model, recipe, out, info)
    shutil.rmtree(work, ignore_errors=True)
    return AdapterBuild(out, len(demos), n_tokens, loss, seconds)


def _demos(cfg: BuildConfig, work: Path, progress: Any) -> list[Any]:
    """The demonstrations, played once and cached in ``work`` (demos.json)."""
    from srollout.default_policy.build import Demo, make_demonstrations
    from srollout.policy.chat import Turn

    cache = work / "demos.json"
    if cache.is_file():
        raw = json.loads(cache.read_text())
        return [Demo(d["system"], [Turn(*t) for t in d["turns"]]) for d in raw]
    demos = [d._replace(system=SMOLLM2_PROMPT) for d in make_demonstrations(cfg, progress)]
    payload = [{"system": d.system, "turns": [list(t) for t in d.turns]} for d in demos]
    from srollout.atomic import atomic_write_text

    atomic_write_text(json.dumps(payload) + "\n", cache)
    return demos


def _base(name: str) -> tuple[Path, Any, Any]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from srollout.policy import resolve_model

    path = resolve_model(name)
    model = AutoModelForCausalLM.from_pretrained(str(path), dtype="float32")
    return path, model, AutoTokenizer.from_pretrained(str(path))


def _examples(tokenizer: Any, demos: list[Any], max_context: int) -> list[Any]:
    """SFT examples in the base model's own chat template; its end-of-turn token ends each
    response (ChatML ``<|im_end|>`` for SmolLM2, what the rollout stops on)."""
    from srollout.default_policy.build import _truncate
    from srollout.policy.chat import end_of_turn_ids, tokenize_chat

    eot = end_of_turn_ids(tokenizer)[0]
    return [_truncate(tokenize_chat(tokenizer, d.system, d.turns, eot), max_context) for d in demos]


def _save_checkpoint(work: Path, model: Any, opt: Any, step: int, seconds: float) -> None:
    """The adapter, the optimizer and the step after ``step`` SFT steps (``seconds`` of build
    so far), replacing the last checkpoint atomically."""
    import torch

    from srollout.training.lora import adapter_state

    tmp = work / "checkpoint.pt.tmp"
    torch.save(
        {
            "step": step,
            "adapter": adapter_state(model),
            "optimizer": opt.state_dict(),
            "seconds": seconds,
        },
        tmp,
    )
    os.replace(tmp, work / "checkpoint.pt")


def _load_checkpoint(work: Path, model: Any) -> tuple[tuple[int, Any] | None, float]:
    """Restore the last checkpoint's adapter into ``model``; returns ((step, optimizer state) or
    None, the seconds the build had run before)."""
    import torch

    from srollout.training.lora import load_adapter_state

    path = work / "checkpoint.pt"
    if not path.is_file():
        return None, 0.0
    state = torch.load(path, weights_only=False)
    load_adapter_state(model, state["adapter"])
    return (state["step"], state["optimizer"]), float(state["seconds"])


def _save(model: Any, recipe: AdapterRecipe, out: Path, info: dict[str, Any]) -> None:
    """The adapter directory, atomically: peft's files (base named by its srollout name, not a
    cache path), srollout.json (the prompt it was trained with) and build.json."""
    from srollout.envs.prompts import MODEL_PROMPT_FILE, USER_TEMPLATE

    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        model.peft_config["default"].base_model_name_or_path = recipe.base
        model.save_pretrained(str(tmp), save_embedding_layers=False)  # no hub lookup
        prompt = {"system_prompt": info["system_prompt"], "user_template": USER_TEMPLATE}
        (tmp / MODEL_PROMPT_FILE).write_text(json.dumps(prompt, indent=2) + "\n")
        (tmp / "build.json").write_text(json.dumps(info, indent=2, default=str) + "\n")
        tmp.chmod(0o755)
        os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def eval_config(adapter: Path, recipe: AdapterRecipe) -> dict[str, Any]:
    """Step 5's collect (as ``CollectConfig`` fields): ``recipe.eval_groups`` groups of the eval
    split at the collect defaults (G 8, T_max 30, temperature 0.7) with ``adapter`` merged on its
    base, on vLLM where it is installed (on SmolLM2's 30 layers the transformers backend's
    per-call KV rebuild costs ~6 GB and most of the time at concurrency 64), written beside it
    as ``<adapter>-eval`` (resumed when there; kept: it is an ungated default collect of the
    policy, which `srollout analyze` reads)."""
    import importlib.util

    from srollout.policy import resolve_model
    from srollout.policy.named import merged_model

    adapter = Path(adapter)
    merged = merged_model(resolve_model(recipe.base), adapter, f"{recipe.base}-adapter")
    run = adapter.parent / f"{adapter.name}-eval"
    return {
        "backend": "vllm" if importlib.util.find_spec("vllm") else "transformers",
        "model": str(merged),
        "tasks": "eval",
        "groups": recipe.eval_groups,
        "out": run,
        "resume": (run / "manifest.json").is_file(),
        "seed": recipe.sft.seed,
    }


def record_eval(adapter: Path, run: Path, seconds: float) -> dict[str, Any]:
    """Write the eval collect's figures (valid actions, success, group labels) into the adapter's
    build.json (``figures``, with the run's path) and drop the work directory; returns them."""
    import polars as pl

    from srollout.atomic import atomic_write_text

    steps = pl.read_parquet(run / "steps.parquet")
    trajs = pl.read_parquet(run / "trajectories.parquet")
    groups = pl.read_parquet(run / "groups.parquet")
    labels = groups["label"].value_counts()
    count = dict(zip(labels["label"].to_list(), labels["count"].to_list(), strict=True))
    figures = {
        "eval collect": f"{groups.height} eval groups, G 8, T_max 30, temperature 0.7, "
        f"backend {json.loads((run / 'manifest.json').read_text())['config'].get('backend')}",
        "valid actions": round(float(steps["valid"].mean()), 4),
        "success": round(float(trajs["success"].mean()), 4),
        "groups all_fail / mixed / all_succeed": (
            f"{count.get('all_fail', 0)} / {count.get('mixed', 0)} / {count.get('all_succeed', 0)}"
        ),
        "mixed groups": round(count.get("mixed", 0) / max(1, groups.height), 4),
        "mean steps": round(float(trajs["n_steps"].mean()), 2),
        "generated tokens": int(steps["n_gen_tokens"].sum()),
        "eval wall-clock s": round(seconds),
        "eval run": str(run),
    }
    info = json.loads((adapter / "build.json").read_text())
    info["figures"] = figures
    atomic_write_text(json.dumps(info, indent=2, default=str) + "\n", adapter / "build.json")
    shutil.rmtree(_work_dir(adapter), ignore_errors=True)
    return figures
