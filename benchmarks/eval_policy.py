"""Quick evaluation of an LM policy on the real ALFWorld engine: G trajectories per task, all
trajectories of all groups stepped together (one batched ``act`` per tick), no gate.

    python benchmarks/eval_policy.py [--model DIR] [--groups 24] [--G 8] [--t-max 30]
                                     [--temperature 0.7] [--tasks eval] [--threads 2]

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
    """success: mean final reward; mixed / all_fail / all_succeed: group label fractions;
    valid: share of steps whose action was admissible; steps: mean trajectory length;
    seconds: wall-clock; gen_tokens: generated tokens; invalid_examples: a few invalid actions."""

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


def load_tasks(name: str, n: int):
    """The first ``n`` tasks of task set ``name`` (srollout.envs.tasks)."""
    from srollout.envs.tasks import load_task_set

    return list(load_task_set(name, n=n, progress=False))


def evaluate(policy, tasks, G: int = 8, t_max: int = 30, seed: int = 0, progress: bool = True, system: str | None = None,
             user_template: str | None = None) -> EvalResult:
    """Roll out G trajectories per task with ``policy`` on the real engine, all at once
    (``system`` / ``user_template``: the prompt, default the ReAct one)."""
    from srollout.envs.alfworld_env import AlfworldEnv
    from srollout.envs.prompts import USER_TEMPLATE, parse_response, system_prompt, user_turn
    from srollout.policy.base import ActRequest, TrajKey

    t0 = time.perf_counter()
    system = system if system is not None else system_prompt()
    template = user_template or USER_TEMPLATE
    live = {}
    for gi, task in enumerate(tasks):
        for j in range(G):
            env = AlfworldEnv(expert_plan=False)
            obs, info = env.reset(task, seed)
            live[TrajKey(f"g{gi:04d}", j)] = {"env": env, "task": task.task_text,
                                               "user": user_turn(obs, task.task_text, template, info.admissible),
                                               "reward": 0.0, "steps": 0}
    rewards: dict[str, list[float]] = {f"g{gi:04d}": [] for gi in range(len(tasks))}
    n_valid = n_steps = gen_tokens = 0
    invalid = Counter()
    for step in range(1, t_max + 1):
        keys = list(live)
        if not keys:
            break
        reqs = [
            ActRequest(key=k, step=step, seed=seed * 1_000_003 + int(k.group_id[1:]) * 64 + k.traj_idx,
                       system=system, user=live[k]["user"])
            for k in keys
        ]
        outs = policy.act(reqs)
        for k, out in zip(keys, outs, strict=False):
            st = live[k]
            gen_tokens += out.n_gen_tokens
            action = parse_response(out.text).action
            res = st["env"].step(action)
            n_steps += 1
            n_valid += res.valid
            if not res.valid:
                invalid[action] += 1
            st["steps"] += 1
            st["reward"] = max(st["reward"], res.reward)
            st["user"] = user_turn(res.observation, st["task"], template, res.admissible)
            if res.done or step == t_max:
                policy.finish(k)
                st["env"].close()
                rewards[k.group_id].append(st["reward"])
                del live[k]
        if progress:
            print(f"  step {step:2d}: {len(live):4d} live, {time.perf_counter() - t0:6.1f} s", flush=True)
    labels = Counter()
    for r in rewards.values():
        m = sum(r) / len(r)
        labels["all_succeed" if m == 1 else "all_fail" if m == 0 else "mixed"] += 1
    n = len(rewards)
    all_r = [x for r in rewards.values() for x in r]
    return EvalResult(
        success=sum(all_r) / len(all_r),
        mixed=labels["mixed"] / n,
        all_fail=labels["all_fail"] / n,
        all_succeed=labels["all_succeed"] / n,
        valid=n_valid / max(1, n_steps),
        steps=n_steps / len(all_r),
        seconds=time.perf_counter() - t0,
        gen_tokens=gen_tokens,
        n_groups=n,
        invalid_examples=[f"{a!r} x{c}" for a, c in invalid.most_common(8)],
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None)
    ap.add_argument("--groups", type=int, default=24)
    ap.add_argument("--G", type=int, default=8)
    ap.add_argument("--t-max", type=int, default=30)
    ap.add_argument("--temperature", type=float, default=0.7)
    ap.add_argument("--tasks", default="eval")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", default=None, help="also write the result here")
    args = ap.parse_args()

    import torch

    torch.set_num_threads(args.threads)
    from srollout.policy.default_model import ensure_default_policy
    from srollout.policy.transformers_backend import TransformersPolicy

    model = Path(args.model) if args.model else ensure_default_policy()
    policy = TransformersPolicy(model, temperature=args.temperature, max_new_tokens=48, max_batch_rows=96)
    from srollout.envs.prompts import model_prompt

    prompt = model_prompt(model)
    res = evaluate(policy, load_tasks(args.tasks, args.groups), args.G, args.t_max, args.seed, system=prompt.system,
                   user_template=prompt.user_template)
    print(
        f"model {model}\n{res.n_groups} groups x G={args.G}, T_max={args.t_max}, T={args.temperature}: "
        f"success {res.success:.1%}, mixed {res.mixed:.1%} (all-fail {res.all_fail:.1%}, all-succeed "
        f"{res.all_succeed:.1%}), valid actions {res.valid:.1%}, {res.steps:.1f} steps/traj, "
        f"{res.seconds:.0f} s, {res.gen_tokens / res.seconds:.0f} gen tok/s"
    )
    print("most frequent invalid actions:", "; ".join(res.invalid_examples))
    if args.json:
        Path(args.json).write_text(json.dumps(res._asdict(), indent=2))


if __name__ == "__main__":
    main()
