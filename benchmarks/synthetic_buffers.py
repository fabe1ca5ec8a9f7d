"""Synthetic `analyze`/`sweep` inputs at any size, generated vectorised (a million groups in
seconds): a signals table and a steps table shaped like ALFWorld GRPO buffers.

    from synthetic_buffers import synthetic_signals, synthetic_steps

Both are seeded. In both, groups whose trajectories agree tend to share their outcome, so d_K
carries signal as in the paper (AUROC of d_10 about 0.75).
"""

from __future__ import annotations

import numpy as np
import polars as pl

from srollout import schemas
from srollout.schemas import SIGNAL_NAMES

G, T_MAX = 8, 30
SIGNAL_KS = (5, 10, 15, 20)
VERBS = ("go to", "open", "take", "put", "examine", "close", "use", "heat", "cool", "clean")
PLACES = tuple(
    f"{p} {i}"
    for p in ("drawer", "cabinet", "countertop", "shelf", "fridge", "sink")
    for i in range(1, 6)
)
TASK_TYPES = (
    "pick_and_place_simple",
    "pick_two_obj_and_place",
    "pick_clean_then_place",
    "pick_heat_then_place",
    "pick_cool_then_place",
    "look_at_obj_in_light",
)


def _group_ids(n: int) -> pl.Series:
    return pl.Series("group_id", [f"g{g:07d}" for g in range(n)], dtype=pl.Utf8)


def synthetic_signals(n_groups: int, seed: int = 0) -> pl.DataFrame:
    """A signals table (``schemas.SIGNALS``): n_groups groups of G=8 at K = 5, 10, 15, 20, about
    half of them zero-variance; d_K is lower for zero-variance groups and lies on the grid of
    values a real group can take (ties, as in real data)."""
    rng = np.random.default_rng(seed)
    n = n_groups
    successes = np.where(
        rng.random(n) < 0.5, rng.choice([0, G], n, p=[0.6, 0.4]), rng.integers(1, G, n)
    )
    zero_var = (successes == 0) | (successes == G)
    p = successes / G
    reward_var = p * (1 - p)
    label = np.where(~zero_var, "mixed", np.where(successes == G, "all_succeed", "all_fail"))
    spread = np.where(
        zero_var, rng.beta(1.2, 6.0, n), rng.beta(2.0, 4.0, n)
    )  # one "divergence" per group
    gids = _group_ids(n)
    parts = []
    n_pairs = G * (G - 1) // 2
    for K in SIGNAL_KS:
        grow = min(1.0, K / 10)
        d = np.round(np.clip(spread * grow + rng.normal(0, 0.03, n), 0, 1) * K * n_pairs) / (
            K * n_pairs
        )
        cols = {
            "prefix_edit_distance_mean": d,
            "action_bigram_jaccard_mean": np.clip(d * 1.3 + rng.normal(0, 0.05, n), 0, 1),
            "unique_prefix_ratio": np.ceil(np.clip(d * 3 + rng.random(n) * 0.2, 1 / G, 1) * G) / G,
            "unique_action_ratio": np.ceil(np.clip(d * 2 + rng.random(n) * 0.3, 1 / G, 1) * G) / G,
            "action_entropy": np.clip(d * 2.5 + rng.normal(0, 0.05, n), 0, 1),
            "obs_unique_ratio": np.ceil(np.clip(d * 2 + rng.random(n) * 0.3, 1 / G, 1) * G) / G,
            "termination_fraction": np.floor(np.clip(rng.beta(1, 6, n) * K / 10, 0, 1) * G) / G,
        }
        parts.append(
            pl.DataFrame(
                {
                    "group_id": gids,
                    "task_type": pl.Series(np.array(TASK_TYPES)[np.arange(n) % len(TASK_TYPES)]),
                    "K": pl.Series(np.full(n, K), dtype=pl.Int64),
                    **{name: pl.Series(cols[name], dtype=pl.Float64) for name in SIGNAL_NAMES},
                    "reward_var": pl.Series(reward_var, dtype=pl.Float64),
                    "label": pl.Series(label, dtype=pl.Utf8),
                }
            )
        )
    return pl.concat(parts).select(list(schemas.SIGNALS.columns)).cast(schemas.SIGNALS.columns)


def synthetic_steps(n_groups: int, seed: int = 0) -> pl.DataFrame:
    """A steps table (``schemas.STEPS``) of n_groups groups of G=8, T_max=30 (about 135 rows per
    group): each group has a "plan" and a per-step chance that a trajectory deviates from it;
    converged groups tend to share the outcome; a successful trajectory ends within 20 steps, a
    failed one ends anywhere or runs to T_max."""
    rng = np.random.default_rng(seed)
    n = n_groups
    pool = np.array([f"{v} {p}" for v in VERBS for p in PLACES])
    plan = rng.integers(0, len(pool), (n, T_MAX))
    deviate = rng.choice([0.0, 0.05, 0.3, 0.6], n, p=[0.25, 0.2, 0.35, 0.2])
    agree = deviate < 0.1
    p_success = np.where(
        agree,
        rng.choice([0.0, 1.0, 0.5], n, p=[0.5, 0.35, 0.15]),
        np.where(
            rng.random(n) < 0.2,
            0.0,
            np.where(rng.random(n) < 0.0625, 1.0, rng.uniform(0.1, 0.9, n)),
        ),
    )
    traj_group = np.repeat(np.arange(n), G)
    success = rng.random(n * G) < p_success[traj_group]
    length = np.where(
        success,
        rng.integers(4, 21, n * G),
        np.where(rng.random(n * G) < 0.3, T_MAX, rng.integers(3, T_MAX, n * G)),
    )
    row_traj = np.repeat(np.arange(n * G), length)
    starts = np.cumsum(length) - length
    step = np.arange(row_traj.size) - np.repeat(starts, length) + 1
    row_group = traj_group[row_traj]
    own = rng.random(row_traj.size) >= deviate[row_group]
    action_code = np.where(
        own, plan[row_group, step - 1], rng.integers(0, len(pool), row_traj.size)
    )
    last = step == length[row_traj]
    actions = pl.Series("action", pool)[action_code]
    places = pl.Series([f"You arrive at {a.split(' ', 1)[-1]}." for a in pool])[action_code]
    gids = _group_ids(n)[row_group]
    rows = row_traj.size
    df = pl.DataFrame(
        {
            "group_id": gids,
            "traj_idx": pl.Series(row_traj % G, dtype=pl.Int64),
            "task_id": pl.Series([f"task{g}" for g in range(n)])[row_group],
            "task_type": pl.Series(np.array(TASK_TYPES))[row_group % len(TASK_TYPES)],
            "step": pl.Series(step, dtype=pl.Int64),
            "thought": pl.Series([""], dtype=pl.Utf8).new_from_index(0, rows),
            "action": actions,
            "response": actions,
            "observation": places,
            "valid": pl.Series([True]).new_from_index(0, rows),
            "reward": pl.Series((success[row_traj] & last).astype(np.float64)),
            "done": pl.Series(last & (success[row_traj] | (length[row_traj] < T_MAX))),
            "n_prompt_tokens": pl.Series(np.full(rows, 200)),
            "n_gen_tokens": pl.Series(np.full(rows, 20)),
            "gen_s": pl.Series(np.zeros(rows)),
            "env_s": pl.Series(np.zeros(rows)),
        }
    )
    return df.select(list(schemas.STEPS.columns)).cast(schemas.STEPS.columns)
