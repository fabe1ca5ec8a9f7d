"""A tiny scripted TextEnv and seeded Policy for the engine's unit tests (no ALFWorld, no LM).

The environment is a corridor: "forward" moves one cell, anything else is a no-op ("Nothing
happens."); reaching cell ``length`` wins. The policy is seeded per trajectory and picks
"forward" with probability p_fwd, so groups are a real mix of winners and losers, and every
step's action can be recomputed by hand from the trajectory's seed.
"""

from __future__ import annotations

import random

import polars as pl

from srollout.envs.base import StepResult, Task
from srollout.policy.base import ActRequest, ActResponse, TrajKey
from srollout.rollout.engine import ParsedTurn, run_groups
from srollout.rollout.records import group_tables


class Corridor:
    """A TextEnv: cells 0..length; 'forward' advances, reaching ``length`` is a win."""

    def __init__(self) -> None:
        self.task = None
        self.pos = 0
        self.length = 0
        self.closed = False

    def reset(self, task: Task, seed: int) -> tuple[str, StepResult]:
        self.task, self.pos, self.length = task, 0, int(task.meta["length"])
        return f"cell 0 of {self.length}", StepResult("", 0.0, False, True, ("forward", "wait"))

    def step(self, action: str) -> StepResult:
        if action != "forward":
            return StepResult("Nothing happens.", 0.0, False, False, ("forward", "wait"))
        self.pos += 1
        won = self.pos >= self.length
        return StepResult(f"cell {self.pos}", 1.0 if won else 0.0, won, True, ("forward", "wait"))

    def close(self) -> None:
        self.closed = True


class SeededWalker:
    """A Policy: per-trajectory RNG seeded from the request's seed at step 1."""

    name = "walker"

    def __init__(self, p_fwd: float = 0.5) -> None:
        self.p_fwd = p_fwd
        self.rngs: dict[TrajKey, random.Random] = {}
        self.finished: list[TrajKey] = []

    def act(self, requests: list[ActRequest]) -> list[ActResponse]:
        out = []
        for r in requests:
            if r.step == 1:
                self.rngs[r.key] = random.Random(r.seed)
            action = "forward" if self.rngs[r.key].random() < self.p_fwd else "wait"
            out.append(
                ActResponse(
                    f"Think: go\nAction: {action}",
                    n_prompt_tokens=3,
                    n_gen_tokens=2 if action == "wait" else 1,
                )
            )
        return out

    def finish(self, key: TrajKey):
        assert key in self.rngs, "finish of a trajectory that never acted"
        del self.rngs[key]
        self.finished.append(key)
        return None


class Counting:
    """Wraps a policy; records every (group_id, traj_idx, step) it was asked to generate."""

    def __init__(self, inner) -> None:
        self.inner, self.name = inner, inner.name
        self.calls = 0
        self.rows: list[tuple[str, int, int]] = []
        self.batch_sizes: list[int] = []

    def act(self, requests):
        self.calls += 1
        self.batch_sizes.append(len(requests))
        self.rows += [(r.key.group_id, r.key.traj_idx, r.step) for r in requests]
        return self.inner.act(requests)

    def finish(self, key):
        return self.inner.finish(key)


class Prompter:
    def system(self, task):
        return "sys"

    def user(self, observation, step, task, admissible=()):
        return observation

    def parse(self, text):
        thought, action = text.split("\nAction: ")
        return ParsedTurn(thought.removeprefix("Think: "), action, action.strip().lower())


def tasks(lengths):
    return [
        Task(f"t/{i}", "pick_and_place_simple", "walk", "", meta={"length": n})
        for i, n in enumerate(lengths)
    ]


def roll(specs, settings, policy=None, envs=None):
    policy = policy or SeededWalker()
    made = envs if envs is not None else []

    def factory():
        made.append(Corridor())
        return made[-1]

    records = []
    summary = run_groups(specs, policy, factory, Prompter(), settings, on_group=records.append)
    return records, summary


def steps_of(records) -> pl.DataFrame:
    frames = [group_tables(r).steps for r in records]
    return pl.concat(frames).sort("group_id", "traj_idx", "step").drop("gen_s", "env_s")
