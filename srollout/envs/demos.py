"""Demonstrations for supervised fine-tuning: (noisy) expert episodes on the real engine, in the
ReAct protocol, with each turn marked noise or not so SFT can mask the loss on noise actions
(they stay in the context: the model learns to recover after "Nothing happens.")."""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from srollout.envs.base import Task
from srollout.envs.experts import ExpertPolicy, NoisyExpertPolicy
from srollout.errors import SrolloutError
from srollout.policy.base import ActRequest, TrajKey


@dataclass(frozen=True)
class Turn:
    """One step: the user turn (``Observation: ...``), the assistant text
    (``Thought: ...\\nAction: ...``), whether the action was noise (mask its loss) and whether
    the engine accepted it."""

    user: str
    assistant: str
    is_noise: bool
    valid: bool

    @property
    def response(self) -> str:  # alias used by the policy builder
        return self.assistant

    @property
    def noise(self) -> bool:  # alias used by the policy builder
        return self.is_noise


@dataclass(frozen=True)
class Episode:
    """One demonstration trajectory.

    system: the system prompt; turns: the steps in order; success: the task was won within
    max_steps; seed: the trajectory seed; eps: the noise rate used.
    """

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
) -> list[Episode]:
    """Play (noisy) expert episodes on the real engine.

    Episode i plays ``tasks[i % len(tasks)]``; its repetition r = i // len(tasks) uses noise rate
    ``eps[r % len(eps)]`` (a float eps is one rate; 0 means the plain ExpertPolicy) and
    trajectory seed ``episode_seed(seed, i)``. Give either ``n_episodes`` or
    ``episodes_per_task`` (n_episodes = len(tasks) * episodes_per_task). ``noise`` and
    ``invalid_fraction`` are aliases of ``eps`` and ``invalid_frac``. explore: the experts'
    exploration order (``random`` or ``listed``, see ExpertPolicy). progress: show a rich bar
    (bool) or call ``progress(done, total)`` after each episode. Same arguments -> same episodes.
    """
    from rich.progress import Progress

    from srollout.envs.alfworld_env import AlfworldEnv
    from srollout.envs.prompts import parse_response, system_prompt, user_turn

    if not tasks:
        raise SrolloutError("generate_demonstrations needs at least one task")
    rates = noise if noise is not None else eps
    rates = (float(rates),) if isinstance(rates, (int, float)) else tuple(float(r) for r in rates)
    if not rates:
        raise SrolloutError("generate_demonstrations needs at least one noise rate")
    inv = invalid_fraction if invalid_fraction is not None else invalid_frac
    if n_episodes is None:
        n_episodes = len(tasks) * (episodes_per_task if episodes_per_task is not None else 1)
    policies: dict[float, ExpertPolicy] = {
        r: (NoisyExpertPolicy(r, inv, explore=explore) if r > 0 else ExpertPolicy(explore=explore)) for r in set(rates)
    }
    system = system_prompt()
    env = AlfworldEnv(expert_plan=True)
    episodes: list[Episode] = []
    callback = progress if callable(progress) else None
    try:
        with Progress(disable=progress is not True) as bar:
            job = bar.add_task("demonstrations", total=n_episodes)
            for i in range(n_episodes):
                task = tasks[i % len(tasks)]
                rate = rates[(i // len(tasks)) % len(rates)]
                policy = policies[rate]
                tseed = episode_seed(seed, i)
                key = TrajKey(f"demo-{i}", 0)
                obs, info = env.reset(task, tseed)
                turns: list[Turn] = []
                success = False
                for step in range(1, max_steps + 1):
                    req = ActRequest(key=key, step=step, seed=tseed, system=system,
                                     user=user_turn(obs), admissible=info.admissible,
                                     expert_plan=info.expert_plan)
                    text = policy.act([req])[0].text
                    res = env.step(parse_response(text).action)
                    turns.append(Turn(req.user, text, policy.was_noise(key), res.valid))
                    obs, info = res.observation, res
                    if res.done:
                        success = True
                        break
                policy.finish(key)
                episodes.append(Episode(task.task_id, task.task_type, system, tuple(turns),
                                        success, len(turns), tseed, rate))
                bar.advance(job)
                if callback is not None:
                    callback(i + 1, n_episodes)
    finally:
        env.close()
    return episodes
