"""The default policy that srollout builds itself: BPE tokenizer + small Qwen2 + SFT on demos.

No download can happen, so the default policy is made here from the environment alone:
1. noisy-expert demonstrations of the ``train`` task set in the ReAct format of
   :mod:`srollout.envs.prompts` (the noise actions stay in the conversation, with their
   "Nothing happens." answers, but carry no loss, so the model learns to recover);
2. a byte-level BPE tokenizer trained on that text, with ChatML special tokens and template;
3. a small ``Qwen2ForCausalLM`` trained by supervised fine-tuning on the assistant tokens;
4. saved as an ordinary Hugging Face model directory (config, weights, tokenizer and its chat
   template, generation config), so transformers, peft and vLLM all load it.

The package ships the result (docs/default-policy.md); ``srollout policy build`` rebuilds it
into :func:`default_policy_dir` (or over the shipped one with ``--replace-shipped``), atomically.
Same :class:`BuildConfig` (incl. its seed) on the same kind of CPU -> same weights.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import random
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, NamedTuple

from srollout.atomic import atomic_dir, atomic_file, atomic_write_text
from srollout.config.common import _check_choice
from srollout.console import make_console
from srollout.default_policy.recipe import BuildConfig
from srollout.default_policy.sft import make_model, sft, slice_chat, train_tokenizer
from srollout.envs.prompts import MODEL_PROMPT_FILE, USER_TEMPLATE, system_prompt
from srollout.errors import SrolloutError
from srollout.home import srollout_home
from srollout.policy.chat import CHAT_TEMPLATES, IM_END, TokenizedChat, Turn, tokenize_chat
from srollout.policy.model_files import native_bf16
from srollout.progress import PhaseBars

BUILD_VERSION = "v5"
# The default policy's own system prompt (BuildConfig.prompt = "short"): the model learns the task
# from its demonstrations, so the prompt only has to say what to answer.
DEFAULT_POLICY_PROMPT = (
    "You are an agent in a household (ALFWorld). Reply with one action: Action: <action>"
)


class Demo(NamedTuple):
    """One demonstration conversation: the system prompt and its turns (noise turns untrained)."""

    system: str
    turns: list[Turn]


class BuildResult(NamedTuple):
    """path: the model directory; n_params: parameters; n_demos / n_tokens / n_loss_tokens:
    SFT data size; final_loss: mean loss of the last epoch; seconds: wall-clock of the build."""

    path: Path
    n_params: int
    n_demos: int
    n_tokens: int
    n_loss_tokens: int
    final_loss: float
    seconds: float


# Cache location. Build options added after v5, with the value that builds exactly what v5 built
# (the same demonstrations episode for episode): at that value they stay out of the hash, so a v5
# model already in a cache stays the default policy; set otherwise they name a new model.
_NEUTRAL_SINCE_V5 = {
    "take": "planned",
    "user_template": "Observation: {observation}",
    "correction_rounds": 0,
    "correction_relabel": False,
    "correction_branches": 0,
    "correction_beta_decay": 1.0,
}


def config_hash(cfg: BuildConfig) -> str:
    """12 hex chars of sha256 over the build config and the builder version (options added
    since v5 only where they change the build; ``thoughts="none"`` was v5's ``False``)."""
    fields = dataclasses.asdict(cfg)
    if fields["correction_rounds"] == 0:  # the rounds' settings matter only with rounds
        fields = {
            k: v
            for k, v in fields.items()
            if not k.startswith("correction_") or k == "correction_rounds"
        }
    for k, neutral in _NEUTRAL_SINCE_V5.items():
        if k in fields and fields[k] == neutral:
            del fields[k]
    if fields.get("thoughts") == "none":
        fields["thoughts"] = False
    payload = json.dumps({"version": BUILD_VERSION, **fields}, sort_keys=True, default=str)
    return hashlib.sha256(payload.encode()).hexdigest()[:12]


def effective_config(cfg: BuildConfig) -> BuildConfig:
    """The config a build on this machine really trains with: ``bf16`` asks for bf16 autocast
    where the CPU has native bf16 and falls back to fp32 elsewhere. The cache key and build.json
    use this, so a model trained in fp32 never takes the directory of its bf16 twin."""
    if cfg.bf16 and not native_bf16():
        return dataclasses.replace(cfg, bf16=False)
    return cfg


def default_policy_dir(cfg: BuildConfig | None = None) -> Path:
    """``$SROLLOUT_HOME/models/default-<version>-<hash>`` (not created); the hash is of the
    effective config (``effective_config``)."""
    cfg = effective_config(cfg or BuildConfig())
    return srollout_home() / "models" / f"default-{BUILD_VERSION}-{config_hash(cfg)}"


def is_built(path: Path) -> bool:
    """A finished build has all its files (the rename makes that atomic)."""
    need = (
        "config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
        "build.json",
    )
    return all((path / n).is_file() for n in need)


def build_machine() -> dict[str, Any]:
    """What a build ran on (build.json ``built_on``): the CPU, its native bf16, library versions."""
    import platform

    import torch
    import transformers

    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        lines = []
    cpuinfo = {k.strip(): v.strip() for k, _, v in (line.partition(":") for line in lines)}
    cpu = cpuinfo.get("model name") or platform.processor() or platform.machine()
    flags = set(cpuinfo.get("flags", "").split())
    isa = [f for f in ("avx2", "avx512f", "avx512_bf16", "amx_tile") if f in flags]
    return {
        "cpu": cpu,
        "isa": isa,
        "cores": os.cpu_count(),
        "native_bf16": native_bf16(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "date": time.strftime("%Y-%m-%d", time.gmtime()),
    }


# --- step 1: demonstrations -------------------------------------------------------------------
def make_demonstrations(
    cfg: BuildConfig,
    progress: Callable[[int, int], None] | None = None,
    games_progress: Callable[[int, int], None] | None = None,
) -> list[Demo]:
    """Noisy-expert demonstrations of ``cfg.n_demo_tasks`` tasks of the train set, in ReAct.

    progress / games_progress: ``(done, total)`` callbacks for the episodes and for the games a
    fresh machine must generate first (minutes for the 1000 train tasks; none when cached). Each
    task is played ``cfg.demos_per_task`` times, noise rates ``cfg.noise`` cycled (module step 1).
    """
    from srollout.default_policy.dagger import demo_response
    from srollout.default_policy.demos import generate_demonstrations
    from srollout.envs.prompts import user_turn
    from srollout.envs.tasks import load_task_set

    # the standard train set (its own seed 0); cfg.seed drives the episodes' randomness
    games = games_progress or False
    tasks = load_task_set(cfg.task_set, cfg.difficulty, n=cfg.n_demo_tasks, progress=games)
    episodes = generate_demonstrations(
        tasks,
        episodes_per_task=cfg.demos_per_task,
        noise=cfg.noise,
        invalid_fraction=cfg.invalid_fraction,
        seed=cfg.seed,
        progress=progress or False,
        explore=cfg.explore,
        take=cfg.take,
        thoughts="react" if cfg.thoughts == "none" else cfg.thoughts,
        # the engine is single-threaded: one process per core the build may use
        workers=cfg.threads,
    )
    texts = {t.task_id: t.task_text for t in tasks}
    # only won episodes: a demonstration that wanders for T_max steps teaches wandering; each user
    # turn is rendered in the policy's template from the turn's own observation
    return [
        Demo(
            system=ep.system,
            turns=[
                Turn(
                    user_turn(t.observation, texts[ep.task_id], cfg.user_template, t.admissible),
                    demo_response(t.assistant, cfg.thoughts),
                    not t.is_noise,
                )
                for t in ep.turns
            ],
        )
        for ep in episodes
        if ep.success and ep.turns
    ]


# --- step 2: tokenizer ------------------------------------------------------------------------
def demo_texts(demos: Sequence[Demo], template: str = "chatml") -> Iterable[str]:
    """Every string the tokenizer should know: system prompts once, user turns, responses
    (ChatML: with the role headers as the template renders them, so BPE merges "user",
    "assistant")."""
    seen_systems: set[str] = set()
    head = ("user\n", "assistant\n") if template == "chatml" else ("", "")
    for d in demos:
        if d.system not in seen_systems:
            seen_systems.add(d.system)
            yield d.system
        for t in d.turns:
            yield head[0] + t.user
            yield head[1] + t.assistant


# --- step 3: model ----------------------------------------------------------------------------
def build_from_demos(
    demos: Sequence[Demo],
    cfg: BuildConfig,
    out: Path,
    on_step: Callable[[int, int, float], None] | None = None,
    extra_info: dict[str, Any] | None = None,
    phase: Callable[[str], Callable[[int, int], None]] | None = None,
) -> BuildResult:
    """Tokenizer + model + SFT on ``demos`` + ``cfg.correction_rounds`` DAgger rounds; writes
    the HF directory to ``out`` atomically. ``phase(name)`` gives a (done, total) callback for
    each round's rollouts and fine-tuning (``on_step`` gets the first SFT's steps)."""
    import torch

    t0 = time.perf_counter()
    if not demos:
        raise SrolloutError("no demonstrations to train the default policy on")
    check_build_config(cfg)
    torch.set_num_threads(cfg.threads)
    cfg = effective_config(cfg)
    if cfg.prompt == "short":  # the policy's own prompt, saved with it (srollout.json)
        demos = [d._replace(system=DEFAULT_POLICY_PROMPT) for d in demos]
    tokenizer = train_tokenizer(demo_texts(demos, cfg.template), cfg.vocab_size, cfg.template)
    examples = demo_examples(tokenizer, demos, cfg.max_context)
    model = make_model(tokenizer, cfg)
    final_loss = sft(model, examples, cfg, tokenizer.pad_token_id, on_step)
    rounds = []
    for r in range(cfg.correction_rounds):
        final_loss, stats = dagger_round(
            model, tokenizer, examples, demos[0].system, cfg, r, phase, tokenizer.pad_token_id
        )
        rounds.append(stats._asdict())
    n_params = sum(p.numel() for p in model.parameters())
    seconds = time.perf_counter() - t0
    info = {
        "builder": f"srollout default policy {BUILD_VERSION}",
        "config": dataclasses.asdict(cfg),
        "config_hash": config_hash(cfg),
        "precision": "bf16 autocast" if cfg.bf16 else "fp32",
        "built_on": build_machine(),
        "n_params": n_params,
        "n_demos": len(demos),
        "n_tokens": sum(len(e.token_ids) for e in examples),
        "n_loss_tokens": sum(sum(e.loss_mask) for e in examples),
        "final_loss": final_loss,
        "dagger_rounds": rounds,
        "seconds": seconds,
        "system_prompt": DEFAULT_POLICY_PROMPT if cfg.prompt == "short" else None,
        **(extra_info or {}),
    }
    _save_atomic(model, tokenizer, out, info)
    return BuildResult(
        out, n_params, len(demos), info["n_tokens"], info["n_loss_tokens"], final_loss, seconds
    )


def check_build_config(cfg: BuildConfig) -> None:
    """Reject a config the build would only trip over minutes in (after the demonstrations)."""
    from srollout.envs.gen import DIFFICULTIES
    from srollout.envs.prompts import check_user_template
    from srollout.policy.experts import EXPLORE_ORDERS, TAKE_RULES, THOUGHT_STYLES

    for field, allowed in (
        ("prompt", ("short", "react")),
        ("template", CHAT_TEMPLATES),
        ("explore", EXPLORE_ORDERS),
        ("take", TAKE_RULES),
        ("thoughts", ("none", *THOUGHT_STYLES)),
        ("difficulty", tuple(DIFFICULTIES)),
    ):
        _check_choice(getattr(cfg, field), allowed, f"BuildConfig.{field}")
    check_user_template(cfg.user_template, "BuildConfig")
    may_be_zero = ("seed", "correction_rounds", "correction_replay", "correction_branches")
    for field in dataclasses.fields(cfg):
        value = getattr(cfg, field.name)
        if type(value) is int and value < 1 and field.name not in may_be_zero:
            flag = "--" + field.name.replace("_", "-")
            raise SrolloutError(f"BuildConfig.{field.name} ({flag}) must be >= 1, got {value}")
    betas = (cfg.correction_beta, cfg.correction_beta_decay)
    if cfg.correction_rounds < 0 or not all(0 <= b <= 1 for b in betas):
        msg = "correction_rounds must be >= 0 and correction_beta in [0, 1] (its decay too)"
        raise SrolloutError(f"BuildConfig: {msg}")


def demo_examples(
    tokenizer: Any, demos: Sequence[tuple[str, list[Turn]]], max_context: int
) -> list[TokenizedChat]:
    """Conversations ((system, turns), e.g. :class:`Demo`) as SFT examples, each cut to
    ``max_context``."""
    im_end = tokenizer.convert_tokens_to_ids(IM_END)
    return [
        slice_chat(tokenize_chat(tokenizer, system, turns, im_end), 0, max_context)
        for system, turns in demos
    ]


def round_finetuning(
    tokenizer: Any,
    examples: Sequence[TokenizedChat],
    won: Sequence[tuple[str, list[Any]]],
    branches: Sequence[tuple[str, list[Any]]],
    cfg: BuildConfig,
    round_idx: int,
) -> tuple[list[TokenizedChat], BuildConfig]:
    """What round ``round_idx`` fine-tunes on (:func:`round_examples` plus a seeded sample of
    ``cfg.correction_replay`` of the original ``examples``) and the config it fine-tunes with."""
    rng = random.Random(f"srollout-dagger-replay:{cfg.seed}:{round_idx}")
    replay = rng.sample(list(examples), min(cfg.correction_replay, len(examples)))
    if 0 < cfg.correction_branches < len(branches):
        keep = random.Random(f"srollout-dagger-branches:{cfg.seed}:{round_idx}").sample(
            range(len(branches)), cfg.correction_branches
        )
        branches = [branches[i] for i in sorted(keep)]
    tune = dataclasses.replace(cfg, epochs=cfg.correction_epochs, lr=cfg.correction_lr)
    return round_examples(tokenizer, won, branches, cfg.max_context) + replay, tune


def round_examples(
    tokenizer: Any,
    won: Sequence[tuple[str, list[Any]]],
    branches: Sequence[tuple[str, list[Any]]],
    max_context: int,
) -> list[TokenizedChat]:
    """A DAgger round's fine-tuning examples: the won conversations (cut to ``max_context``),
    then the relabelled branches, which teach their last turn only (no observation loss; a
    branch past ``max_context`` is dropped, not cut, which would lose the label)."""
    im_end = tokenizer.convert_tokens_to_ids(IM_END)
    out = demo_examples(tokenizer, won, max_context)
    for system, turns in branches:
        ex = tokenize_chat(tokenizer, system, turns, im_end)
        if len(ex.token_ids) <= max_context:  # a turn that fit the rollout fits here
            out.append(ex._replace(obs_mask=[False] * len(ex.token_ids)))
    return out


def dagger_round(
    model: Any,
    tokenizer: Any,
    examples: Sequence[TokenizedChat],
    system: str,
    cfg: BuildConfig,
    round_idx: int,
    phase: Callable[[str], Callable[[int, int], None]] | None,
    pad_id: int,
    lm_for: Callable[[], Any] | None = None,
    *,
    played_file: Path | None = None,
    resume: tuple[int, Any] | None = None,
    checkpoint: Callable[[int, Any], None] | None = None,
) -> tuple[float, Any]:
    """One DAgger round (srollout.default_policy.dagger) on ``model`` in place: play, label,
    fine-tune on the won trajectories, the relabelled branches (at most
    ``cfg.correction_branches`` where set) and ``cfg.correction_replay`` of the original
    ``examples``. ``model`` may be a LoRA-wrapped causal LM: only trainable weights move.
    ``lm_for()``: the policy the model plays through this round (default: in process).
    Resumable: the play is kept in ``played_file``; ``resume`` / ``checkpoint``: :func:`sft`'s.
    Returns the fine-tuning's last-epoch loss and the round's counts."""
    import pickle

    from srollout.default_policy.dagger import play_round, round_tasks
    from srollout.envs.tasks import load_task_set

    name = f"DAgger round {round_idx + 1}/{cfg.correction_rounds}"
    if played_file is not None and played_file.is_file():
        won, branches, stats = pickle.loads(played_file.read_bytes())
    else:
        train = load_task_set(cfg.task_set, cfg.difficulty, n=cfg.n_demo_tasks, progress=False)
        tasks = round_tasks(train, cfg, round_idx)
        rollouts, lm = phase(f"{name}: rollouts") if phase else None, lm_for() if lm_for else None
        won, branches, stats = play_round(
            model, tokenizer, tasks, system, cfg, round_idx, rollouts, lm=lm
        )
        if played_file is not None:
            blob = pickle.dumps((won, branches, stats))
            atomic_file(played_file, lambda tmp: Path(tmp).write_bytes(blob))
    data, tune = round_finetuning(tokenizer, examples, won, branches, cfg, round_idx)
    report = phase(f"{name}: fine-tuning") if phase else None
    on_step = (lambda s, t, _: report(s, t)) if report else None
    return sft(model, data, tune, pad_id, on_step, resume=resume, checkpoint=checkpoint), stats


def build_default_policy(
    cfg: BuildConfig | None = None, *, out: Path | None = None, quiet: bool = False
) -> BuildResult:
    """Build the default policy (demonstrations -> tokenizer -> model -> SFT -> save), each phase
    with the stages' progress bar (:class:`srollout.progress.PhaseBars`); returns where it
    was written and what it cost."""
    asked = cfg or BuildConfig()
    check_build_config(asked)
    cfg = effective_config(asked)
    out = Path(out) if out is not None else default_policy_dir(cfg)
    t0 = time.perf_counter()
    console = make_console()
    if not quiet:
        why = " (this CPU has no native bf16, where bf16 autocast is far slower)"
        why = "" if cfg.bf16 == asked.bf16 else why
        text = f"building {out.name}: SFT in {'bf16 autocast' if cfg.bf16 else 'fp32'}{why}"
        console.print(text, highlight=False)
    units = {"generating games": "games", "demonstrations": "episodes", "SFT": "steps"}
    with PhaseBars(console, enabled=not quiet, unit=units) as bars:
        demos = make_demonstrations(
            cfg, bars.phase("demonstrations"), bars.phase("generating games")
        )
        demo_s = time.perf_counter() - t0
        sft_bar = bars.phase("SFT")

        def on_step(step: int, total: int, loss: float) -> None:
            sft_bar(step, total, f"loss {loss:.3f}")

        res = build_from_demos(demos, cfg, out, on_step, {"demo_seconds": demo_s}, bars.phase)
    total = time.perf_counter() - t0
    record = json.loads((out / "build.json").read_text())
    wall = {"demonstrations (games included)": round(demo_s), "total": round(total)}
    record["wall_clock_seconds"] = wall
    atomic_write_text(json.dumps(record, indent=2, default=str) + "\n", out / "build.json")
    return res._replace(seconds=total)


def _save_atomic(model: Any, tokenizer: Any, out: Path, info: dict[str, Any]) -> None:
    """Write the model directory through :func:`srollout.atomic.atomic_dir` (a finished build of
    the same config already at ``out`` wins; ours is then discarded)."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    with atomic_dir(out, keep_existing=is_built(out)) as tmp:
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        # loadable by transformers 4.x too (vLLM may pin it): the generic fast-tokenizer class,
        # and the chat template embedded (v5 writes it to a .jinja file)
        tok_path, chat = tmp / "tokenizer_config.json", tokenizer.chat_template
        tok_cfg = json.loads(tok_path.read_text())
        tok_cfg.update(tokenizer_class="PreTrainedTokenizerFast", chat_template=chat)
        tok_path.write_text(json.dumps(tok_cfg, indent=2) + "\n")
        template = info["config"]["user_template"]
        if info.get("system_prompt") or template != USER_TEMPLATE:  # ReAct is the default
            spec = {
                "system_prompt": info.get("system_prompt") or system_prompt(),
                "user_template": template,
            }
            (tmp / MODEL_PROMPT_FILE).write_text(json.dumps(spec, indent=2) + "\n")
        (tmp / "build.json").write_text(json.dumps(info, indent=2, default=str) + "\n")
