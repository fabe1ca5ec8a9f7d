"""Selective rollout inside TRL's ``GRPOTrainer``: a ``rollout_func`` that plays multi-turn episodes
through srollout's engine with the trainer's live weights and stops groups at step K::

    rollout = GatedRollout.alfworld("train", G=4, gate=GateRule("r1", K=10, d_L=0.12))
    trainer = GRPOTrainer(model=path, args=GRPOConfig(num_generations=4, ...),
                          train_dataset=rollout.dataset(), reward_funcs=rollout.reward,
                          rollout_func=rollout)

The ``rollout_func`` contract (TRL's block layout of groups, ``env_mask``, a cut group's masked
rows with reward None) and every option: docs/integrations.md."""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

from srollout.core.gate import Gate
from srollout.core.grpo import is_zero_variance
from srollout.envs.base import Task
from srollout.errors import SrolloutError
from srollout.integrations.trl_sampling import check_sampling, sample_batch
from srollout.rollout.engine import GroupRecord, GroupSpec, Prompter, RolloutSettings, run_groups
from srollout.rollout.trainer_log import LOG_K

# The rollout_func contract this module was written against and tested with.
TRL_SUPPORTED = ("1.16",)
TRL_PIN = "trl==1.16.0"
_TASK_TAG = re.compile(r"^\[srollout task (?P<task_id>[^\]]+)\]")


def check_trl_version(version: str | None = None) -> str:
    """The installed TRL version, if it is one this module was built for; else a SrolloutError
    naming the pin (``rollout_func`` is experimental in TRL and its contract may change)."""
    if version is None:
        try:
            import trl
        except ImportError as e:
            raise SrolloutError(
                f"TRL is not installed: pip install '{TRL_PIN}' (or the `trl` extra of srollout)"
            ) from e
        version = trl.__version__
    if ".".join(version.split(".")[:2]) not in TRL_SUPPORTED:
        raise SrolloutError(
            f"srollout.integrations.trl was built for trl {', '.join(TRL_SUPPORTED)} (its "
            f"rollout_func contract), found trl {version}: pip install '{TRL_PIN}'"
        )
    return version


class _CutRowFilter(logging.Filter):
    """Drops TRL's "All reward functions returned None" warning when the row is a cut group's
    (its ``srollout_reward`` is None on purpose); any other row's warning still shows."""

    def filter(self, record: logging.LogRecord) -> bool:
        msg = record.getMessage()
        return not (
            "All reward functions returned None" in msg and "'srollout_reward': None" in msg
        )


def _quiet_cut_rows() -> None:
    log = logging.getLogger("trl.trainer.grpo_trainer")
    if not any(isinstance(f, _CutRowFilter) for f in log.filters):
        log.addFilter(_CutRowFilter())


def task_prompt(task: Task) -> str:
    """The dataset prompt of ``task``: its id in a tag the rollout function reads back, then the
    goal."""
    return f"[srollout task {task.task_id}] {task.task_text}"


def _metric(name: str, kind: str = "") -> Any:
    """A count logged through TRL as ``name``; ``kind``: "shadow" / "sampling" (logged only by a
    rollout with shadow decisions / dynamic sampling)."""
    return field(default=0, metadata={"metric": name, "kind": kind})


@dataclass
class RolloutCounts:
    """What the gated rollouts of a training run cost, summed over calls: groups, cuts and steps,
    shadow decisions with how many were right, and dynamic sampling's refills and skips. A field
    with a metric name is the count behind that TRL metric of :meth:`GatedRollout.metrics`, logged
    in field order (docs/integrations.md); groups, env_steps and gen_tokens include discarded
    groups."""

    calls: int = 0
    groups: int = 0
    cut: int = 0
    trajectories_cut: int = _metric("gate/trajectories_cut")
    steps_saved_max: int = _metric("gate/steps_saved_max")
    stalled: int = _metric("gate/trajectories_stalled")
    env_steps: int = _metric("rollout/env_steps")
    gen_tokens: int = _metric("rollout/gen_tokens")
    shadow_cuts: int = _metric("gate/shadow_cuts", "shadow")
    shadow_cuts_right: int = _metric("gate/shadow_cuts_right", "shadow")
    shadow_stops: int = _metric("gate/shadow_stops", "shadow")
    shadow_stops_right: int = _metric("gate/shadow_stops_right", "shadow")
    shadow_cut_steps: int = _metric("gate/shadow_cut_steps_saved", "shadow")
    shadow_stop_steps: int = _metric("gate/shadow_stop_steps_saved", "shadow")
    extra_groups: int = _metric("sampling/extra_groups", "sampling")
    refill_rounds: int = _metric("sampling/refill_rounds", "sampling")
    skipped: int = _metric("sampling/greso_skipped", "sampling")
    unfilled: int = _metric("sampling/unfilled", "sampling")
    dropped: int = _metric("sampling/dropped", "sampling")

    def add(self, other: RolloutCounts) -> None:
        for f in fields(self):
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))


@dataclass
class GatedRollout:
    """A TRL ``rollout_func`` (call it as ``rollout(prompts, trainer)``) and its reward function.

    G must equal the trainer's ``num_generations``; gate / traj_gate: any srollout gate, or None
    for plain GRPO through the same engine; group n of the run (counted over calls) gets the
    engine's seeds for (seed, n, traj), so gated and ungated runs see the same episodes up to K.
    shadow, dynamic_sampling, greso_p, skip and log_dir are described in docs/integrations.md."""

    tasks: Sequence[Task]
    G: int
    env_factory: Callable[[], Any]
    prompter: Prompter | None = None
    gate: Gate | None = None
    traj_gate: Gate | None = None
    T_max: int = 30
    temperature: float = 0.7
    max_new_tokens: int = 64
    seed: int = 0
    concurrency: int | None = None
    shadow: bool = False
    dynamic_sampling: bool = False
    max_refill_rounds: int = 3
    greso_p: float | None = None
    skip: str = "greso"
    log_dir: str | None = None
    counts: RolloutCounts = field(default_factory=RolloutCounts)
    last: RolloutCounts = field(default_factory=RolloutCounts)
    last_records: list[GroupRecord] = field(default_factory=list, repr=False)
    _by_id: dict[str, Task] = field(default_factory=dict, repr=False)
    _next_group: int = 0
    _greso: Any = field(default=None, repr=False)
    _log: Any = field(default=None, repr=False)
    _log_open: bool = False
    # what generated the last call: "transformers" (the trainer's module) or "vllm" (TRL's engine)
    backend: str = "transformers"

    def __post_init__(self) -> None:
        check_trl_version()
        _quiet_cut_rows()
        if self.gate is not None and self.gate.scope == "trajectory":
            if self.traj_gate is not None:
                raise SrolloutError("give the trajectory gate once: as gate or as traj_gate")
            self.gate, self.traj_gate = None, self.gate
        if self.traj_gate is not None:
            self.traj_gate.check(self.T_max)
        self._by_id = {t.task_id: t for t in self.tasks}
        if len(self._by_id) != len(self.tasks):
            raise SrolloutError(
                "task ids must be unique: the rollout function finds a task by its id"
            )
        self.settings(1)  # validates G, T_max and the gate's K now, not at the first training step
        check_sampling(self)
        self._greso = self._skipper()
        if self.log_dir is not None:
            from srollout.rollout.trainer_log import TrainerLog

            self._log = TrainerLog(self.log_dir, self.log_config())

    @classmethod
    def alfworld(cls, task_set: str = "train", **kwargs: Any) -> GatedRollout:
        """ALFWorld's real engine on srollout's task set ``task_set``: :meth:`from_env` of
        ``alfworld`` (``n_tasks``, ``difficulty``, ``model_dir`` and the rest as there)."""
        return cls.from_env("alfworld", task_set, **kwargs)

    @classmethod
    def from_env(
        cls,
        env: str,
        task_set: str = "train",
        *,
        n_tasks: int | None = None,
        model_dir: str | None = None,
        difficulty: str = "small",
        **kwargs: Any,
    ) -> GatedRollout:
        """Any environment ``--env`` accepts (:func:`srollout.envs.registry.resolve_env`): its task
        set ``task_set`` (first ``n_tasks``), ``make_env``, and prompt and parser for the model in
        ``model_dir`` (default: the shipped default policy); the protocol is played once here
        (:func:`~srollout.envs.registry.check_env`), before any training step."""
        from srollout.envs.registry import check_env, resolve_env
        from srollout.policy import resolve_model
        from srollout.rollout.react import EnvPrompter

        spec = resolve_env(env)
        tasks = spec.task_set(task_set, n=n_tasks, difficulty=difficulty)
        check_env(spec, tasks)
        return cls(
            tasks=tasks,
            env_factory=spec.env_factory(),
            prompter=EnvPrompter.for_env(spec, resolve_model(model_dir or "default")),
            **kwargs,
        )

    def log_config(self) -> dict[str, Any]:
        """The settings a trainer log is made with (a log of other settings is refused)."""

        def gate_dict(gate: Any) -> Any:
            return None if gate is None else gate.to_dict()

        return {
            "G": self.G,
            "T_max": self.T_max,
            "seed": self.seed,
            "temperature": self.temperature,
            "max_new_tokens": self.max_new_tokens,
            "tasks": [t.task_id for t in self.tasks],
            "gate": gate_dict(self.gate),
            "traj_gate": gate_dict(self.traj_gate),
            "shadow": self.shadow,
            "dynamic_sampling": self.dynamic_sampling,
            "max_refill_rounds": self.max_refill_rounds,
            "greso_p": self.greso_p,
            # only off the default, so the logs of GRESO runs resume as they were written
            **({"skip": self.skip} if self.skip != "greso" else {}),
        }

    def _open_log(self, trainer: Any, global_step: int) -> None:
        """Open the log at the trainer's step (a resume restores the seeds' group index and
        GRESO's history from it) and merge it into its tables when training ends."""
        resume = self._log.open(global_step)
        self._log_open = True
        if resume.steps:
            self._next_group = resume.next_group
            self._greso = self._skipper(resume.greso)
        trainer.add_callback(_merge_log_at_end(self._log))

    def _skipper(self, history: Sequence[Any] = ()) -> Any:
        """GRESO's skip (None without greso_p), fed ``history`` (a resumed log's outcomes)."""
        from srollout.core.arms import skipper_for

        if self.greso_p is None:
            return None
        return skipper_for(self.skip, seed=self.seed, p_explore=self.greso_p, history=history)

    # --- what TRL is given ---------------------------------------------------------------------
    def dataset(self, repeats: int = 1) -> Any:
        """A ``datasets.Dataset`` with one ``prompt`` per task (``repeats`` times over)."""
        from datasets import Dataset

        return Dataset.from_list(
            [{"prompt": task_prompt(t)} for _ in range(repeats) for t in self.tasks]
        )

    def task_of(self, prompt: Any) -> Task:
        """The task a dataset prompt names (a string, or a chat whose first message holds it)."""
        text = prompt
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], dict):
            text = prompt[0].get("content", "")
        tag = _TASK_TAG.match(text) if isinstance(text, str) else None
        if tag is None:
            raise SrolloutError(
                f"prompt {str(prompt)[:80]!r} does not name a srollout task; "
                "build the training dataset with GatedRollout.dataset() so "
                "each prompt starts with '[srollout task ID]'"
            )
        task = self._by_id.get(tag.group("task_id"))
        if task is None:
            raise SrolloutError(
                f"prompt names task {tag.group('task_id')!r}, which is not in this "
                "rollout's task set "
                f"({len(self._by_id)} tasks): give GatedRollout the tasks the dataset was made from"
            )
        return task

    def settings(self, n_groups: int) -> RolloutSettings:
        return RolloutSettings(
            G=self.G,
            T_max=self.T_max,
            seed=self.seed,
            concurrency=max(self.concurrency or 0, self.G * n_groups, self.G),
            # a log records the signals at analyze's K, as a collect does
            signal_K=tuple(k for k in LOG_K if k <= self.T_max) if self._log else (),
            gate=self.gate,
            arm="gated" if self.gate is not None or self.traj_gate is not None else "baseline",
            traj_gate=self.traj_gate,
            shadow=self.shadow,
        )

    def groups_of(self, prompts: Sequence[Any], G: int) -> list[Task]:
        """The task of each block of G prompts, checking TRL's block layout."""
        if G != self.G:
            raise SrolloutError(
                f"the trainer's num_generations is {G} but the rollout was built with G={self.G}: "
                "set GRPOConfig(num_generations=...) and the rollout's G to the same value"
            )
        if len(prompts) % G:
            raise SrolloutError(f"{len(prompts)} prompts is not a whole number of groups of G={G}")
        tasks = []
        for g in range(len(prompts) // G):
            block = prompts[g * G : (g + 1) * G]
            if any(p != block[0] for p in block):
                raise SrolloutError(
                    f"prompts {g * G}..{(g + 1) * G - 1} are not one prompt repeated G={G} times: "
                    "TRL's sampler no longer lays groups out in blocks (check the TRL version)"
                )
            tasks.append(self.task_of(block[0]))
        return tasks

    def __call__(self, prompts: list[Any], trainer: Any) -> dict[str, Any]:
        """TRL's ``rollout_func``: roll out the groups of ``prompts`` with ``trainer``'s live
        model, or on TRL's colocated vLLM engine when the trainer generates with vLLM
        (``use_vllm=True``; TRL has just synced it, :mod:`srollout.integrations.trl_vllm`)."""
        model = trainer.accelerator.unwrap_model(trainer.model)
        G = trainer.num_generations if model.training else trainer.num_generations_eval
        tasks = self.groups_of(prompts, G)
        policy = None  # TRL's use_vllm: its engine, with the weights it just synced (trl_vllm.py)
        if getattr(getattr(trainer, "args", None), "use_vllm", False) is True:
            from srollout.integrations.trl_vllm import engine_policy

            policy = engine_policy(
                trainer, temperature=self.temperature, max_new_tokens=self.max_new_tokens
            )
        self.backend = "transformers" if policy is None else "vllm"
        tokenizer = trainer.processing_class
        step = int(trainer.state.global_step) + 1  # the optimizer step these rollouts feed
        if model.training and self._log is not None and not self._log_open:
            self._open_log(trainer, step - 1)
        sampled = sample_batch(  # evaluation calls are never filtered
            self,
            tasks,
            lambda specs: self.roll(specs, model, tokenizer, policy),
            step,
            self._greso if model.training else None,
            dynamic=model.training and self.dynamic_sampling,
        )
        slots, records = list(sampled.slots), list(sampled.generated)
        out, counts = self.to_trl(
            slots, tokenizer, logprobs_of=getattr(policy, "logprobs_of", None)
        )
        kept = {id(r) for r in slots if r is not None}
        for record in records:  # the groups rolled out and discarded cost as much as the kept
            if id(record) not in kept:
                _count_group(counts, record, self.T_max)
        counts.extra_groups = sampled.extra_groups
        counts.refill_rounds = sampled.rounds - 1
        counts.skipped = sampled.skipped
        counts.unfilled = sampled.unfilled
        counts.dropped = len(records) - len(kept)
        self.last, self.last_records = counts, records
        if model.training and self._log is not None:
            in_batch = {id(r) for r in slots if r is not None and not r.cut}
            self._log.write(step, records, [id(r) in in_batch for r in records], self.shadow)
        self.counts.add(counts)
        log = getattr(trainer, "_metrics", None)
        if log is not None:
            for key, value in self.metrics(counts, self.shadow, self.sampling).items():
                log["train" if model.training else "eval"][key].append(value)
        return out

    # --- the work -------------------------------------------------------------------------------
    @property
    def sampling(self) -> bool:
        """Whether training calls run dynamic sampling (DAPO's refill and/or GRESO's skip)."""
        return self.dynamic_sampling or self.greso_p is not None

    def roll(
        self, specs: Sequence[GroupSpec], model: Any, tokenizer: Any, policy: Any = None
    ) -> list[GroupRecord]:
        """Roll out the groups ``specs`` (their indices fix the seeds) with ``policy`` (default:
        ``model`` itself through transformers, in eval mode, restored after); records in spec
        order."""
        from srollout.policy.transformers_backend import TransformersPolicy
        from srollout.rollout.react import ReactPrompter

        policy = policy or TransformersPolicy(
            getattr(model.config, "_name_or_path", "trl-model") or "trl-model",
            model=model,
            tokenizer=tokenizer,
            temperature=self.temperature,
            max_new_tokens=self.max_new_tokens,
            device=str(next(model.parameters()).device),
        )
        records: dict[int, GroupRecord] = {}
        was_training = model.training
        model.eval()
        try:
            run_groups(
                specs,
                policy,
                self.env_factory,
                self.prompter or ReactPrompter(),
                self.settings(len(specs)),
                on_group=lambda r: records.__setitem__(r.spec.index, r),
            )
        finally:
            model.train(was_training)
        return [records[s.index] for s in specs]

    def to_trl(
        self,
        records: Sequence[GroupRecord | None],
        tokenizer: Any,
        logprobs_of: Callable[[Any, int], list[float]] | None = None,
    ) -> tuple[dict[str, Any], RolloutCounts]:
        """TRL's rollout dict for ``records`` (G rows per group, in order; None: a dropped slot) and
        what they cost; a cut group's rows and a dropped slot's are one masked end-of-turn token
        with reward None. ``logprobs_of(TrajKey, n)``: a trajectory's sampling log-probabilities
        (vLLM)."""
        from srollout.policy.base import TrajKey
        from srollout.policy.chat import end_of_turn_ids

        eot = end_of_turn_ids(tokenizer)[0]
        prompt_ids: list[list[int]] = []
        completion_ids: list[list[int]] = []
        env_mask: list[list[int]] = []
        rewards: list[float | None] = []
        logprobs: list[list[float]] = []
        counts = RolloutCounts(calls=1)
        for record in records:
            if record is None:  # nothing to train on in this slot: G masked rows
                prompt_ids += [[eot] for _ in range(self.G)]
                completion_ids += [[eot] for _ in range(self.G)]
                env_mask += [[0] for _ in range(self.G)]
                rewards += [None] * self.G
                logprobs += [[float("nan")] for _ in range(self.G)]
                continue
            _count_group(counts, record, self.T_max)
            for i, traj in enumerate(record.trajs):
                if traj.tokens is None:
                    raise SrolloutError(
                        "the policy returned no tokens for a "
                        "trajectory (a non-LLM policy cannot train)"
                    )
                ids, mask = traj.tokens.token_ids, traj.tokens.action_mask
                first = mask.index(True) if True in mask else len(ids)
                prompt_ids.append(list(ids[:first]))
                if logprobs_of is not None:
                    lp = logprobs_of(TrajKey(record.group_id, i), len(ids))
                    logprobs.append([float("nan")] if record.cut else lp[first:])
                if record.cut:
                    completion_ids.append([eot])
                    env_mask.append([0])
                    rewards.append(None)
                else:
                    completion_ids.append(list(ids[first:]))
                    env_mask.append([int(m) for m in mask[first:]])
                    rewards.append(float(traj.reward))
        out = {
            "prompt_ids": prompt_ids,
            "completion_ids": completion_ids,
            "logprobs": logprobs if logprobs_of is not None else None,
            "env_mask": env_mask,
            "srollout_reward": rewards,
        }
        return out, counts

    def reward(
        self,
        prompts: list[Any],
        completions: list[Any],
        srollout_reward: list[float | None] | None = None,
        **kwargs: Any,
    ) -> list[float | None]:
        """TRL reward function: the episode's environment reward (1 when won), None for a row of
        a cut group (TRL gives it advantage 0)."""
        if srollout_reward is None:
            raise SrolloutError(
                "GatedRollout.reward needs the rollout's "
                "rewards: pass rollout_func=the same GatedRollout"
            )
        return list(srollout_reward)

    @staticmethod
    def metrics(
        counts: RolloutCounts, shadow: bool = False, sampling: bool = False
    ) -> dict[str, float]:
        """What one call logs through TRL (averaged over the logging window by TRL)."""
        out = {
            "gate/groups_cut": float(counts.cut),
            "gate/cut_fraction": counts.cut / counts.groups if counts.groups else 0.0,
        }
        kinds = {"", *(["shadow"] if shadow else []), *(["sampling"] if sampling else [])}
        for f in fields(counts):
            if "metric" in f.metadata and f.metadata["kind"] in kinds:
                out[f.metadata["metric"]] = float(getattr(counts, f.name))
        return out


def _merge_log_at_end(log: Any) -> Any:
    """A transformers ``TrainerCallback`` that merges ``log``'s parts when training ends."""
    from transformers import TrainerCallback

    class MergeLog(TrainerCallback):
        def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            log.merge()

    return MergeLog()


def _count_group(counts: RolloutCounts, record: GroupRecord, T_max: int) -> None:
    """Add what one rolled-out group cost, and its shadow decisions (each scored by the group's
    full outcome), to ``counts``."""
    counts.groups += 1
    counts.cut += int(record.cut)
    if record.shadow_cut_step is not None:
        counts.shadow_cuts += 1
        counts.shadow_cuts_right += int(is_zero_variance(record.rewards))
        cut = record.shadow_cut_step
        counts.shadow_cut_steps += sum(max(0, len(t.steps) - cut) for t in record.trajs)
    for traj in record.trajs:
        counts.env_steps += len(traj.steps)
        counts.gen_tokens += traj.n_gen_tokens
        counts.stalled += int(traj.stalled)
        if record.cut and traj.ended_by == "gate":
            counts.trajectories_cut += 1
            counts.steps_saved_max += T_max - int(record.cut_step)
        if traj.shadow_stop is not None:
            counts.shadow_stops += 1
            counts.shadow_stops_right += int(not traj.success)
            counts.shadow_stop_steps += len(traj.steps) - traj.shadow_stop
