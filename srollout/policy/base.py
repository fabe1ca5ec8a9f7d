"""The Policy protocol the rollout engine drives.

The engine keeps many trajectories in flight (every live trajectory of every group in the
pool) and asks the policy for one response per live trajectory per tick, in one call, so a
batched backend can generate for all of them at once. The policy keeps per-trajectory state
(conversation tokens, KV cache, RNG) between calls, keyed by ``TrajKey``, and hands back the
trajectory's token ids and action mask when the engine ends it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple, Protocol, runtime_checkable


class TrajKey(NamedTuple):
    """Identifies one trajectory in flight: group_id (str) and traj_idx (0..G-1)."""

    group_id: str
    traj_idx: int


@dataclass(frozen=True)
class ActRequest:
    """One trajectory's turn.

    key: which trajectory.
    step: 1-based environment step this response will act in.
    seed: the trajectory's sampling seed (same value every step; the policy seeds its
        per-trajectory RNG from it at step 1, so gated and ungated runs match up to step K).
    system: the system prompt (sent at every step; a stateful backend uses it only at step 1).
    user: this step's user turn (the observation o_step, formatted by the ReAct protocol).
    admissible: admissible actions in the current state (non-LLM policies use them).
    expert_plan: the planner's plan from the current state, or () (expert policies use it).
    observation: o_step itself, or None; non-LLM policies read it when ``user`` wraps it in a
        model's template (goal, admissible actions), since they do not parse the template.
    """

    key: TrajKey
    step: int
    seed: int
    system: str
    user: str
    admissible: tuple[str, ...] = ()
    expert_plan: tuple[str, ...] = ()
    observation: str | None = None


@dataclass(frozen=True)
class ActResponse:
    """The policy's raw text for one request, with its cost.

    n_prompt_tokens: tokens newly fed to the model for this turn (prefill), 0 for non-LLMs.
    n_gen_tokens: tokens generated for this response, 0 for non-LLMs.
    logprob_mean, logprob_min: the mean and the minimum of the response's raw token
        log-probabilities, as docs/artifacts.md defines ``logprob_mean``; NaN for a policy that
        has none (the planners) or an empty response.
    """

    text: str
    n_prompt_tokens: int = 0
    n_gen_tokens: int = 0
    logprob_mean: float = math.nan
    logprob_min: float = math.nan


def logprob_summary(logprobs: Sequence[float]) -> tuple[float, float]:
    """``(mean, min)`` of one response's token log-probabilities; ``(nan, nan)`` when empty."""
    if not logprobs:
        return math.nan, math.nan
    return float(sum(logprobs) / len(logprobs)), float(min(logprobs))


@dataclass(frozen=True)
class TrajectoryTokens:
    """The whole multi-turn token sequence of one trajectory, for training.

    token_ids: [L] ints, the exact sequence the model saw and produced.
    action_mask: [L] bools, True where the policy generated the token (assistant responses),
        False where the prompt or the environment injected it.
    """

    token_ids: list[int]
    action_mask: list[bool]


@runtime_checkable
class Policy(Protocol):
    """Generates one response per live trajectory per call.

    ``act`` receives every live trajectory's request of this tick and returns responses in the
    same order; ``finish`` ends a trajectory (done, T_max, or cut by the gate), frees its state
    and returns its tokens (None for non-LLM policies).
    """

    name: str

    def act(self, requests: list[ActRequest]) -> list[ActResponse]: ...

    def finish(self, key: TrajKey) -> TrajectoryTokens | None: ...
