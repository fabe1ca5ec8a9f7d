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
4. ``correction_rounds`` DAgger rounds (:func:`srollout.default_policy.build.dagger_round`,
   docs/smollm2-alfworld.md), each played on vLLM with the adapter as it stands merged in, the
   play kept and the fine-tuning checkpointed, so ``--resume`` goes on within a round too;
5. the adapter, its recipe, the base file's sha256 and the policy's prompt (srollout.json) written
   atomically to the output directory;
6. the eval figures (:func:`eval_config`, :func:`record_eval`; the CLI runs the collect): a
   default collect (G 8, T_max 30, temperature 0.7) of ``eval_groups`` eval tasks, the adapter
   merged on the base, kept beside it (``<out>-eval``), its valid actions, success and group
   labels in build.json (``figures``); it resumes, and a build without figures gets them later.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
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
    """How a LoRA adapter for a named base model is trained (build.json records it). base: the
    model the adapter goes on; sft: the demonstrations and SFT settings (the default policy's
    recipe fields); r / alpha / targets: the LoRA shape; checkpoint_every: SFT steps between
    resumable checkpoints."""

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
        correction_rounds=2,
        correction_beta_decay=0.0,
        correction_tasks=64,
        correction_G=2,
        correction_beta=0.3,
        correction_epochs=1,
        correction_lr=5e-4,
        correction_relabel=True,
        correction_branches=250,
        correction_replay=100,
    )
    r: int = 8
    alpha: int = 16
    targets: tuple[str, ...] = tuple(
        "q_proj k_proj v_proj o_proj gate_proj up_proj down_proj".split()
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


def recipe_for(base: str, **changes: Any) -> AdapterRecipe:
    """The shipped recipe of ``base`` with ``changes`` to its SFT config (the seed, the threads
    or the DAgger rounds' ``correction_*`` fields; None values are ignored)."""
    if base not in RECIPES:
        raise SrolloutError(
            f"--base {base}: no adapter recipe for it (recipes: {', '.join(RECIPES)})"
        )
    recipe = RECIPES[base]
    changes = {k: v for k, v in changes.items() if v is not None}
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
    """Copy a finished adapter build over the one the package ships (not peft's README.md)."""
    from srollout.default_policy import replace_shipped
    from srollout.policy.named import SMOLLM2_ADAPTER_DIR

    return replace_shipped(Path(built), SMOLLM2_ADAPTER_DIR, skip=("README.md",))


def _work_dir(out: Path) -> Path:
    return out.parent / f".{out.name}.work"


def build_adapter(
    recipe: AdapterRecipe,
    out: Path,
    *,
    resume: bool = False,
    quiet: bool = False,
    sft_from: Path | None = None,
) -> AdapterBuild:
    """Train the adapter of ``recipe`` into ``out`` (steps 1-5 of the module docstring).

    A work directory beside ``out`` holds the demonstrations and the latest checkpoint; without
    ``resume`` an existing one is refused (one line), with it the build continues from there:
    within the SFT from its last saved step, then round by round. ``sft_from``: a finished
    adapter build whose SFT recipe is this one's (build.json says so) stands in for the SFT
    phase, so only the DAgger rounds run."""
    import torch

    from srollout.console import make_console
    from srollout.default_policy.build import build_machine, dagger_round, effective_config
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
    cfg = effective_config(recipe.sft)
    if sft_from is not None:
        _check_sft_from(Path(sft_from), recipe, cfg)
    work.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(cfg.threads)
    t0 = time.perf_counter()
    console = make_console()
    with PhaseBars(console, enabled=not quiet, unit={"demonstrations": "episodes"}) as bars:
        demos = _demos(cfg, work, bars.phase("demonstrations"))
        base_dir, model, tokenizer = _base(recipe.base)
        from srollout.default_policy.build import demo_examples

        examples = demo_examples(tokenizer, demos, cfg.max_context)
        lora = LoraSettings(recipe.r, recipe.alpha, recipe.targets)
        peft_model = attach_lora(model, lora, cfg.seed)
        state = _load_checkpoint(work, peft_model)
        if sft_from is not None and state["phase"] == "sft" and state["resume"] is None:
            _load_sft_from(Path(sft_from), peft_model, state)
        earlier = state["seconds"]
        inner = peft_model.base_model.model  # the causal LM with LoRA layers in place
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
        n_tokens = sum(len(e.token_ids) for e in examples)

        def save(**fields: Any) -> None:
            state.update(fields, seconds=earlier + time.perf_counter() - t0)
            _save_checkpoint(work, peft_model, state)

        def checkpoint(step: int, opt: Any) -> None:  # within the SFT or a round's fine-tuning
            if step % recipe.checkpoint_every == 0:
                save(resume=(step, opt.state_dict()))

        if state["phase"] == "sft":
            from srollout.default_policy.sft import sft

            sft_bar = bars.phase("SFT (LoRA)")

            def on_step(step: int, total: int, loss: float) -> None:
                sft_bar(step, total, f"loss {loss:.3f}")

            loss = sft(
                inner, examples, cfg, pad, on_step, resume=state["resume"], checkpoint=checkpoint
            )
            save(phase="dagger", resume=None, sft_loss=loss, loss=loss)
        for r in range(len(state["rounds"]), cfg.correction_rounds):
            played = _RoundPolicy(peft_model, recipe, base_dir, work / f"round-{r + 1}", cfg)
            loss, stats = dagger_round(
                inner, tokenizer, examples, SMOLLM2_PROMPT, cfg, r, bars.phase, pad, played,
                played_file=work / f"round-{r + 1}.played.pkl", resume=state["resume"],
                checkpoint=checkpoint,
            )  # fmt: skip
            played.close()
            save(rounds=[*state["rounds"], stats._asdict()], loss=loss, resume=None)
    seconds = earlier + time.perf_counter() - t0
    n_adapter = sum(p.numel() for n, p in peft_model.named_parameters() if "lora_" in n)
    info = {
        "builder": f"srollout adapter {ADAPTER_BUILD_VERSION}",
        "base": recipe.base,
        "base_sha256": json.loads((base_dir / "gguf.json").read_text()).get("sha256")
        if (base_dir / "gguf.json").is_file()
        else None,
        "recipe": dataclasses.asdict(dataclasses.replace(recipe, sft=cfg)),
        "precision": "bf16 autocast" if cfg.bf16 else "fp32",
        "built_on": build_machine(),
        "n_params_base": sum(p.numel() for p in peft_model.parameters()) - n_adapter,
        "n_params_adapter": n_adapter,
        "n_demos": len(demos),
        "n_tokens": n_tokens,
        "n_loss_tokens": sum(sum(e.loss_mask) for e in examples),
        "sft_final_loss": state["sft_loss"],
        "sft_from": state.get("sft_from"),
        "dagger_rounds": state["rounds"],
        "final_loss": state["loss"],
        "seconds": round(seconds),
        "system_prompt": SMOLLM2_PROMPT,
    }
    _save(peft_model, recipe, out, info)
    shutil.rmtree(work, ignore_errors=True)
    return AdapterBuild(out, len(demos), n_tokens, state["loss"], seconds)


@dataclasses.dataclass
class _RoundPolicy:
    """A DAgger round's player: on vLLM where installed, the adapter as it stands (saved into
    ``dir``) merged into the base (the merged copy is dropped by :meth:`close`), else ``None``
    (the round plays in process, far slower on SmolLM2's 30 layers)."""

    model: Any
    recipe: AdapterRecipe
    base_dir: Path
    dir: Path
    cfg: BuildConfig
    merged: Path | None = None

    def __call__(self) -> Any:
        from srollout.policy.vllm_backend import VLLMPolicy, vllm_installed

        if not vllm_installed():
            return None
        from srollout.policy.named import merged_model

        shutil.rmtree(self.dir, ignore_errors=True)
        _write_adapter(self.model, self.recipe, self.dir)
        self.merged = merged_model(self.base_dir, self.dir, f"{self.recipe.base}-adapter")
        return VLLMPolicy(
            self.merged,
            temperature=self.cfg.correction_temperature,
            max_new_tokens=48,
            max_model_len=self.cfg.max_context,
        )

    def close(self) -> None:
        import gc

        gc.collect()  # the round's vLLM engine
        for path in (self.merged, self.dir):
            if path is not None:
                shutil.rmtree(path, ignore_errors=True)


def _check_sft_from(path: Path, recipe: AdapterRecipe, cfg: BuildConfig) -> None:
    """Refuse (one line) an ``sft_from`` build whose base, LoRA shape or SFT fields differ from
    ``recipe``'s (DAgger fields may: they are what the new build adds), or with more DAgger rounds
    on it than asked, or rounds this recipe would have played otherwise (else it goes on)."""
    info_file = path / "build.json"
    if not info_file.is_file():
        raise SrolloutError(f"--sft-from {path}: not a finished adapter build (no build.json)")
    done = json.loads(info_file.read_text())["recipe"]
    mine = json.loads(json.dumps(dataclasses.asdict(dataclasses.replace(recipe, sft=cfg))))
    n = done["sft"].get("correction_rounds", 0)
    if n and (n > cfg.correction_rounds or _round_settings(done, n) != _round_settings(mine, n)):
        raise SrolloutError(
            f"--sft-from {path}: it has {n} DAgger round(s) on it; go on from it only with more "
            "rounds whose --correction-* settings play those the same, or give an SFT-only build"
        )

    def sft_part(r: dict[str, Any]) -> dict[str, Any]:
        return {
            **{k: v for k, v in r.items() if k not in ("sft", "eval_groups", "checkpoint_every")},
            "sft": {k: v for k, v in r["sft"].items() if not k.startswith("correction_")},
        }

    if sft_part(done) != sft_part(mine):
        a, b = sft_part(mine)["sft"], sft_part(done)["sft"]
        diff = sorted(k for k in {**a, **b} if a.get(k) != b.get(k)) or ["base / LoRA shape"]
        raise SrolloutError(
            f"--sft-from {path}: its SFT recipe differs from this one ({', '.join(diff)})"
        )


def _round_settings(recipe: dict[str, Any], n: int) -> dict[str, Any]:
    """The settings of the first n rounds: each round's beta, not the schedule that gives it."""
    out = {k: v for k, v in recipe["sft"].items() if "correction_" in k and "rounds" not in k}
    b, decay = out.pop("correction_beta"), out.pop("correction_beta_decay", 1.0)
    return out | {"betas": [b * decay**r for r in range(n)]}


def _load_sft_from(path: Path, model: Any, state: dict[str, Any]) -> None:
    """Put ``path``'s adapter weights into ``model``; mark its SFT and its rounds done."""
    from safetensors.torch import load_file

    from srollout.training.lora import load_adapter_state

    weights = load_file(str(path / "adapter_model.safetensors"))
    load_adapter_state(model, weights)
    done = json.loads((path / "build.json").read_text())
    state.update(
        phase="dagger",
        sft_loss=done.get("sft_final_loss", done.get("final_loss")),
        loss=done.get("final_loss"),
        rounds=list(done.get("dagger_rounds", [])),
        seconds=float(done.get("seconds", 0)),
        sft_from=f"{path.name} ({done.get('builder')}, {done.get('built_on', {}).get('date')})",
    )


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


def _save_checkpoint(work: Path, model: Any, state: dict[str, Any]) -> None:
    """The adapter and the build's state (phase, the SFT's (step, optimizer state) to resume
    from, the finished rounds' counts, losses, seconds so far), replacing the last checkpoint
    atomically."""
    import torch

    from srollout.training.lora import adapter_state

    tmp = work / "checkpoint.pt.tmp"
    torch.save({**state, "adapter": adapter_state(model)}, tmp)
    os.replace(tmp, work / "checkpoint.pt")


def _load_checkpoint(work: Path, model: Any) -> dict[str, Any]:
    """Restore the last checkpoint's adapter into ``model``; returns the build's state (a fresh
    one where there is no checkpoint)."""
    import torch

    from srollout.training.lora import load_adapter_state

    state: dict[str, Any] = dict(
        phase="sft", resume=None, rounds=[], seconds=0.0, sft_loss=None, loss=float("nan")
    )
    path = work / "checkpoint.pt"
    if path.is_file():
        saved = torch.load(path, weights_only=False)
        load_adapter_state(model, saved.pop("adapter"))
        state.update(saved)
    return state


def _save(model: Any, recipe: AdapterRecipe, out: Path, info: dict[str, Any]) -> None:
    """The adapter directory, atomically: peft's files, srollout.json (the prompt it was
    trained with; rollouts in bf16 where the CPU has it, ``model_files.model_dtype``) and
    build.json."""
    from srollout.atomic import atomic_dir
    from srollout.envs.prompts import MODEL_PROMPT_FILE, USER_TEMPLATE

    with atomic_dir(out) as tmp:
        _write_adapter(model, recipe, tmp)
        prompt = dict(system_prompt=SMOLLM2_PROMPT, user_template=USER_TEMPLATE, dtype="bfloat16")
        (tmp / MODEL_PROMPT_FILE).write_text(json.dumps(prompt, indent=2) + "\n")
        (tmp / "build.json").write_text(json.dumps(info, indent=2, default=str) + "\n")


def _write_adapter(model: Any, recipe: AdapterRecipe, path: Path) -> None:
    """peft's files of ``model``'s adapter into ``path``, its base named by its srollout name
    (not a cache path); no hub lookup."""
    model.peft_config["default"].base_model_name_or_path = recipe.base
    model.save_pretrained(str(path), save_embedding_layers=False)


def eval_config(adapter: Path, recipe: AdapterRecipe) -> dict[str, Any]:
    """Step 6's collect (as ``CollectConfig`` fields): ``recipe.eval_groups`` groups of the eval
    split at the collect defaults (G 8, T_max 30, temperature 0.7) with ``adapter`` merged on its
    base, on vLLM where it is installed (on SmolLM2's 30 layers the transformers backend's
    per-call KV rebuild costs ~6 GB and most of the time at concurrency 64), written beside it
    as ``<adapter>-eval`` (resumed when there; kept: it is an ungated default collect of the
    policy, which `srollout analyze` reads)."""
    from srollout.policy import resolve_model
    from srollout.policy.named import merged_model
    from srollout.policy.vllm_backend import vllm_installed

    adapter = Path(adapter)
    merged = merged_model(resolve_model(recipe.base), adapter, f"{recipe.base}-adapter")
    run = adapter.parent / f"{adapter.name}-eval"
    return {
        "backend": "vllm" if vllm_installed() else "transformers",
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
