"""DAgger rounds for the default policy: the SFT model plays, the expert labels and steps in.

Supervised fine-tuning on expert demonstrations teaches the states the expert visits. A small
model leaves them after its first mistake (an object it thinks it sees, a receptacle it stands
at) and then repeats the mistake, because no demonstration ever showed what to do *there*. A
DAgger round (Ross, Gordon & Bagnell 2011, with a β-mixture of learner and expert) fixes that:

1. roll out G trajectories on ``correction_tasks`` train tasks; at every step a coin with
   probability ``correction_beta`` lets the expert act, else the model samples its own action
   (temperature ``correction_temperature``); either way the expert, told what was really played
   (``ExpertPolicy.played``), labels the state;
2. keep the won trajectories as conversations in the policy's own prompt: the expert's turns and
   the model's turns that equal the label carry loss, the model's other turns stay in the
   context untrained, exactly like the noise turns of the demonstrations, so the model learns
   the way back from its *own* mistakes;
3. fine-tune on them plus ``correction_replay`` original demonstrations (so the rest is not
   forgotten), ``correction_epochs`` epochs at ``correction_lr``.

Everything is seeded from ``BuildConfig.seed`` and the round index: same config, same rounds.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

from srollout.config import BuildConfig
from srollout.envs.base import Task
from srollout.policy.chat import Turn


def demo_response(expert_text: str, thoughts: str) -> str:
    """The expert's ``Thought: ...\nAction: ...`` as the policy is taught to answer: whole, or
    only its ``Action: ...`` line (``thoughts="none"``)."""
    if thoughts != "none":
        return expert_text
    from srollout.envs.prompts import parse_response

    return f"Action: {parse_response(expert_text).action}"


class RoundStats(NamedTuple):
    """What one round played: trajectories (and how many the expert won with the model),
    steps by who acted, and the model's steps that differed from the expert's label."""

    trajectories: int
    won: int
    model_steps: int
    model_off_label: int
    expert_steps: int
    seconds: float


def round_tasks(tasks: Sequence[Task], cfg: BuildConfig, round_idx: int) -> list[Task]:
    """The train tasks of round ``round_idx``: a seeded sample, a fresh one every round."""
    rng = random.Random(f"srollout-dagger:{cfg.seed}:{round_idx}")
    return rng.sample(list(tasks), min(cfg.correction_tasks, len(tasks)))


def play_round(
    model: Any,
    tokenizer: Any,
    tasks: Sequence[Task],
    system: str,
    cfg: BuildConfig,
    round_idx: int,
    progress: Callable[[int, int], None] | None = None,
) -> tuple[list[tuple[str, list[Turn]]], RoundStats]:
    """One round's rollouts (step 1 of the module docstring): every trajectory of every task in
    flight at once, the model's turns generated in one batch per step.

    Returns the won trajectories as (system prompt, turns) and the round's counts; calls
    ``progress(trajectories finished, total)``.
    """
    import time

    from srollout.envs.alfworld_env import AlfworldEnv
    from srollout.envs.experts import ExpertPolicy
    from srollout.envs.prompts import parse_response, user_turn
    from srollout.policy.base import ActRequest, TrajKey
    from srollout.policy.transformers_backend import TransformersPolicy
    from srollout.rollout.seeding import traj_seeds

    t0 = time.perf_counter()
    policy = TransformersPolicy("in-memory", model=model, tokenizer=tokenizer,
                                temperature=cfg.correction_temperature, max_new_tokens=48, max_batch_rows=128)
    expert = ExpertPolicy(seed=cfg.seed, explore=cfg.explore, take=cfg.take)
    G = cfg.correction_G
    live: dict[TrajKey, dict[str, Any]] = {}
    for gi, task in enumerate(tasks):
        for j in range(G):
            env = AlfworldEnv(expert_plan=True)
            # the rollout engine's seeds; every round's groups get indices of their own
            seeds = traj_seeds(cfg.seed, round_idx * len(tasks) + gi, j)
            seed = seeds.sample
            obs, info = env.reset(task, seeds.env)
            live[TrajKey(f"dagger{round_idx}-{gi}", j)] = {
                "env": env, "task": task, "obs": obs, "info": info, "turns": [], "seed": seed,
                "coin": random.Random(seed),
            }
    total, done = len(live), 0

    def end(k: TrajKey) -> None:
        nonlocal done
        expert.finish(k)
        policy.finish(k)
        live.pop(k)["env"].close()
        done += 1
        if progress is not None:
            progress(done, total)

    won: list[tuple[str, list[Turn]]] = []
    n_model = n_off = n_expert = 0
    try:
        for step in range(1, 31):
            if not live:
                break
            keys = list(live)
            users, labels = {}, {}
            for k in keys:
                t = live[k]
                users[k] = user_turn(t["obs"], t["task"].task_text, cfg.user_template, t["info"].admissible)
                # the expert reads the plain observation turn it was written for
                req = ActRequest(key=k, step=step, seed=t["seed"], system=system, user=user_turn(t["obs"]),
                                 admissible=t["info"].admissible, expert_plan=t["info"].expert_plan)
                text = expert.act([req])[0].text
                labels[k] = (parse_response(text).action, demo_response(text, cfg.thoughts))
            # a trajectory whose next turn would not fit the model's context ends there, lost
            # (a wandering one; the collect engine would stop with an error instead)
            for k in keys:
                need = len(tokenizer(users[k] + labels[k][1])["input_ids"]) + 16 + policy.max_new_tokens
                if policy.context_used(k) + need > policy.max_context:
                    end(k)
            keys = list(live)
            by_model = [k for k in keys if live[k]["coin"].random() >= cfg.correction_beta]
            requests = {k: ActRequest(key=k, step=step, seed=live[k]["seed"], system=system, user=users[k])
                        for k in keys}
            texts = dict(zip(by_model, (r.text for r in policy.act([requests[k] for k in by_model])), strict=True))
            for k in keys:
                t = live[k]
                label, label_text = labels[k]
                if k in texts:
                    played = parse_response(texts[k]).action
                    on_label = played == label
                    t["turns"].append(Turn(users[k], label_text if on_label else texts[k], on_label))
                    n_model += 1
                    n_off += not on_label
                else:
                    played = label
                    policy.force(requests[k], label_text)
                    t["turns"].append(Turn(users[k], label_text, True))
                    n_expert += 1
                expert.played(k, played, t["info"].admissible)
                res = t["env"].step(played)
                t["obs"], t["info"] = res.observation, res
                if res.done or step == 30:
                    if res.done:
                        won.append((system, t["turns"]))
                    end(k)
    finally:
        for t in live.values():
            t["env"].close()
    stats = RoundStats(total, len(won), n_model, n_off, n_expert, time.perf_counter() - t0)
    return won, stats

