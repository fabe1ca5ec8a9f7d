"""Demonstrations for supervised fine-tuning: (noisy) expert episodes on the real engine, in the
ReAct protocol, with each turn marked noise or not so SFT can mask the loss on noise actions
(they stay in the context: the model learns to recover after "Nothing happens.")."""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from srollout.envs.base import Task
from srollout.envs.prompts import parse_response, system_prompt, user_turn
from srollout.errors import SrolloutError
from srollout.policy.base import ActRequest, TrajKey
from srollout.policy.experts import ExpertPolicy, NoisyExpertPolicy


@dataclass(frozen=True)
class Turn:
    """One step: the user turn (``Observation: ...``), the assistant text
    (``Thought: ...\\nAction: ...``), whether the action was noise (mask its loss), whether
    the engine accepted it, the state's admissible actions and the observation o_t itself (so a
    policy with another user template can render the turn its own way)."""

    user: str
    assistant: str
    is_noise: bool
    valid: bool
    admissible: tuple[str, ...] = ()
    observation: str = ""


@dataclass(frozen=True)
class Episode:
    """One demonstration trajectory: system prompt, steps in order, whether it was won within
    max_steps, its trajectory seed and noise rate."""

    task_id: str
    task_type: str
    system: str
    turns: tuple[Turn, ...]
    success: bool
    n_steps: int
    seed: int
    eps: float

    @property
    def steps(self) -> tuple[Turn, ...]:  # alias used by the policy builder
        return self.turns


def episode_seed(seed: int, i: int) -> int:
    """Trajectory seed of demonstration i under a run seed (stable across machines)."""
    return int(hashlib.sha1(f"srollout-demo:{seed}:{i}".encode()).hexdigest()[:12], 16)


def generate_demonstrations(
    tasks: Sequence[Task],
    n_episodes: int | None = None,
    eps: float | Sequence[float] = 0.3,
    seed: int = 0,
    *,
    episodes_per_task: int | None = None,
    noise: float | Sequence[float] | None = None,
    invalid_frac: float = 0.3,
    invalid_fraction: float | None = None,
    max_steps: int = 30,
    progress: bool | Callable[[int, int], None] = True,
    explore: str = "random",
    take: str = "planned",
    thoughts: str = "react",
    workers: int = 1,
) -> list[Episode]:
    """Play (noisy) expert episodes on the real engine; same arguments -> same episodes.

    Episode i plays ``tasks[i % len(tasks)]`` with trajectory seed ``episode_seed(seed, i)``; its
    repetition r = i // len(tasks) uses noise rate ``eps[r % len(eps)]`` (0: the plain
    ExpertPolicy). Give ``n_episodes`` or ``episodes_per_task``; ``noise`` and
    ``invalid_fraction`` alias ``eps`` and ``invalid_frac``. workers: processes playing episodes
    side by side; an episode depends only on its index, so any number gives the same episodes."""
    from rich.progress import Progress

    if not tasks:
        raise SrolloutError("generate_demonstrations needs at least one task")
    rates = noise if noise is not None else eps
    rates = (float(rates),) if isinstance(rates, (int, float)) else tuple(float(r) for r in rates)
    if not rates:
        raise SrolloutError("generate_demonstrations needs at least one noise rate")
    inv = invalid_fraction if invalid_fraction is not None else invalid_frac
    if n_episodes is None:
        n_episodes = len(tasks) * (episodes_per_task if episodes_per_task is not None else 1)
    style = {"explore": explore, "take": take, "thoughts": thoughts}
    job = _DemoJob(rates, inv, seed, max_steps, style)
    job.policies()  # a bad explore / take / thoughts fails here, before any worker starts
    callback = progress if callable(progress) else None
    # episode i: its task, and the noise rate of its repetition r = i // len(tasks)
    items = [
        (i, tasks[i % len(tasks)], rates[(i // len(tasks)) % len(rates)]) for i in range(n_episodes)
    ]
    size = max(1, min(_CHUNK, -(-n_episodes // (4 * max(1, workers)))))  # >= 4 chunks per worker
    chunks = [items[a : a + size] for a in range(0, n_episodes, size)]
    with Progress(disable=progress is not True) as bar:
        task_id = bar.add_task("demonstrations", total=n_episodes)

        def advance(done: int) -> None:
            bar.update(task_id, completed=done)
            if callback is not None:
                callback(done, n_episodes)

        if workers <= 1 or len(chunks) <= 1:
            return job.play(items, advance)
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor

        episodes: list[Episode] = []
        # spawn, not fork: the caller may hold torch threads or open engine state
        spawn = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(min(workers, len(chunks)), mp_context=spawn) as pool:
            for chunk_episodes in pool.map(job.play, chunks):  # in order
                episodes += chunk_episodes
                advance(len(episodes))
        return episodes


_CHUNK = 20  # most episodes per unit of work for the worker processes


@dataclass(frozen=True)
class _DemoJob:
    """What every demonstration episode of one call shares (picklable for worker processes)."""

    rates: tuple[float, ...]
    invalid_frac: float
    seed: int
    max_steps: int
    style: dict

    def policies(self) -> dict[float, ExpertPolicy]:
        return {
            r: (
                NoisyExpertPolicy(r, self.invalid_frac, **self.style)
                if r > 0
                else ExpertPolicy(**self.style)
            )
            for r in set(self.rates)
        }

    def play(
        self, items: Sequence[tuple[int, Task, float]], advance: Callable[[int], None] | None = None
    ) -> list[Episode]:
        """Play the episodes ``items`` = (index i, task, noise rate); ``advance(n done)`` after
        each."""
        from srollout.envs.alfworld_env import AlfworldEnv

        policies = self.policies()
        env = AlfworldEnv(expert_plan=True)
        episodes: list[Episode] = []
        try:
            for i, task, rate in items:
                episodes.append(self.episode(env, policies[rate], i, task, rate))
                if advance is not None:
                    advance(len(episodes))
        finally:
            env.close()
        return episodes

    def episode(self, env: Any, policy: ExpertPolicy, i: int, task: Task, rate: float) -> Episode:
        """Demonstration ``i``: ``policy`` (noise rate ``rate``) plays ``task`` on ``env``."""
        system, tseed, key = system_prompt(), episode_seed(self.seed, i), TrajKey(f"demo-{i}", 0)
        obs, info = env.reset(task, tseed)
        turns: list[Turn] = []
        for step in range(1, self.max_steps + 1):
            req = ActRequest(
                key=key,
                step=step,
                seed=tseed,
                system=system,
                user=user_turn(obs),
                admissible=info.admissible,
                expert_plan=info.expert_plan,
                observation=obs,
            )
            text = policy.act([req])[0].text
            res = env.step(parse_response(text).action)
            noise, admissible = policy.was_noise(key), tuple(info.admissible)
            turns.append(Turn(req.user, text, noise, res.valid, admissible, obs))
            obs, info = res.observation, res
            if res.done:
                break
        policy.finish(key)
        won = bool(turns) and res.done  # the last step ended the episode
        return Episode(
            task.task_id, task.task_type, system, tuple(turns), won, len(turns), tseed, rate
        )
