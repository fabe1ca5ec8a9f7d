"""GRPO pieces that do not need torch (paper §3.1, Eq. "advantage"; App. "Teacher-forcing").

- group advantages A_i = (r_i - r̄) / (σ_r + ε), σ_r the *population* std of the G rewards;
- zero-variance test and the three-way group label (all_fail / mixed / all_succeed);
- per-trajectory loss weights for the four loss denominators the trainer can use, so that
  loss = -Σ_i w_i · A_i · Σ_t log π(a_it | prefix) over action tokens only.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np
from numpy.typing import ArrayLike

from srollout.errors import SrolloutError

LOSS_DENOMINATORS = ("paper", "token_mean", "seq_mean", "constant")


def _rewards(rewards: ArrayLike) -> np.ndarray:
    r = np.asarray(rewards, dtype=np.float64)
    if r.ndim != 1 or r.size == 0:
        raise SrolloutError(
            f"rewards must be a non-empty 1-D list of the G final rewards, got shape {r.shape}"
        )
    if not np.all(np.isfinite(r)):
        raise SrolloutError("rewards must be finite numbers (found nan or inf)")
    return r


def group_advantages(rewards: ArrayLike, eps: float = 1e-6) -> np.ndarray:
    """A_i = (r_i - mean) / (std + eps) for one group. rewards: [G] -> advantages: [G].

    std is the population standard deviation (divide by G), as in the paper's σ_r. A
    zero-variance group gets all-zero advantages.
    """
    r = _rewards(rewards)
    if not eps >= 0:
        raise SrolloutError(f"eps must be >= 0, got {eps}")
    centred = r - r.mean()
    std = float(np.sqrt(np.mean(centred * centred)))
    if std == 0.0:
        return np.zeros_like(r)
    return centred / (std + eps)


def reward_variance(rewards: ArrayLike) -> float:
    """σ_r², the population variance (divide by G) of the G final rewards."""
    return float(_outcome(rewards).reward_var[0])


def is_zero_variance(rewards: ArrayLike, atol: float = 1e-12) -> bool:
    """True iff all G rewards are equal up to ``atol`` (max - min <= atol), i.e. σ_r = 0."""
    return bool(_outcome(rewards, atol).zero_var[0])


def group_label(
    rewards: ArrayLike, success_threshold: float = 0.5, success: ArrayLike | None = None
) -> str:
    """ "mixed" iff the G rewards differ (max - min > 1e-12, :func:`is_zero_variance`: GRPO has
    a gradient); else "all_succeed" iff at least half of the trajectories succeeded (``success``,
    each trajectory's outcome as the environment said it: won), else "all_fail". Without
    ``success`` (a table from before it was recorded), iff the mean reward >= threshold.

    Labels use the full (un-gated) outcome of the group. A reward is not a success: a game that
    pays shaped rewards on a loss gives an all-lost group of equal rewards "all_fail".
    """
    won = None if success is None else np.asarray(success, dtype=bool)[None]
    return str(_outcome(rewards, success_threshold=success_threshold, success=won).label[0])


class GroupOutcomes(NamedTuple):
    """Per-group outcome of M groups of equal size: reward_var [M] (σ_r², population),
    zero_var bool[M], label [M] (str)."""

    reward_var: np.ndarray
    zero_var: np.ndarray
    label: np.ndarray


def group_outcomes(
    rewards: ArrayLike,
    atol: float = 1e-12,
    success_threshold: float = 0.5,
    success: ArrayLike | None = None,
) -> GroupOutcomes:
    """:func:`reward_variance`, :func:`is_zero_variance` and :func:`group_label` of each row of
    rewards [M, G] (and ``success`` [M, G] when known) at once: the one body of the three, whose
    scalar forms call it on one row."""
    r = np.asarray(rewards, dtype=np.float64)
    if r.ndim != 2 or r.shape[1] == 0:
        raise SrolloutError(
            f"rewards must be an [M, G] array of G final rewards per group, got shape {r.shape}"
        )
    if not np.all(np.isfinite(r)):
        raise SrolloutError("rewards must be finite numbers (found nan or inf)")
    mean = r.mean(axis=1)
    centred = r - mean[:, None]
    var = np.mean(centred * centred, axis=1)
    zero = r.max(axis=1) - r.min(axis=1) <= atol
    if success is None:
        succeeded = mean >= success_threshold
    else:
        succeeded = np.asarray(success, dtype=bool).mean(axis=1) >= 0.5
    label = np.where(~zero, "mixed", np.where(succeeded, "all_succeed", "all_fail"))
    return GroupOutcomes(var, zero, label)


def _outcome(rewards: ArrayLike, atol: float = 1e-12, **label: Any) -> GroupOutcomes:
    """:func:`group_outcomes` of one group's G rewards (checked as one group's)."""
    return group_outcomes(_rewards(rewards)[None], atol, **label)


def sequence_weights(
    kind: str, n_action_tokens: Sequence[int], constant: float | None = None
) -> np.ndarray:
    """Per-trajectory loss weights w: [N] for loss = -Σ_i w_i A_i Σ_t log p_it (action tokens only).

    n_action_tokens: [N] action-token counts L_i of the N trajectories in the gradient batch.

    - "paper": w_i = 1/N. The paper's L = -(1/N) Σ_i A_i log p(τ_i): REINFORCE averaged over
      trajectories. Long trajectories weigh more (their log-prob sums more tokens), and every
      zero-advantage trajectory still counts in N, which dilutes the gradient (paper §5
      "dilution"); dropping cut groups removes them from N.
    - "token_mean": w_i = 1/Σ_j L_j. Every action token in the batch weighs the same (DAPO's
      token-level loss); also diluted by zero-advantage tokens.
    - "seq_mean": w_i = 1/(N·L_i). Mean over each sequence's tokens, then over sequences (the
      original GRPO / DeepSeekMath form); Dr. GRPO argues this length normalisation biases
      toward short correct and long wrong answers.
    - "constant": w_i = 1/constant. Dr. GRPO's fix: divide by a fixed constant (e.g. the token
      budget), so neither batch composition nor length rescales a trajectory's gradient.

    A trajectory with L_i = 0 has nothing to weigh and gets w_i = 0 under "seq_mean".
    """
    if kind not in LOSS_DENOMINATORS:
        raise SrolloutError(
            f"loss denominator must be one of {', '.join(LOSS_DENOMINATORS)}, got {kind!r}"
        )
    lens = np.asarray(n_action_tokens, dtype=np.float64)
    if lens.ndim != 1:
        raise SrolloutError(
            f"n_action_tokens must be a 1-D list of token counts, got shape {lens.shape}"
        )
    if np.any(lens < 0) or not np.all(np.isfinite(lens)):
        raise SrolloutError("n_action_tokens must be non-negative counts")
    N = lens.size
    if kind == "constant":
        if constant is None or not constant > 0:
            raise SrolloutError(
                f"the 'constant' loss denominator needs constant > 0, got {constant}"
            )
        return np.full(N, 1.0 / constant)
    if N == 0:
        return np.zeros(0)
    if kind == "paper":
        return np.full(N, 1.0 / N)
    if kind == "token_mean":
        total = lens.sum()
        return np.full(N, 1.0 / total) if total > 0 else np.zeros(N)
    # seq_mean
    out = np.zeros(N)
    nz = lens > 0
    out[nz] = 1.0 / (N * lens[nz])
    return out


def zero_advantage_fraction(advantages: Sequence[np.ndarray], atol: float = 1e-8) -> float:
    """Share of trajectories (over all groups) whose advantage is 0 (|A_i| <= atol); nan if none.
    advantages: one [G_g] array per group in the batch."""
    flat = [np.asarray(a, dtype=np.float64).ravel() for a in advantages]
    n = sum(a.size for a in flat)
    if n == 0:
        return float("nan")
    return sum(int(np.count_nonzero(np.abs(a) <= atol)) for a in flat) / n
