"""Scoring trajectory stops offline: what the stall rule (W, k0) or the loop detector (k0) would
have stopped in an ungated collect, how often wrongly, what it saves, what the stops do to the
GRPO batch, and a held-out choice of the stall rule under a precision floor. Every number is
judged by the trajectories' full outcomes; the definitions (stop, false stop, measured saving,
the batch, the random reference) are docs/gates.md's ("The trajectory gate", Offline).

Shapes: N trajectories, T = the longest one's steps, padded past each trajectory's end
(:class:`Trajectories`, :func:`loop_stops`). Each rule's body is its elementwise function in
:mod:`srollout.core.trajectory_signals`, applied here to every step at once.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

from srollout.core.trajectory_signals import LoopCounts, loop_fires, stall_fires


class Trajectories(NamedTuple):
    """An ungated collect's trajectories as arrays (N trajectories, T steps).

    group: [N] int, the group each belongs to (0..n_groups-1); n_steps: [N] real steps taken;
    success: [N] bool, the full outcome; since_new: [N, T] int (−1 past the end); step_reward:
    [N, T] float and step_tokens: [N, T] int (0 past the end).
    """

    group: np.ndarray
    n_steps: np.ndarray
    success: np.ndarray
    since_new: np.ndarray
    step_reward: np.ndarray
    step_tokens: np.ndarray


class StopScore(NamedTuple):
    """What a set of stops did, judged by the full outcomes."""

    n_stops: int
    n_false: int
    precision: float  # nan without stops
    step_savings: float  # steps after the stops / all steps
    token_savings: float  # tokens of those steps / all tokens
    to_zero_var: int  # mixed groups the stops made zero-variance
    to_mixed: int  # zero-variance groups the stops made mixed
    adv_l2_moved: float  # ||A' - A||² / ||A||² over the batch (0 when ||A||² is 0)
    groups_ended_early: int  # groups whose last trajectory ends earlier than it would have


def first_stops(fire: np.ndarray, n_steps: np.ndarray) -> np.ndarray:
    """[N] the first step t (1-based) at which ``fire`` ([N, T] bool: a rule fires after step t)
    holds and the trajectory went on (t < n_steps, [N]: a trajectory gate is not asked after a
    trajectory's last step), 0 where there is none."""
    t = np.arange(1, fire.shape[1] + 1)
    fire = fire & (t < n_steps[:, None])
    first = fire.argmax(axis=1) + 1
    return np.where(fire.any(axis=1), first, 0)


def stall_stops(trajs: Trajectories, W: int, k0: int) -> np.ndarray:
    """[N] the step after which the stall rule (W, k0) stops each trajectory, 0 where it does
    not: the first t >= k0, t < n_steps, with since_new after step t >= W."""
    t = np.arange(1, trajs.since_new.shape[1] + 1)
    return first_stops(stall_fires(t, trajs.since_new, W, k0), trajs.n_steps)


def loop_stops(counts: LoopCounts, n_steps: np.ndarray, k0: int) -> np.ndarray:
    """[N] the step after which the loop detector (k0) stops each trajectory, 0 where it does
    not; ``counts``: three [N, T] int arrays (0 past the end), ``n_steps`` [N]."""
    t = np.arange(1, np.shape(counts.same_pair_run)[1] + 1)
    return first_stops(loop_fires(t, counts, k0), n_steps)


def _rewards(trajs: Trajectories, stop: np.ndarray) -> np.ndarray:
    T = trajs.step_reward.shape[1]
    keep = np.where(stop > 0, stop, T)
    upto = np.arange(1, T + 1)[None, :] <= keep[:, None]
    return (trajs.step_reward * upto).sum(axis=1)


def _per_group(values: np.ndarray, group: np.ndarray, n: int, ufunc: np.ufunc, start: float):
    out = np.full(n, start)
    ufunc.at(out, group, values)
    return out


def _advantages(rewards: np.ndarray, group: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Every trajectory's GRPO advantage within its group, vectorised over groups ([N] -> [N]),
    as :func:`srollout.core.grpo.group_advantages` computes it one group at a time; and [n] each
    group's zero variance (:func:`srollout.core.grpo.is_zero_variance`: max - min <= 1e-12)."""
    size = np.bincount(group, minlength=n)
    centred = rewards - (np.bincount(group, rewards, n) / np.maximum(size, 1))[group]
    std = np.sqrt(np.bincount(group, centred * centred, n) / np.maximum(size, 1))
    spread = _per_group(rewards, group, n, np.maximum, -np.inf)
    spread -= _per_group(rewards, group, n, np.minimum, np.inf)
    zero = spread <= 1e-12
    adv = np.where(zero[group], 0.0, centred / (std[group] + 1e-6))
    return adv, zero & (size > 0)


def score_stops(trajs: Trajectories, stop: np.ndarray) -> StopScore:
    """Score the stops ``stop`` ([N], 0 = not stopped) by the full outcomes."""
    stopped = stop > 0
    n_stops = int(stopped.sum())
    n_false = int((stopped & trajs.success).sum())
    T = trajs.step_tokens.shape[1]
    after = np.arange(1, T + 1)[None, :] > np.where(stopped, stop, T)[:, None]
    steps_total = float(trajs.n_steps.sum())
    tokens_total = float(trajs.step_tokens.sum())
    steps_saved = float(np.where(stopped, trajs.n_steps - stop, 0).sum())
    tokens_saved = float((trajs.step_tokens * after).sum())
    g = trajs.group
    n = int(g.max()) + 1 if len(g) else 0
    present = np.bincount(g, minlength=n) > 0
    a, was = _advantages(_rewards(trajs, np.zeros_like(stop)), g, n)
    b, now = _advantages(_rewards(trajs, stop), g, n)
    norm = float(np.sum(a * a))
    ends = np.where(stopped, stop, trajs.n_steps).astype(float)
    longest = _per_group(trajs.n_steps.astype(float), g, n, np.maximum, -np.inf)
    early = _per_group(ends, g, n, np.maximum, -np.inf) < longest
    return StopScore(
        n_stops=n_stops,
        n_false=n_false,
        precision=(n_stops - n_false) / n_stops if n_stops else math.nan,
        step_savings=steps_saved / steps_total if steps_total else 0.0,
        token_savings=tokens_saved / tokens_total if tokens_total else 0.0,
        to_zero_var=int((now & ~was).sum()),
        to_mixed=int((was & ~now & present).sum()),
        adv_l2_moved=float(np.sum((b - a) ** 2)) / norm if norm else 0.0,
        groups_ended_early=int((early & present).sum()),
    )


def random_stops(trajs: Trajectories, stop: np.ndarray, seed: int) -> np.ndarray:
    """As many stops as ``stop`` makes, at the same steps, each on a trajectory drawn uniformly
    from those still live after that step and not drawn yet (latest steps first, so a draw is
    always possible)."""
    rng = np.random.default_rng(seed)
    out = np.zeros_like(stop)
    free = np.ones(len(stop), dtype=bool)
    for t in sorted(stop[stop > 0].tolist(), reverse=True):
        live = np.flatnonzero(free & (trajs.n_steps > t))
        i = int(rng.choice(live))
        out[i], free[i] = t, False
    return out


class RandomScore(NamedTuple):
    """The random reference, averaged over ``n_draws`` seeded draws."""

    precision: float
    step_savings: float
    token_savings: float


def random_reference(trajs: Trajectories, stop: np.ndarray, seed: int, n_draws: int = 20):
    """The mean score of ``n_draws`` random stop sets matching ``stop`` (:func:`random_stops`)."""
    scores = [score_stops(trajs, random_stops(trajs, stop, seed + d)) for d in range(n_draws)]
    return RandomScore(
        precision=float(np.nanmean([s.precision for s in scores])) if stop.any() else math.nan,
        step_savings=float(np.mean([s.step_savings for s in scores])),
        token_savings=float(np.mean([s.token_savings for s in scores])),
    )


def choose_rule(scores: dict[tuple[int, int], StopScore], floor: float) -> tuple[int, int] | None:
    """The rule (W, k0) with the largest measured step saving whose precision is at least
    ``floor``; ties to the larger W, then the larger k0 (the more cautious rule). None if no rule
    with a stop clears the floor."""
    ok = [(s.step_savings, r) for r, s in scores.items() if s.n_stops and s.precision >= floor]
    return max(ok)[1] if ok else None


class HeldOut(NamedTuple):
    """A cross-fitted choice: every fold's stops come from the rule chosen on the other folds."""

    stop: np.ndarray  # [N] held-out stops
    rules: list[tuple[int, int] | None]  # the rule each fold got (None: no rule cleared)
    fold_of_group: np.ndarray  # [n_groups]


def crossfit(
    trajs: Trajectories,
    grid: Sequence[tuple[int, int]],
    floor: float,
    n_folds: int = 5,
    seed: int = 0,
) -> HeldOut:
    """Choose the rule on n_folds − 1 folds of the groups (seeded split), stop the held-out
    fold's trajectories with it; every group is held out once. The held-out loop is the gates'
    (:func:`srollout.core.learned_gate.nested_heldout_cuts`), each trajectory in its group's
    fold."""
    from srollout.core.learned_gate import nested_heldout_cuts

    n_groups = int(trajs.group.max()) + 1 if len(trajs.group) else 0
    n_folds = max(1, min(n_folds, n_groups))  # no empty fold
    fold = np.random.default_rng(seed).permutation(n_groups) % n_folds
    stops = {rule: stall_stops(trajs, *rule) for rule in grid}
    rules: list[tuple[int, int] | None] = []

    def select(train: np.ndarray):
        part = Trajectories(*(a[train] for a in trajs))
        rule = choose_rule({r: score_stops(part, s[train]) for r, s in stops.items()}, floor)
        rules.append(rule)
        stop = stops[rule] if rule is not None else np.zeros(len(trajs.group), dtype=np.int64)
        return lambda test: (stop[test] > 0, stop[test])

    return HeldOut(nested_heldout_cuts(select, fold[trajs.group]).cut_K, rules, fold)
