"""A tiny default-policy build for tests: :func:`build_tiny_policy` trains a ~30k-parameter
Qwen2 and its BPE tokenizer on :func:`synthetic_demos` (no environment needed) through the real
build path (:func:`srollout.default_policy.build.build_from_demos`)."""

from __future__ import annotations

import dataclasses
import random
from pathlib import Path

from srollout.default_policy.build import Demo, build_from_demos, is_built
from srollout.default_policy.recipe import BuildConfig
from srollout.policy.chat import Turn

TINY_CONFIG = BuildConfig(
    prompt="react",
    template="chatml",
    vocab_size=300,
    d_model=64,
    n_layers=1,
    d_ff=128,
    head_dim=32,
    gqa_groups=1,
    max_context=2048,
    epochs=12,
    lr=1e-2,
    batch_tokens=4096,
    bf16=False,
    threads=1,
    obs_loss_weight=0.0,
)


def synthetic_demos(n: int, seed: int = 0) -> list[Demo]:
    """``n`` short ALFWorld-like conversations (ReAct text, one noise turn in three answered
    "Nothing happens."), made without the engine: data for tiny test models only."""
    rng = random.Random(seed)
    places = ["cabinet 1", "cabinet 2", "countertop 1", "fridge 1", "microwave 1", "sinkbasin 1"]
    things = ["apple 1", "mug 2", "bowl 1", "egg 3", "knife 1"]
    system = "You are an agent in a household. Answer with Thought: ... then Action: <action>."
    demos = []
    for _ in range(n):
        thing, dest = rng.choice(things), rng.choice(places)
        seen = rng.choice(places)
        turns = []
        obs = f"You are in the middle of a room. Your task is to: put {thing.split()[0]} in {dest}."
        for step in range(rng.randint(2, 5)):
            if rng.random() < 0.3:
                act, trained = f"take {thing} from {rng.choice(places)}", False
                nxt = "Nothing happens."
            else:
                act, trained = f"go to {seen if step == 0 else dest}", True
                nxt = f"You arrive at {seen}. On it, you see a {thing}."
            turns.append(Turn(obs, f"Thought: I look for {thing}.\nAction: {act}", trained))
            obs = nxt
        demos.append(Demo(system=system, turns=turns))
    return demos


def build_tiny_policy(out: Path, seed: int = 0, n_demos: int = 60) -> Path:
    """A ~30k-parameter Qwen2 with its BPE tokenizer trained on :func:`synthetic_demos`
    (a few seconds on one core); a real HF directory for tests of backends and trainers.
    Returns the directory (an earlier one of this process if already built: treat as read-only)."""
    # within one process (a test session) the same tiny model is built once and shared
    done = _TINY_BUILT.get((seed, n_demos))
    if done is not None and is_built(done):
        return done
    cfg = dataclasses.replace(TINY_CONFIG, seed=seed)
    path = build_from_demos(synthetic_demos(n_demos, seed), cfg, Path(out)).path
    _TINY_BUILT[(seed, n_demos)] = path
    return path


_TINY_BUILT: dict[tuple[int, int], Path] = {}
