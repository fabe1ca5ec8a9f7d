"""Quick evaluation of an LM policy on the real ALFWorld engine: G trajectories per task, all
trajectories of all groups stepped together (one batched ``act`` per tick), no gate.

    python benchmarks/eval_policy.py [--model DIR] [--groups 24] [--G 8] [--t-max 30]
                                     [--temperature 0.7] [--tasks eval] [--difficulty small]
                                     [--threads 2]

Prints success rate, label mix (all-fail / mixed / all-succeed), valid-action rate and cost.
This is the default policy's acceptance check (targets: success 25-75 %, >= 40 % of groups
mixed, valid actions >= 90 % at temperature 0.7 on the eval set).
"""

from __future__ import annotations

import argparse
import json
import time
from collections import Counter
from pathlib import Path
from typing import NamedTuple


class EvalResult(NamedTuple):
    """success: mean final reward; mixed / all_fail / all_succeed: group label fractions; valid:
    share of steps whose action was admissible; steps: mean trajectory length; seconds:
    wall-clock; gen_tokens: generated tokens; invalid_examples: a few invalid actions; invalid /
    invalid_repeats: invalid steps, and those that repeat the trajectory's previous action."""

    success: float
    mixed: float
    all_fail: float
    all_succeed: float
    valid: float
    steps: float
    seconds: float
    gen_tokens: int
    n_groups: int
    invalid_examples: list[str]
    invalid: int = 0
    invalid_repeats: int = 0


def load_tasks(name: str, n: int, difficulty: str = "small"):
    """The first ``n`` tasks of task set ``name`` at ``difficulty`` (srollout.envs.tasks)."""
    from srollout.envs.tasks import load_task_set

    return list(load_task_set(name, difficulty, n=n, progress=False))


def evaluate(
    policy,
    tasks,
    G: int = 8,
    t_max: int = 30,
    seed: int = 0,
    progress: bool = True,
    system: str | None = None,
    user_template: str | None = None,
) -> EvalResult:
    """Roll out G trajectories per task with ``policy`` on the rollout engine (``run_groups``, as
    ``collect`` does: same seeds as ``collect --seed``), every group in flight at once
    (``system`` / ``user_template``: the prompt, default the ReAct one)."""
    from srollout.envs.alfworld_env import AlfworldEnv
    from srollout.rollout.engine import RolloutSettings, make_specs, run_groups
    from srollout.rollout.react import ReactPrompter

    t0 = time.perf_counter()
    groups = []

    def on_group(group) -> None:
        groups.append(group)
        if progress:
            print(
                f"  {len(groups):4d}/{len(tasks)} groups, {time.perf_counter() - t0:6.1f} s",
                flush=True,
            )

    settings = RolloutSettings(
        G=G, T_max=t_max, seed=seed, concurrency=G * max(1, len(tasks)), signal_K=()
    )
    summary = run_groups(
        make_specs(tasks, len(tasks)),
        policy,
        lambda: AlfworldEnv(expert_plan=False),
        ReactPrompter(system, user_template),
        settings,
        on_group=on_group,
    )
    labels = Counter()
    for g in groups:
        m = sum(g.rewards) / len(g.rewards)
        labels["all_succeed" if m == 1 else "all_fail" if m == 0 else "mixed"] += 1
    trajs = [t for g in groups for t in g.trajs]
    steps = [s for t in trajs for s in t.steps]
    invalid = Counter(s["action"] for s in steps if not s["valid"])
    repeats = sum(
        not b["valid"] and b["action"] == a["action"]
        for t in trajs
        for a, b in zip(t.steps, t.steps[1:], strict=False)
    )
    n = len(groups)
    return EvalResult(
        success=sum(t.success for t in trajs) / len(trajs),
        mixed=labels["mixed"] / n,
        all_fail=labels["all_fail"] / n,
        all_succeed=labels["all_succeed"] / n,
        valid=sum(s["valid"] for s in steps) / max(1, len(steps)),
        steps=len(steps) / len(trajs),
        seconds=time.perf_counter() - t0,
        gen_tokens=summary.n_gen_tokens,
        n_groups=n,
        invalid_examples=[f"{a!r} x{c}" for a, c in invalid.most_common(8)],
        invalid=sum(invalid.values()),
        invalid_repeats=repeats,
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None)
    ap.add_argument("--groups", type=int, default=24)
    ap.add_argument("--G", type=int, default=8)
    ap.add_argument("--t-max", type=int, default=30)
    ap.add_argument("--temperature", type=float, default=0.7)
    ap.add_argument("--tasks", default="eval")
    ap.add_argument(
        "--difficulty",
        default="small",
        help="room size preset: small (the default task set), medium, ...",
    )
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", default=None, help="also write the result here")
    args = ap.parse_args()

    import torch

    torch.set_num_threads(args.threads)
    from srollout.default_policy import default_policy
    from srollout.policy.transformers_backend import TransformersPolicy

    model = Path(args.model) if args.model else default_policy()
    policy = TransformersPolicy(
        model, temperature=args.temperature, max_new_tokens=48, max_batch_rows=96
    )
    from srollout.envs.prompts import model_prompt

    prompt = model_prompt(model)
    res = evaluate(
        policy,
        load_tasks(args.tasks, args.groups, args.difficulty),
        args.G,
        args.t_max,
        args.seed,
        system=prompt.system,
        user_template=prompt.user_template,
    )
    print(
        f"model {model}\n{res.n_groups} {args.difficulty} groups x G={args.G}, "
        f"T_max={args.t_max}, T={args.temperature}: success {res.success:.1%}, mixed "
        f"{res.mixed:.1%} (all-fail {res.all_fail:.1%}, all-succeed "
        f"{res.all_succeed:.1%}), valid actions {res.valid:.1%}, {res.steps:.1f} "
        f"steps/traj, {res.seconds:.0f} s, {res.gen_tokens / res.seconds:.0f} gen tok/s"
    )
    print(
        f"{res.invalid_repeats} of {res.invalid} invalid actions repeat the action before;",
        "most frequent:",
        "; ".join(res.invalid_examples),
    )
    if args.json:
        Path(args.json).write_text(json.dumps(res._asdict(), indent=2))


if __name__ == "__main__":
    main()
