"""The on-policy GRPO loop of one (seed, arm) (Tier 3, §5.3), top to bottom.

Per iteration: sample prompts (a draw of (seed, iteration): the same in both arms) -> roll out
G trajectories each through the batched engine -> drop cut groups -> GRPO update of the LoRA
adapter, live at once in the rollout policy -> every E iterations a greedy evaluation -> checkpoint
(docs/training.md, "Each iteration"). Seeds come from (seed, group index), so a gate that never
fires reproduces the baseline arm bit for bit.

Arms (``srollout.core.arms``) compose three filters around that story: GRESO skips prompts of
the draw before the rollout (the others keep their group index, so they sample what the
baseline samples); the gate cuts groups at step K; DAPO drops zero-variance or cut groups and
runs extra rounds of fresh prompts (a draw of (seed, iteration, round), group indices after all
first-round ones) up to ``dapo_max_rounds``. GRESO's history (a cut group counts as
zero-variance: it gave no gradient either) is checkpointed beside state.pt in greso.json."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple, Protocol

import numpy as np

from srollout.core.arms import ArmSpec, extra_round_tasks, greso_outcomes, record_outcomes
from srollout.envs.base import Task
from srollout.errors import SrolloutError
from srollout.rollout.warmup import warm_up
from srollout.training.metrics import (
    CutJudgement,
    GateMetrics,
    IterationMetrics,
    IterationTimes,
    OnpolicyTrain,
    RolloutMetrics,
    TrainMetrics,
    upgrade_onpolicy_row,
)

GRESO_FILE = "greso.json"


class LoopConfig(Protocol):
    """What the on-policy loop reads of its run's settings (``srollout.config.TrainOnpolicyConfig``
    satisfies it; that config lives in a later layer, so the loop names what it needs here)."""

    iterations: int
    prompts_per_iter: int
    eval_every: int
    G: int
    T_max: int
    K: int
    temperature: float
    max_new_tokens: int
    concurrency: int
    micro_batch: int
    model: Path | None
    backend: str
    base_url: str | None
    lr: float
    lora_r: int
    lora_alpha: int
    lora_targets: tuple[str, ...]
    denominator: str
    denominator_constant: float | None
    clip_eps: float | None
    kl_coef: float
    dapo_max_rounds: int
    greso_p_explore: float
    judge_cuts: bool
    audit: float
    audit_floor: float


@dataclass(frozen=True)
class ArmContext:
    """What one (seed, arm) training loop runs with besides the config: the arm
    (:class:`srollout.core.arms.ArmSpec`), the seed, the prompt pool and held-out tasks, the
    environment factory and prompter, the base model's directory (resolved once by the stage's
    plan) and ``ckpt_dir`` (where state.pt lives)."""

    seed: int
    arm: ArmSpec
    train_tasks: Sequence[Task]
    eval_tasks: Sequence[Task]
    env_factory: Callable[[], Any]
    prompter: Any
    model_dir: Path
    ckpt_dir: Path


class ArmResult(NamedTuple):
    """metrics / evals: the rows of metrics.parquet and eval.parquet of this arm; model: the
    trained peft model (to save); stopped: the loop stopped early on request (``stop_after``)."""

    metrics: list[dict[str, Any]]
    evals: list[dict[str, Any]]
    model: Any
    stopped: bool


@dataclass
class _RolloutTotals:
    """What the rollouts of one iteration add up to over DAPO's rounds (seconds and counts)."""

    warmup_s: float = 0.0
    rollout_s: float = 0.0
    env_steps: int = 0
    gen_tokens: int = 0
    stalled: int = 0


def _mean_reward(records: Sequence[Any]) -> float:
    """Mean trajectory reward over the groups ``records`` (NaN when there are none)."""
    rewards = [x for r in records for x in r.rewards]
    return float(np.mean(rewards)) if rewards else float("nan")


def iteration_tasks(pool: Sequence[Task], iteration: int, n: int, seed: int) -> list[int]:
    """Indices of the ``n`` prompts of ``iteration`` (distinct; a draw of (seed, iteration))."""
    if n > len(pool):
        raise SrolloutError(f"--prompts-per-iter {n} is more than the {len(pool)} training tasks")
    rng = np.random.default_rng([seed, iteration, 0x7A5C])
    return sorted(rng.choice(len(pool), size=n, replace=False).tolist())


def dapo_group_index(
    iterations: int, prompts: int, max_rounds: int, iteration: int, round_index: int, j: int
) -> int:
    """Group index of the j-th group of DAPO's extra round ``round_index`` (>= 1) of ``iteration``:
    after every first-round index ((iterations x prompts) of them), so seeds never collide."""
    return (iterations + (iteration - 1) * max_rounds + (round_index - 1)) * prompts + j


class ArmRunner:
    """One arm's loop, one iteration per :meth:`step`, so a stage can interleave the arms of a
    seed and both see the same machine load.

    Construction loads the model, attaches the LoRA adapter (seeded by the run seed), builds the
    policies on that very module, and either restores the last checkpoint or runs (or relabels
    ``initial_evals``: before the first update every arm is the base model, since LoRA's B starts
    at zero) the iteration-0 evaluation and checkpoints iteration 0."""

    def __init__(
        self,
        config: LoopConfig,
        spec: ArmContext,
        resume: bool = False,
        initial_evals: Sequence[dict[str, Any]] | None = None,
    ) -> None:
        from srollout.policy.transformers_backend import TransformersPolicy
        from srollout.rollout.engine import RolloutSettings
        from srollout.training.checkpoint import load_state, restore_rng
        from srollout.training.lora import LoraSettings, load_adapter_state, make_optimizer
        from srollout.training.model import load_trainable

        self.config, self.spec = config, spec
        lora = LoraSettings(config.lora_r, config.lora_alpha, tuple(config.lora_targets))
        self.trainable = load_trainable(spec.model_dir, lora, spec.seed)
        common = dict(
            model=self.trainable.model,
            tokenizer=self.trainable.tokenizer,
            max_new_tokens=config.max_new_tokens,
        )
        self.policy = self._rollout_policy(common)
        self.greedy = TransformersPolicy(self.trainable.path, temperature=0.0, **common)
        self.optimizer = make_optimizer(self.trainable.model, config.lr)
        self.settings = RolloutSettings(
            G=config.G,
            T_max=config.T_max,
            seed=spec.seed,
            concurrency=config.concurrency,
            signal_K=(spec.arm.gate_K or config.K,),
            gate=spec.arm.gate_rule,
            gate_K=spec.arm.gate_K,
            arm=spec.arm.name,
            traj_gate=spec.arm.traj_gate,
        )
        state = load_state(spec.ckpt_dir) if resume else None
        if state is None:
            self.iteration, self.metrics = 0, []
            self.evals = (
                [
                    {**e, "arm": spec.arm.name, "seed": spec.seed}
                    for e in initial_evals
                    if e["iteration"] == 0
                ]
                if initial_evals
                else self.evaluate(0)
            )
            self._checkpoint()
        else:
            load_adapter_state(self.trainable.model, state.adapter)
            self.optimizer.load_state_dict(state.optimizer)
            restore_rng(state.rng)
            self.iteration, self.evals = state.iteration, list(state.evals)
            # rows of a run written before the metrics were namespaced are renamed on the way in
            self.metrics = [upgrade_onpolicy_row(r) for r in state.metrics]
        self.adapter_iteration: int | None = None  # whose weights the vLLM engine holds
        self._sync_rollout_weights(self.iteration)
        self.cum_s = self.metrics[-1]["time/cum_s"] if self.metrics else 0.0
        self.greso = self._load_greso(resume) if spec.arm.greso else None
        # --audit: the arm's gates move between iterations (every arm writes the audit's columns)
        from srollout.rollout.audits import Audit

        self.audit = Audit(
            spec.arm.gate_rule,
            spec.arm.traj_gate,
            fraction=config.audit,
            floor=config.audit_floor,
            seed=spec.seed,
            ckpt_dir=spec.ckpt_dir,
            iteration=self.iteration,
            resume=resume,
        )

    @property
    def on_vllm(self) -> bool:
        return self.config.backend != "transformers"

    def _rollout_policy(self, common: dict[str, Any]) -> Any:
        """The sampling policy: the trained module itself (transformers), or a vLLM engine in
        process or behind a server that serves the LoRA adapter this arm trains."""
        from srollout.policy.transformers_backend import TransformersPolicy

        config = self.config
        if not self.on_vllm:
            return TransformersPolicy(self.trainable.path, temperature=config.temperature, **common)
        from srollout.policy import make_policy

        extra: dict[str, Any] = (
            {"base_url": config.base_url}
            if config.backend == "vllm-server"
            else {"lora": True, "max_lora_rank": max(16, config.lora_r)}
        )
        return make_policy(
            model=self.trainable.path,
            backend=config.backend,
            temperature=config.temperature,
            max_new_tokens=config.max_new_tokens,
            **extra,
        )

    def _sync_rollout_weights(self, iteration: int) -> None:
        """vLLM: save the adapter as it is after ``iteration`` updates and load it into the engine
        (a fresh name each time, so no cache of older weights is used), keeping the last two on
        disk. transformers: nothing to do, the policies share the trained module."""
        if not self.on_vllm:
            return
        import shutil

        root = self.spec.ckpt_dir / "rollout-adapters"
        path = root / f"iter-{iteration:04d}"
        if path.exists():
            shutil.rmtree(path)
        self.trainable.model.save_pretrained(path)
        self.policy.load_adapter(path)
        self.adapter_iteration = iteration
        for old in sorted(root.glob("iter-*"))[:-2]:
            shutil.rmtree(old, ignore_errors=True)

    def _load_greso(self, resume: bool) -> Any:
        """The GRESO skipper, with the history of the checkpointed iterations on resume (greso.json
        is written before state.pt, so it may hold one iteration more: that one is dropped)."""
        import json

        from srollout.core.arms import GresoOutcome, make_skipper

        path = self.spec.ckpt_dir / GRESO_FILE
        history = []
        if resume and path.exists():
            history = [GresoOutcome(*o) for o in json.loads(path.read_text())["history"]]
        skipper = make_skipper(
            self.spec.arm,
            seed=self.spec.seed,
            p_explore=self.config.greso_p_explore,
            history=history,
        )
        if history:
            skipper.truncate(self.iteration)
        return skipper

    @property
    def done(self) -> bool:
        return self.iteration >= self.config.iterations

    def evaluate(self, iteration: int) -> list[dict[str, Any]]:
        """Greedy held-out evaluation, no gate: one row per task."""
        from srollout.training.evaluate import greedy_eval

        spec = self.spec
        outcomes = greedy_eval(
            self.greedy, spec.env_factory, spec.prompter, spec.eval_tasks, self.config.T_max
        )
        return [
            {"arm": spec.arm.name, "seed": spec.seed, "iteration": iteration, **o._asdict()}
            for o in outcomes
        ]

    def _roll(self, specs: list[Any], totals: _RolloutTotals, settings: Any = None) -> list[Any]:
        """Roll ``specs`` out through the engine (games warmed up untimed first) with the arm's
        settings (or ``settings``); add the round's rollout seconds, env steps, generated tokens
        and warm-up seconds to ``totals``; return the finished groups by group index."""
        from srollout.rollout.engine import run_groups

        spec = self.spec
        totals.warmup_s += warm_up(spec.env_factory, [g.task for g in specs])
        records: list[Any] = []
        summary = run_groups(
            specs,
            self.policy,
            spec.env_factory,
            spec.prompter,
            settings or self.settings,
            on_group=records.append,
        )
        totals.rollout_s += summary.wall_s
        totals.env_steps += summary.rows
        totals.gen_tokens += summary.n_gen_tokens
        totals.stalled += summary.n_stalled
        records.sort(key=lambda r: r.spec.index)
        return records

    def _judge(self, records: list[Any]) -> CutJudgement | None:
        """``--judge-cuts``: roll the cut groups of ``records``, and those with a stopped
        trajectory, on to T_max with the weights that rolled them out, their own seeds and no
        gate, and judge each cut by the full outcome (zero-variance: a true positive) and each
        stop by its twin's (failed: a true positive). Untimed and outside every other count;
        the RNG state is restored, so the run trains exactly as without judging. None when not
        judging."""
        from srollout.core.grpo import is_zero_variance
        from srollout.training.checkpoint import restore_rng, rng_states

        if not self.config.judge_cuts:
            return None
        judged = sorted(
            (r for r in records if r.cut or any(t.stalled for t in r.trajs)),
            key=lambda r: r.spec.index,
        )
        if not judged:
            return CutJudgement(0, 0, 0, 0.0)
        start, saved = time.perf_counter(), rng_states()
        ungated = dataclasses.replace(
            self.settings, gate=None, gate_K=None, audit=None, traj_gate=None, traj_audit=None
        )
        # its own totals: the judging is counted in no rollout/ or time/ column
        full = self._roll([r.spec for r in judged], _RolloutTotals(), ungated)
        restore_rng(saved)
        tp = fp = matched = stop_tp = stop_fp = 0
        for r, whole in zip(judged, full, strict=True):  # both in group-index order
            mine = sorted(r.trajs, key=lambda t: t.traj_idx)
            theirs = sorted(whole.trajs, key=lambda t: t.traj_idx)
            for a, b in zip(mine, theirs, strict=True):
                if a.stalled:  # a stop is right iff its twin, same seeds, failed
                    stop_tp, stop_fp = stop_tp + (not b.success), stop_fp + b.success
            if not r.cut:
                continue
            if is_zero_variance(whole.rewards):
                tp += 1
            else:
                fp += 1
            matched += sum(
                a.actions == b.actions[: len(a.actions)] for a, b in zip(mine, theirs, strict=True)
            )
        return CutJudgement(tp, fp, matched, time.perf_counter() - start, stop_tp, stop_fp)

    def step(self) -> IterationMetrics:
        """Run the next iteration, checkpoint it, and return its metrics (``.row()``: the
        metrics.parquet row)."""
        from srollout.core.arms import roll_arm
        from srollout.rollout.engine import GroupSpec
        from srollout.training.update import GroupOutcome, config_update, samples_from_groups

        config, spec, trainable, arm = self.config, self.spec, self.trainable, self.spec.arm
        iteration, prompts = self.iteration + 1, config.prompts_per_iter
        # 1. prompts (GRESO skips some before any rollout) and rollouts
        picked = iteration_tasks(spec.train_tasks, iteration, prompts, spec.seed)
        specs = [
            GroupSpec(index=(iteration - 1) * prompts + j, task=spec.train_tasks[i])
            for j, i in enumerate(picked)
        ]
        self.settings = self.audit.settings(self.settings)  # the gates the audit chose so far
        totals = _RolloutTotals()
        used = set(picked)

        def refill(r: int, n_needed: int) -> list[Any]:
            # DAPO's round r >= 1: fresh prompts outside the iteration's, seeded by (seed, r)
            extra = extra_round_tasks(
                len(spec.train_tasks), used, iteration, r, n_needed, spec.seed
            )
            used.update(extra)
            more = [
                GroupSpec(
                    index=dapo_group_index(
                        config.iterations, prompts, config.dapo_max_rounds, iteration, r, j
                    ),
                    task=spec.train_tasks[i],
                )
                for j, i in enumerate(extra)
            ]
            return self._roll(more, totals) if more else []

        run = roll_arm(
            arm,
            specs,
            lambda batch: self._roll(batch, totals),
            refill,
            iteration=iteration,
            skipper=self.greso,
            task_ids=[g.task.task_id for g in specs],
            max_rounds=config.dapo_max_rounds,
        )
        # 2. the GRPO batch: cut groups are dropped entirely (their truncated rewards are logged
        # only); a DAPO arm keeps only groups with reward variance
        records, kept, n_skipped = list(run.generated), list(run.batch), len(run.skipped)
        dapo_hit_cap, n_rounds = run.hit_cap, len(run.rounds) if arm.dapo else 1
        if self.greso is not None:
            record_outcomes(self.greso, iteration, greso_outcomes(records))
        judged = self._judge(records)  # before the update: the weights that rolled them out
        # --audit: the cuts and stops it audited ran on inside this iteration's rollout
        audited, stops_audited = self.audit.label(records, iteration)
        outcomes = [
            GroupOutcome(
                r.group_id,
                r.rewards,
                [t.tokens.token_ids if t.tokens is not None else [] for t in r.trajs],
                [t.tokens.action_mask if t.tokens is not None else [] for t in r.trajs],
            )
            for r in kept
        ]
        stats = config_update(config, trainable, self.optimizer, samples_from_groups(outcomes))
        # 3. sync: transformers policies share the updated module (no KV cache may outlive the
        # update); a vLLM engine gets the updated adapter, so the next iteration samples from it
        sync_start = time.perf_counter()
        rolled_with = self.adapter_iteration
        if getattr(self.policy, "live", False) or self.greedy.live:
            raise RuntimeError(
                "trajectories still live after the rollout; their KV caches would be stale"
            )
        self._sync_rollout_weights(iteration)
        sync_s = time.perf_counter() - sync_start
        iter_s = totals.rollout_s + stats.update_s + sync_s
        self.cum_s += iter_s
        # 4. held-out evaluation every E iterations (and at the end), no gate, greedy
        eval_start = time.perf_counter()
        if iteration % config.eval_every == 0 or iteration == config.iterations:
            self.evals += self.evaluate(iteration)
        eval_s = time.perf_counter() - eval_start
        n_zero_var_kept = sum(max(r.rewards) == min(r.rewards) for r in kept)
        metrics = IterationMetrics(
            arm=arm.name,
            seed=spec.seed,
            iteration=iteration,
            rollout=RolloutMetrics(
                groups=len(records),
                env_steps=totals.env_steps,
                gen_tokens=totals.gen_tokens,
                reward=_mean_reward(records),
                # the weights that generated this iteration's rollouts (iteration - 1 when fresh)
                adapter_iteration=rolled_with if self.on_vllm else None,
            ),
            gate=GateMetrics(
                cuts=sum(r.cut for r in records),
                kept=len(kept),
                zero_var_kept=n_zero_var_kept,
                useful=len(kept) - n_zero_var_kept,
                skipped=n_skipped,
                dapo_rounds=n_rounds,
                dapo_hit_cap=dapo_hit_cap,
                stalled=totals.stalled,
            ),
            train=OnpolicyTrain(
                **TrainMetrics.fields_of(stats, config.denominator), reward=_mean_reward(kept)
            ),
            time=IterationTimes(
                rollout_s=totals.rollout_s,
                update_s=stats.update_s,
                sync_s=sync_s,
                iter_s=iter_s,
                cum_s=self.cum_s,
                warmup_s=totals.warmup_s,
                eval_s=eval_s,
            ),
            judged=judged,
            audited=audited,
            stops_audited=stops_audited,
        )
        self.metrics.append(metrics.row())
        # 5. checkpoint (atomic; the last thing of an iteration, so a kill loses at most this one;
        # greso.json first: on resume its outcomes after state.pt's iteration are dropped)
        self.iteration = iteration
        self.audit.save()
        if self.greso is not None:
            from srollout.atomic import atomic_write_json

            history = [list(o) for o in self.greso.history()]
            atomic_write_json(
                {"iteration": iteration, "history": history}, spec.ckpt_dir / GRESO_FILE
            )
        self._checkpoint()
        return metrics

    def _checkpoint(self) -> None:
        """state.pt after ``self.iteration`` (atomic): adapter, optimizer, RNG states, rows."""
        from srollout.training.checkpoint import ArmState, rng_states, save_state
        from srollout.training.lora import adapter_state

        adapter = adapter_state(self.trainable.model)
        optimizer, rng = self.optimizer.state_dict(), rng_states()
        state = ArmState(
            self.iteration, adapter, optimizer, rng, self.metrics, self.evals, self.done
        )
        save_state(self.spec.ckpt_dir, state)

    def result(self, stopped: bool = False) -> ArmResult:
        return ArmResult(self.metrics, self.evals, self.trainable.model, stopped)
