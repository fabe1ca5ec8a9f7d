"""srollout's gate inside TRL's real GRPOTrainer (trl 1.16, CPU), on the shipped default policy and
ALFWorld's real engine: one GRPO step per trainer, 2 groups of G=4, T_max=4, the gate at K=2.

The tests of the three trainers are slow (~15 s on 2 loaded cores to train them); the bad-input
test is not."""

from __future__ import annotations

import os

import pytest
import torch

from srollout.core.gate import FixedGate
from srollout.errors import SrolloutError
from srollout.integrations.trl import GatedRollout, check_trl_version, task_prompt

G, GROUPS, T_MAX, K = 4, 2, 4, 2


def _rollout(gate, seed: int = 3, **kwargs) -> GatedRollout:
    return GatedRollout.alfworld(
        "train", n_tasks=GROUPS, G=G, gate=gate, T_max=T_MAX, seed=seed, max_new_tokens=48,
        **kwargs,
    )  # fmt: skip


def shorter_is_better(completion_ids, srollout_reward, **kwargs):
    """A second reward with variance inside a 4-step episode (wins take longer): minus the
    completion's length in hundreds of tokens; None for a cut group's rows, like srollout's own."""
    return [
        None if r is None else -len(ids) / 100
        for ids, r in zip(completion_ids, srollout_reward, strict=True)
    ]


def _train_one_step(model_dir, rollout: GatedRollout, out) -> tuple[dict, dict, dict]:
    """(weights before, weights after, the step's logged metrics) of one GRPO step."""
    os.environ["TRL_EXPERIMENTAL_SILENCE"] = "1"
    from trl import GRPOConfig, GRPOTrainer

    torch.manual_seed(0)
    config = GRPOConfig(
        output_dir=str(out),
        use_cpu=True,
        bf16=False,
        gradient_checkpointing=False,
        num_generations=G,
        per_device_train_batch_size=G * GROUPS,
        max_steps=1,
        learning_rate=1e-3,
        beta=0.0,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        seed=11,
        disable_tqdm=True,
    )
    trainer = GRPOTrainer(
        model=str(model_dir),
        args=config,
        reward_funcs=[rollout.reward, shorter_is_better],
        train_dataset=rollout.dataset(),
        rollout_func=rollout,
    )
    before = {k: v.detach().clone() for k, v in trainer.model.state_dict().items()}
    seen: list[list] = []
    call = rollout.__call__

    def spy(prompts, tr):
        seen.append(list(prompts))
        return call(prompts, tr)

    trainer.rollout_func = spy
    trainer.train()
    after = {k: v.detach().clone() for k, v in trainer.model.state_dict().items()}
    logged = next(h for h in trainer.state.log_history if "gate/groups_cut" in h)
    assert len(seen) == 1
    logged["_prompts"] = seen[0]
    return before, after, logged


def _same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.fixture(scope="module")
def three_runs(default_model, tmp_path_factory):
    """No gate; a gate that cuts nothing (the gate that cuts every group, and the stall rule W 1
    from step 2, both in shadow: they decide, nothing is cut); a gate that cuts every group.
    Same seeds, same data."""
    from srollout.core.trajectory_gate import StallGate

    runs = {}
    shadow = dict(traj_gate=StallGate(1, 2), shadow=True)
    gates = (
        ("none", None, {}),
        ("keep", FixedGate(cut=True, K=K), shadow),
        ("cut", FixedGate(cut=True, K=K), {}),
    )
    for name, gate, kwargs in gates:
        rollout = _rollout(gate, **kwargs)
        out = tmp_path_factory.mktemp(name)
        before, after, logged = _train_one_step(default_model, rollout, out)
        runs[name] = (rollout, before, after, logged)
    return runs


@pytest.mark.slow
def test_a_gate_that_cuts_every_group_leaves_the_weights_unchanged(three_runs):
    rollout, before, after, logged = three_runs["cut"]
    assert _same(before, after)
    assert logged["gate/groups_cut"] == GROUPS and logged["gate/cut_fraction"] == 1.0
    assert logged["grad_norm"] == 0.0


@pytest.mark.slow
def test_a_gate_that_cuts_none_trains_exactly_like_no_gate(three_runs):
    # "keep": a gate that would cut every group, in shadow
    _, before_none, after_none, _ = three_runs["none"]
    rollout, before, after, logged = three_runs["keep"]
    assert _same(before, before_none)
    assert not _same(before, after), "a kept batch with reward variance must move the weights"
    assert _same(after, after_none)
    assert logged["gate/groups_cut"] == 0
    assert logged["reward_std"] > 0


@pytest.mark.slow
def test_trl_lays_groups_out_in_blocks_of_G(three_runs):
    rollout, *_, logged = three_runs["none"]
    prompts = logged["_prompts"]
    assert len(prompts) == G * GROUPS
    blocks = [prompts[g * G : (g + 1) * G] for g in range(GROUPS)]
    assert all(len(set(b)) == 1 for b in blocks)
    assert {b[0] for b in blocks} == {task_prompt(t) for t in rollout.tasks}
    # the engine played each block as one group of the task the block names
    assert [task_prompt(r.spec.task) for r in rollout.last_records] == [b[0] for b in blocks]


@pytest.mark.slow
def test_masks_and_lengths_of_kept_and_cut_groups(three_runs):
    keep, *_ = three_runs["keep"]
    out, counts = keep.to_trl(keep.last_records, keep_tokenizer())
    rows = [t for r in keep.last_records for t in r.trajs]
    for i, traj in enumerate(rows):
        ids, mask = traj.tokens.token_ids, traj.tokens.action_mask
        assert out["prompt_ids"][i] + out["completion_ids"][i] == ids
        assert len(out["env_mask"][i]) == len(out["completion_ids"][i])
        assert mask[len(out["prompt_ids"][i])] is True and not any(
            mask[: len(out["prompt_ids"][i])]
        )
        # the policy's tokens are exactly the ones it generated
        assert sum(out["env_mask"][i]) == traj.n_gen_tokens
        assert out["srollout_reward"][i] == traj.reward
    cut, *_ = three_runs["cut"]
    out, counts = cut.to_trl(cut.last_records, keep_tokenizer())
    eot = out["completion_ids"][0][0]
    assert out["completion_ids"] == [[eot]] * (G * GROUPS)
    assert out["env_mask"] == [[0]] * (G * GROUPS)
    assert out["srollout_reward"] == [None] * (G * GROUPS)
    # up to step K the cut run is the kept run, token for token (same seeds)
    kept = [t for r in keep.last_records for t in r.trajs]
    assert out["prompt_ids"] == [
        t.tokens.token_ids[: len(p)] for t, p in zip(kept, out["prompt_ids"], strict=True)
    ]


@pytest.mark.slow
def test_logged_savings_equal_the_counted_ones(three_runs):
    keep, *_, logged_keep = three_runs["keep"]
    cut, *_, logged_cut = three_runs["cut"]
    for rollout, logged in ((keep, logged_keep), (cut, logged_cut)):
        trajs = [t for r in rollout.last_records for t in r.trajs]
        assert logged["rollout/gen_tokens"] == sum(t.n_gen_tokens for t in trajs)
        assert logged["rollout/env_steps"] == sum(len(t.steps) for t in trajs)
    cut_trajs = [t for r in cut.last_records for t in r.trajs]
    live_at_K = sum(t.ended_by == "gate" for t in cut_trajs)
    assert logged_cut["gate/trajectories_cut"] == live_at_K
    assert logged_cut["gate/steps_saved_max"] == live_at_K * (T_MAX - K)
    # every cut trajectory stopped at K; the same trajectories ran on to T_max or a win without
    # the gate
    assert all(len(t.steps) <= K for t in cut_trajs)
    assert logged_cut["rollout/env_steps"] < logged_keep["rollout/env_steps"]
    assert logged_cut["rollout/gen_tokens"] < logged_keep["rollout/gen_tokens"]


def keep_tokenizer():
    from transformers import AutoTokenizer

    from srollout.default_policy import default_policy

    return AutoTokenizer.from_pretrained(default_policy())


# --- bad input: one clear error naming the fix ------------------------------------------------


def test_bad_inputs_are_clear_errors():
    rollout = _rollout(None)
    p = task_prompt(rollout.tasks[0])
    with pytest.raises(SrolloutError, match="does not name a srollout task"):
        rollout.groups_of(["put a mug in the sink"] * G, G)
    with pytest.raises(SrolloutError, match="not in this rollout's task set"):
        rollout.groups_of(["[srollout task train/nope/0001] x"] * G, G)
    eight = "num_generations is 8 but the rollout was built with G=4"
    with pytest.raises(SrolloutError, match=eight):
        rollout.groups_of([p] * 8, 8)
    with pytest.raises(SrolloutError, match="not one prompt repeated G=4 times"):
        q = task_prompt(rollout.tasks[1])
        rollout.groups_of([p, q, p, q, p, q, p, q], G)
    with pytest.raises(SrolloutError, match="not a whole number of groups"):
        rollout.groups_of([p] * 6, G)
    with pytest.raises(SrolloutError, match=r"found trl 1\.15\.2: pip install 'trl==1\.16\.0'"):
        check_trl_version("1.15.2")
    assert check_trl_version("1.16.3") == "1.16.3"
    two = rollout.groups_of([p] * G + [task_prompt(rollout.tasks[1])] * G, G)
    assert [t.task_id for t in two] == [rollout.tasks[0].task_id, rollout.tasks[1].task_id]


@pytest.mark.slow
def test_the_trajectory_gate_inside_trl_keeps_stopped_trajectories_in_the_batch(
    default_model, tmp_path
):
    from srollout.core.trajectory_gate import StallGate

    # W 1 from step 2, T_max 10: a trajectory ends after any step from the second on that showed
    # it nothing new ("Nothing happens." twice, or back where it was)
    rollout = GatedRollout.alfworld(
        "train", n_tasks=GROUPS, G=G, gate=StallGate(W=1, k0=2), T_max=10, seed=3,
        max_new_tokens=48,
    )  # fmt: skip
    assert rollout.gate is None and rollout.traj_gate == StallGate(W=1, k0=2)
    before, after, logged = _train_one_step(default_model, rollout, tmp_path)
    trajs = [t for r in rollout.last_records for t in r.trajs]
    stalled = [t for t in trajs if t.ended_by == "stalled"]
    assert 0 < len(stalled) < len(trajs)
    assert rollout.last.stalled == len(stalled) and rollout.last.cut == 0
    assert logged["gate/trajectories_stalled"] == len(stalled)
    for t in stalled:  # stopped after step t >= 2 with no news; the reward it had (0: not won)
        assert len(t.steps) >= 2 and t.steps[-1]["steps_since_new"] >= 1 and t.reward == 0
    assert logged["rollout/env_steps"] == sum(len(t.steps) for t in trajs)
    assert not _same(before, after)  # stopped trajectories stay in the batch: the step trains


def test_a_trajectory_gate_is_given_once():
    from srollout.core.trajectory_gate import StallGate

    with pytest.raises(SrolloutError, match="once"):
        GatedRollout.alfworld(
            "train", n_tasks=GROUPS, G=G, gate=StallGate(), traj_gate=StallGate(), T_max=12
        )
    with pytest.raises(SrolloutError, match="^stall k0=10 is larger than T_max=4$"):
        _rollout(StallGate(W=2, k0=10))


@pytest.mark.slow
def test_in_shadow_the_gates_inside_trl_decide_and_log_what_they_would_have_done(three_runs):
    """The "keep" run is the gate that cuts every group and the stall rule W 1 from step 2, in
    shadow: it trained exactly as without a gate (test above), and TRL's logs say what each
    gate would have done, each decision scored by the full outcome."""
    from srollout.core.grpo import is_zero_variance

    rollout, _, _, logged = three_runs["keep"]
    *_, none_logged = three_runs["none"]
    assert logged["gate/groups_cut"] == 0 and logged["gate/trajectories_stalled"] == 0
    records = rollout.last_records
    assert [r.shadow_cut_step for r in records] == [K] * GROUPS and not any(r.cut for r in records)
    assert logged["gate/shadow_cuts"] == GROUPS
    assert logged["gate/shadow_cuts_right"] == sum(is_zero_variance(r.rewards) for r in records)
    assert logged["gate/shadow_cut_steps_saved"] == sum(
        max(0, len(t.steps) - K) for r in records for t in r.trajs
    )
    # each shadow stop is where the rule fires on the trajectory's own novelty (W 1 from step 2,
    # asked after every step but the last), and only there
    for t in (t for r in records for t in r.trajs):
        since = [s["steps_since_new"] for s in t.steps]
        fires = [k for k in range(2, len(since)) if since[k - 1] >= 1]
        assert t.shadow_stop == (fires[0] if fires else None)
    stops = [t for r in records for t in r.trajs if t.shadow_stop is not None]
    assert logged["gate/shadow_stops"] == len(stops)
    assert logged["gate/shadow_stops_right"] == sum(not t.success for t in stops)
    assert logged["rollout/env_steps"] == none_logged["rollout/env_steps"]
    assert "gate/shadow_cuts" not in none_logged


@pytest.mark.slow
def test_dynamic_sampling_gives_the_optimizer_only_groups_with_reward_variance(
    default_model, tmp_path
):
    """DAPO's filter and refill (and GRESO's skip) inside a real GRPOTrainer: one optimizer step
    of 2 groups of G=4 on ALFWorld, T_max 12 (where the default policy wins some games)."""
    from trl import GRPOConfig, GRPOTrainer

    os.environ["TRL_EXPERIMENTAL_SILENCE"] = "1"
    rollout = GatedRollout.alfworld(
        "train", n_tasks=24, G=G, gate=None, T_max=12, seed=3, max_new_tokens=48,
        dynamic_sampling=True, max_refill_rounds=5, greso_p=0.5,
    )  # fmt: skip
    config = GRPOConfig(
        output_dir=str(tmp_path), use_cpu=True, bf16=False, gradient_checkpointing=False,
        num_generations=G, per_device_train_batch_size=G * GROUPS, max_steps=1,
        learning_rate=1e-5, beta=0.0, logging_steps=1, save_strategy="no", report_to="none",
        seed=11, disable_tqdm=True,
    )  # fmt: skip
    torch.manual_seed(0)
    trainer = GRPOTrainer(
        model=str(default_model), args=config, reward_funcs=rollout.reward,
        train_dataset=rollout.dataset(), rollout_func=rollout,
    )  # fmt: skip
    calls = []
    call = rollout.__call__

    def spy(prompts, tr):
        calls.append((prompts, call(prompts, tr), rollout.last))
        return calls[-1][1]

    trainer.rollout_func = spy
    trainer.train()
    logs = [h for h in trainer.state.log_history if "sampling/extra_groups" in h]
    assert len(calls) == len(logs) == 1
    total_extra = 0
    for (prompts, out, counts), logged in zip(calls, logs, strict=True):
        rewards = out["srollout_reward"]
        assert len(rewards) == len(out["completion_ids"]) == len(prompts) == G * GROUPS
        blocks = [rewards[g * G : (g + 1) * G] for g in range(GROUPS)]
        kept = [b for b in blocks if b[0] is not None]
        assert all(max(b) > min(b) for b in kept)  # only groups with reward variance
        assert GROUPS - len(kept) == counts.unfilled == logged["sampling/unfilled"]
        # every group rolled out beyond the batch's own (those GRESO did not skip) is counted
        assert counts.extra_groups == counts.groups - (GROUPS - counts.skipped)
        assert logged["sampling/extra_groups"] == counts.extra_groups
        assert counts.dropped == counts.groups - len(kept)
        total_extra += counts.extra_groups
        assert float(logged["frac_reward_zero_std"]) == 0.0
    assert total_extra > 0  # the policy loses some games: refills happened
    assert rollout.counts.extra_groups == total_extra


@pytest.mark.slow
def test_the_trainer_log_survives_a_kill_and_holds_every_step_once(default_model, tmp_path):
    """A real GRPOTrainer run writing its rollouts' log (shadow: the stall rule decides, nothing
    stops) is killed after step 3 (checkpoint at step 2), then resumed from TRL's checkpoint."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    import polars as pl

    script = Path(__file__).with_name("trl_log_run.py")
    out, log = tmp_path / "out", tmp_path / "log"
    run = [sys.executable, str(script), str(default_model), str(out), str(log)]
    killed = subprocess.run([*run, "--kill-at", "3"], capture_output=True, text=True)
    assert killed.returncode == -9, killed.stderr[-2000:]
    parts = sorted(p.name for p in (log / "parts").iterdir())
    assert parts == ["step-00000001", "step-00000002", "step-00000003"]
    assert not (log / "groups.parquet").exists()  # never merged: the run did not end
    first = pl.read_parquet(log / "parts" / "step-00000003" / "steps.parquet")
    resumed = subprocess.run([*run, "--resume"], capture_output=True, text=True)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    groups = pl.read_parquet(log / "groups.parquet")
    # every step once, 2 groups each; the group indices (so the seeds) continue the killed run's
    assert groups["trainer_step"].to_list() == [1, 1, 2, 2, 3, 3, 4, 4]
    assert groups["group_index"].to_list() == list(range(8))
    assert groups["in_batch"].all()
    trajs = pl.read_parquet(log / "trajectories.parquet")
    steps = pl.read_parquet(log / "steps.parquet")
    assert trajs.height == 16 and "shadow_stop_step" in trajs.columns
    assert set(steps["trainer_step"].unique()) == {1, 2, 3, 4}
    assert steps.height == trajs["n_steps"].sum()
    # step 3, played again from the checkpoint of step 2 with the same seeds: the same actions
    again3 = steps.filter(pl.col("trainer_step") == 3).drop("trainer_step")
    assert again3.select("group_id", "traj_idx", "step", "response").equals(
        first.select("group_id", "traj_idx", "step", "response")
    )
    signals = pl.read_parquet(log / "signals.parquet")  # T_max 4: no K of 5, 10, 15, 20
    assert signals.height == 0 and "prefix_edit_distance_mean" in signals.columns
    manifest = json.loads((log / "manifest.json").read_text())
    assert manifest["status"] == "complete" and manifest["resumed_at_step"] == 2
    # the log reads like a collect: every method judged on the run's own groups
    from srollout.config import WhatIfConfig
    from srollout.stages.what_if import run_what_if

    judged = run_what_if(WhatIfConfig(input=log, K=2, n_folds=2, n_boot=20, out=tmp_path / "w"))
    assert judged.table["method"].to_list() == [
        "group gate",
        "trajectory gate",
        "loop detector",
        "DAPO",
        "GRESO",
    ]
    assert judged.table["decisions"][3] == groups["zero_var"].sum()  # DAPO
    again = subprocess.run(run, capture_output=True, text=True)  # a fresh run into the same log
    assert again.returncode != 0 and "already holds trainer steps 1..4" in again.stderr
