"""Compare default-policy recipes quickly: short SFT runs on one fixed set of demonstrations.

    python benchmarks/policy_recipe.py NAME [--set lr=5e-4 obs_loss_weight=0.5 ...]
                                       [--tasks 500] [--eval-tasks 60] [--eval-groups 10]

Noisy-expert demonstrations of ``--tasks`` train tasks and of ``--eval-tasks`` eval tasks (2 each,
as BuildConfig makes them) are generated once and cached under /tmp/srollout-recipe/. NAME trains a
model with ``BuildConfig(**--set)`` (defaults: the shipped BuildConfig with 2 epochs and 1 thread,
so two runs fit side by side on 2 cores), then reports, as one JSON line:

- ``resp_acc``: teacher-forced on the eval episodes, the share of the expert's responses (noise
  turns are not scored) whose every token the model predicts right given the true history;
- ``success`` / ``valid`` / ``mixed``: ``--eval-groups`` eval tasks x G=4 rolled out on the real
  engine at T=0.7, T_max 30 (``eval_policy.evaluate``).

The docs/benchmarks.md section "Default policy v5: what made it learn" was measured with it.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import json
import pickle
import shutil
import sys
import time
from pathlib import Path

CACHE = Path("/tmp/srollout-recipe")


DEMO_FIELDS = (
    "seed",
    "difficulty",
    "demos_per_task",
    "noise",
    "invalid_fraction",
    "explore",
    "take",
    "thoughts",
    "user_template",
)


def demos(task_set: str, n: int, cfg=None):
    """Cached demonstrations of the first ``n`` tasks of ``task_set``, made as ``cfg`` (default:
    the shipped BuildConfig) makes them; the cache key holds every field that shapes them."""
    import hashlib

    from srollout.default_policy.build import make_demonstrations
    from srollout.default_policy.recipe import BuildConfig

    cfg = dataclasses.replace(cfg or BuildConfig(), n_demo_tasks=n, task_set=task_set)
    key = hashlib.sha1(repr([getattr(cfg, f) for f in DEMO_FIELDS]).encode()).hexdigest()[:8]
    path = CACHE / f"{task_set}-{n}-{key}.pkl"
    if path.is_file():
        return pickle.loads(path.read_bytes())
    out = make_demonstrations(cfg)
    CACHE.mkdir(parents=True, exist_ok=True)
    path.write_bytes(pickle.dumps(out))
    return out


def teacher_forced_exact(model_dir: Path, episodes, system: str) -> float:
    """Share of trained responses predicted token for token (greedy) given the true history."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from srollout.policy.chat import IM_END, tokenize_chat

    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    im_end = tok.convert_tokens_to_ids(IM_END)
    n = ok = 0
    for d in episodes:
        ex = tokenize_chat(tok, system, d.turns, im_end)
        ids = torch.tensor([ex.token_ids])
        with torch.no_grad():
            pred = model(ids).logits[0, :-1].argmax(-1)
        tgt, lm = ids[0, 1:], ex.loss_mask[1:]
        i = 0
        while i < len(lm):
            if not lm[i]:
                i += 1
                continue
            j = i
            while j < len(lm) and lm[j]:
                j += 1
            n += 1
            ok += bool((pred[i:j] == tgt[i:j]).all())
            i = j
    return ok / max(n, 1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("name")
    ap.add_argument("--set", nargs="*", default=[], help="BuildConfig overrides, key=value")
    ap.add_argument("--tasks", type=int, default=500)
    ap.add_argument("--eval-tasks", type=int, default=60)
    ap.add_argument("--eval-groups", type=int, default=30)
    ap.add_argument("--eval-G", type=int, default=4)
    args = ap.parse_args()

    import torch

    from srollout.default_policy.build import build_from_demos
    from srollout.default_policy.recipe import BuildConfig
    from srollout.envs.prompts import model_prompt
    from srollout.policy.transformers_backend import TransformersPolicy

    over = {}
    for item in args.set:
        key, value = item.split("=", 1)
        try:
            over[key] = ast.literal_eval(value)
        except (ValueError, SyntaxError):
            over[key] = value
    cfg = dataclasses.replace(BuildConfig(), **{"epochs": 2, "threads": 1, **over})
    torch.set_num_threads(cfg.threads)
    train = demos("train", args.tasks, cfg)
    held = demos("eval", args.eval_tasks, cfg)
    out = CACHE / f"model-{args.name}"
    shutil.rmtree(out, ignore_errors=True)
    t0 = time.perf_counter()
    res = build_from_demos(train, cfg, out)
    train_s = time.perf_counter() - t0
    prompt = model_prompt(out)
    system = prompt.system
    exact = teacher_forced_exact(out, held, system)

    sys.path.insert(0, str(Path(__file__).parent))
    from eval_policy import evaluate, load_tasks

    policy = TransformersPolicy(out, temperature=0.7, max_new_tokens=96, max_batch_rows=96)
    r = evaluate(
        policy,
        load_tasks("eval", args.eval_groups),
        args.eval_G,
        30,
        0,
        progress=False,
        system=system,
        user_template=prompt.user_template,
    )
    print(
        json.dumps(
            {
                "name": args.name,
                **over,
                "train_s": round(train_s),
                "final_loss": round(res.final_loss, 4),
                "n_tokens": res.n_tokens,
                "resp_acc": round(exact, 3),
                "success": round(r.success, 3),
                "valid": round(r.valid, 3),
                "mixed": r.mixed,
                "invalid": r.invalid_examples[:4],
            }
        ),
        flush=True,
    )


if __name__ == "__main__":
    main()
