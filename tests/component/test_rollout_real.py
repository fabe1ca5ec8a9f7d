"""The rollout engine on the real ALFWorld engine, with real policies: a tiny Qwen2 through the
transformers backend (KV cache, per-trajectory seeds) and the noisy expert.

Invariants: a cut group's post-K steps are never generated (a counting wrapper sees every row
the policy was asked for); an always-cut gate stops every group at K; a never-firing gate gives
exactly the ungated trajectories; a gated and an ungated run with the same seeds agree on every
token up to step K; the action mask marks exactly the generated tokens.
"""

from __future__ import annotations

from functools import partial
from pathlib import Path

import polars as pl
import pytest

from srollout.core.gate import FixedGate, GateRule
from srollout.envs.base import TASK_TYPES, Task
from srollout.rollout.engine import RolloutSettings, make_specs, run_groups
from srollout.rollout.records import group_tables

torch = pytest.importorskip("torch")


class Counting:
    """Wraps a policy; records every (group_id, traj_idx, step) the engine asked it for."""

    def __init__(self, inner) -> None:
        self.inner, self.name = inner, inner.name
        self.rows: list[tuple[str, int, int]] = []
        self.held: list[
            tuple[int, int]
        ] = []  # per call: (states the policy holds, requests past step 1)

    def act(self, requests):
        self.rows += [(r.key.group_id, r.key.traj_idx, r.step) for r in requests]
        if hasattr(self.inner, "live"):
            self.held.append((self.inner.live, sum(r.step > 1 for r in requests)))
        return self.inner.act(requests)

    def finish(self, key):
        return self.inner.finish(key)


@pytest.fixture(scope="module")
def tasks() -> list[Task]:
    """Four small generated games of four task types (the embedded default's generator)."""
    from srollout.envs import gen

    out = []
    for i, task_type in enumerate(TASK_TYPES[:4]):
        spec = gen.generate_game(task_type, 100 + i, gen.resolve_difficulty("small"))
        out.append(
            Task(
                f"test/{i}",
                task_type,
                spec.task_text + ".",
                "",
                meta={"pddl_problem": spec.pddl_problem},
            )
        )
    return out


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> Path:
    from tiny_policy import build_tiny_policy

    torch.set_num_threads(1)
    return build_tiny_policy(tmp_path_factory.mktemp("tiny") / "model")


def _lm(path: Path):
    from srollout.policy.transformers_backend import TransformersPolicy

    return TransformersPolicy(path, temperature=1.0, max_new_tokens=16)


def _roll(tasks, policy, settings, expert_plan=False):
    from srollout.envs.alfworld_env import AlfworldEnv
    from srollout.rollout.react import ReactPrompter

    records = []
    summary = run_groups(
        make_specs(tasks, len(tasks)),
        policy,
        partial(AlfworldEnv, expert_plan=expert_plan),
        ReactPrompter(),
        settings,
        on_group=records.append,
    )
    return records, summary


def _tables(records, name):
    keys = {
        "steps": ("group_id", "traj_idx", "step"),
        "trajectories": ("group_id", "traj_idx"),
        "signals": ("group_id", "K"),
    }[name]
    df = pl.concat([getattr(group_tables(r), name) for r in records]).sort(*keys)
    return df.drop([c for c in ("gen_s", "env_s", "reset_s", "ended_by") if c in df.columns])


def test_lm_gate_cuts_at_K_and_matches_the_ungated_prefix(tasks, tiny_model):
    K, T_max = 2, 5
    base = RolloutSettings(G=3, T_max=T_max, seed=1, concurrency=6, signal_K=(2, 4))
    ref, ref_sum = _roll(tasks, Counting(_lm(tiny_model)), base)
    counting = Counting(_lm(tiny_model))
    cut_settings = RolloutSettings(
        G=3,
        T_max=T_max,
        seed=1,
        concurrency=6,
        signal_K=(2, 4),
        gate=FixedGate(True, K=K),
        gate_K=K,
    )
    cut, cut_sum = _roll(tasks, counting, cut_settings)

    # post-K steps are never generated, and every group stopped at K
    assert max(step for _, _, step in counting.rows) == K
    # cut and finished trajectories hold no backend state (KV cache) past the tick they ended
    # in: before each call the policy holds exactly the trajectories continuing in it
    assert all(live == continuing for live, continuing in counting.held)
    assert counting.inner.live == 0
    # ragged decoding: one row-forward per generated token, no row decoded after it ended
    assert counting.inner.decode_rows == cut_sum.n_gen_tokens
    assert len(counting.rows) == cut_sum.rows == sum(len(t.steps) for r in cut for t in r.trajs)
    assert all(r.cut and r.cut_step == K for r in cut)
    assert cut_sum.n_gen_tokens < ref_sum.n_gen_tokens

    # same seeds: every step up to K identical (responses, actions, observations, token counts)
    ref_steps, cut_steps = _tables(ref, "steps"), _tables(cut, "steps")
    assert ref_steps.filter(pl.col("step") <= K).equals(cut_steps)

    # the action mask marks exactly the generated tokens, and the gated run's token sequence is
    # a prefix of the ungated one
    trajs = pl.concat([group_tables(r).trajectories for r in ref]).sort("group_id", "traj_idx")
    cut_trajs = pl.concat([group_tables(r).trajectories for r in cut]).sort("group_id", "traj_idx")
    for row, crow in zip(trajs.iter_rows(named=True), cut_trajs.iter_rows(named=True), strict=True):
        assert len(row["token_ids"]) == len(row["action_mask"]) > 0
        assert sum(row["action_mask"]) == row["n_gen_tokens"]
        assert row["token_ids"][: len(crow["token_ids"])] == crow["token_ids"]


def test_lm_adaptive_gate_cuts_at_its_second_check_step(tasks, tiny_model):
    # P(zero-var) = sigmoid(K - 3) from K alone: 0.27 at K=2 (no cut), 0.73 at K=4 (cut)
    from srollout.core.adaptive_gate import AdaptiveGate
    from srollout.core.learned_gate import LogisticModel

    model = LogisticModel(mean=(0.0,) * 8, std=(1.0,) * 8, coef=(0.0,) * 7 + (1.0,), intercept=-3.0)
    gate = AdaptiveGate(model, check_K=(2, 4), thresholds=(0.5, 0.5))
    base = RolloutSettings(G=3, T_max=6, seed=1, concurrency=6, signal_K=(2, 4))
    ref, _ = _roll(tasks[:2], _lm(tiny_model), base)
    counting = Counting(_lm(tiny_model))
    cut, _ = _roll(
        tasks[:2],
        counting,
        RolloutSettings(G=3, T_max=6, seed=1, concurrency=6, signal_K=(2, 4), gate=gate, gate_K=2),
    )
    assert max(step for _, _, step in counting.rows) == 4
    for r in cut:
        assert r.cut and r.cut_step == 4 and r.gate_K == 4 and r.gate_checks == [2, 4]
        assert all(t.ended_by == "gate" for t in r.trajs if len(t.steps) == 4)
        assert group_tables(r).groups["cut_step"].to_list() == [4]
    assert _tables(ref, "steps").filter(pl.col("step") <= 4).equals(_tables(cut, "steps"))
    assert _tables(ref, "signals").equals(_tables(cut, "signals"))


def test_lm_never_firing_gate_is_plain_rollout(tasks, tiny_model):
    base = RolloutSettings(G=3, T_max=4, seed=2, concurrency=6, signal_K=(2,))
    never = RolloutSettings(
        G=3,
        T_max=4,
        seed=2,
        concurrency=6,
        signal_K=(2,),
        gate=GateRule(rule="r1", K=2, d_L=0.0),
        gate_K=2,
    )
    ref, _ = _roll(tasks[:2], _lm(tiny_model), base)
    other, _ = _roll(tasks[:2], _lm(tiny_model), never)
    assert not any(r.cut for r in other)
    for name in ("steps", "trajectories", "signals"):
        assert _tables(ref, name).equals(_tables(other, name)), name


def test_noisy_expert_on_the_real_engine(tasks):
    from srollout.policy import make_policy

    settings = RolloutSettings(G=4, T_max=12, seed=0, concurrency=8, signal_K=(3, 6))
    counting = Counting(make_policy(kind="noisy-expert", noise=0.2))
    records, summary = _roll(tasks, counting, settings, expert_plan=True)
    groups = pl.concat([group_tables(r).groups for r in records])
    assert groups.height == 4 and (groups["G"] == 4).all()
    steps = pl.concat([group_tables(r).steps for r in records])
    assert steps.height == summary.rows == len(counting.rows)
    # the planner wins most episodes; every won trajectory ended at its winning step
    trajs = pl.concat([group_tables(r).trajectories for r in records])
    assert trajs["success"].mean() >= 0.5
    won = steps.filter(pl.col("done"))
    assert won.height == trajs["success"].sum()
    assert (steps["valid"].mean()) > 0.7
