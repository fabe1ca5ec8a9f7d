"""What a DAgger round should fine-tune on: one round of rollouts, the same rollouts fine-tuned
several ways, each result evaluated on the engine with collect's seeds.

    python benchmarks/dagger_ab.py --model DIR [--round 0] [--arms won,all,invalid]
                                   [--round-tasks N] [--groups 40] [--out WORK] [--threads 2]

Arms: ``won`` — the won trajectories, the model's off-label turns untrained (the build's
default); ``all`` — plus one branch per off-label model step (``correction_relabel``); ``invalid``
— plus only the branches where the model's action was invalid (answered "Nothing happens.";
found in the won trajectories, so lost ones add none). Every arm also replays
``correction_replay`` of the model's original demonstrations, as the build does. The round uses
the build config in ``DIR/build.json`` (the default config for a model without one) and its
prompt (``srollout.json``), round index ``--round`` (for a model built with R rounds, R gives
fresh tasks). Models are written to ``WORK/<arm>``; prints one line per arm (fine-tuning tokens
and seconds, success, mixed, valid actions, invalid actions repeating the one before).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import shutil
import time
from pathlib import Path

from eval_policy import evaluate, load_tasks

ARMS = ("won", "all", "invalid")


def build_config(model: Path):
    """The model's build config (build.json), ``correction_relabel`` on so the round keeps its
    branches (the arms choose which to use)."""
    from srollout.default_policy.recipe import BuildConfig

    fields = {f.name for f in dataclasses.fields(BuildConfig)}
    info = model / "build.json"
    raw = json.loads(info.read_text())["config"] if info.exists() else {}
    raw = {k: v for k, v in raw.items() if k in fields}
    if raw.get("thoughts") is False:  # v5 wrote a bool
        raw["thoughts"] = "none"
    if "noise" in raw:
        raw["noise"] = tuple(raw["noise"])
    return dataclasses.replace(BuildConfig(**raw), correction_relabel=True)


def invalid_only(won, branches):
    """The branches whose state's model action was invalid: the won trajectory they come from
    answers it with "Nothing happens."."""
    from srollout.envs.base import NOTHING_HAPPENS

    keep = []
    for system, b in branches:
        n = len(b)
        head = b[:-1]
        for _, w in won:
            if (
                len(w) > n
                and w[n - 1].user == b[-1].user
                and [t._replace(trained=False) for t in w[: n - 1]] == head
            ):
                if w[n].user.split("\n")[0].endswith(NOTHING_HAPPENS):
                    keep.append((system, b))
                break
    return keep


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True, type=Path)
    ap.add_argument("--round", type=int, default=0)
    ap.add_argument("--arms", default=",".join(ARMS))
    ap.add_argument(
        "--round-tasks",
        type=int,
        default=None,
        help="train tasks in the round (default: the config's)",
    )
    ap.add_argument("--groups", type=int, default=40)
    ap.add_argument("--out", type=Path, default=Path("dagger-ab"))
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    arms = args.arms.split(",")
    if not set(arms) <= set(ARMS):
        raise SystemExit(f"--arms: expected some of {', '.join(ARMS)}, got {args.arms}")

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from srollout.default_policy.build import demo_examples, make_demonstrations, round_finetuning
    from srollout.default_policy.dagger import play_round, round_tasks
    from srollout.default_policy.sft import sft
    from srollout.envs.prompts import model_prompt
    from srollout.envs.tasks import load_task_set
    from srollout.policy.transformers_backend import TransformersPolicy

    torch.set_num_threads(args.threads)
    cfg = dataclasses.replace(build_config(args.model), threads=args.threads)
    if args.round_tasks:
        cfg = dataclasses.replace(cfg, correction_tasks=args.round_tasks)
    prompt = model_prompt(args.model)  # the build's system prompt and user template
    system = prompt.system

    def load():
        return AutoModelForCausalLM.from_pretrained(
            args.model
        ).eval(), AutoTokenizer.from_pretrained(args.model)

    model, tok = load()
    tasks = round_tasks(
        load_task_set(cfg.task_set, cfg.difficulty, n=cfg.n_demo_tasks, progress=False),
        cfg,
        args.round,
    )
    won, branches, stats = play_round(model, tok, tasks, system, cfg, args.round)
    print(
        f"round {args.round}: {stats.trajectories} trajectories, {stats.won} won, "
        f"{stats.model_off_label} of {stats.model_steps} model steps off the label, "
        f"{stats.seconds:.0f} s",
        flush=True,
    )
    examples = demo_examples(
        tok, [d._replace(system=system) for d in make_demonstrations(cfg)], cfg.max_context
    )
    eval_tasks = load_tasks("eval", args.groups, cfg.difficulty)
    for arm in arms:
        extra = {"won": [], "all": branches, "invalid": invalid_only(won, branches)}[arm]
        data, tune = round_finetuning(
            tok, examples, won, extra, cfg, args.round
        )  # as the build's round does
        model, tok = load()
        t0 = time.perf_counter()
        sft(model, data, tune, tok.pad_token_id)
        ft_s = time.perf_counter() - t0
        out = args.out / arm
        shutil.rmtree(out, ignore_errors=True)
        shutil.copytree(args.model, out)
        model.save_pretrained(out)
        policy = TransformersPolicy(out, temperature=0.7, max_new_tokens=48, max_batch_rows=96)
        res = evaluate(
            policy,
            eval_tasks,
            progress=False,
            system=prompt.system,
            user_template=prompt.user_template,
        )
        n_tok = sum(len(e.token_ids) for e in data)
        print(
            f"{arm:8s} {len(extra):4d} branches, {n_tok} tokens, fine-tuning "
            f"{ft_s:.0f} s | {res.n_groups} groups: success {res.success:.1%}, "
            f"mixed {res.mixed:.1%}, valid {res.valid:.1%}, {res.invalid_repeats} "
            f"of {res.invalid} invalid repeat the action before",
            flush=True,
        )


if __name__ == "__main__":
    main()
