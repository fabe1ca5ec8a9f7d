"""srollout's gate inside verl: an agent loop whose n sessions of one prompt meet at step K
(one :class:`~srollout.integrations.group_barrier.GroupBarrier` per worker process). Registers
``srollout_gated`` and ``srollout_ungated`` (no barrier: validation, baseline arm). Why one barrier
per process sees a whole group, what a session does, the recipe, the config keys and the
``extra_fields``: docs/integrations.md, "verl". Environment steps run synchronously in the event
loop: ALFWorld is not known to be thread-safe."""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any
from uuid import uuid4

from srollout.core.gate import Gate, gate_from_dict
from srollout.core.gate import resolve_gate as core_resolve_gate
from srollout.core.trajectory_signals import NoveltyTracker, TrajectoryState
from srollout.envs.base import Task
from srollout.errors import SrolloutError
from srollout.integrations.group_barrier import GateDecision, GroupBarrier

VERL_VERSION = "0.9.1"  # the release this adapter was written against and tested with
_INSTALL = (
    f"pip install verl=={VERL_VERSION} (in an environment of its own: verl {VERL_VERSION} "
    "requires transformers<5.11, srollout's own backends >=5.19)"
)

try:
    from verl.experimental.agent_loop.agent_loop import (
        AgentLoopBase,
        AgentLoopMetrics,
        AgentLoopOutput,
        register,
    )
except ImportError as err:  # pragma: no cover - exercised where verl is absent
    missing = getattr(err, "name", None) or str(err)
    if missing and str(missing).split(".")[0] == "verl":
        raise SrolloutError(f"srollout.integrations.verl needs verl: {_INSTALL}") from None
    raise SrolloutError(
        f"verl is installed but cannot be imported ({err}); "
        f"install what it names, or reinstall with {_INSTALL}"
    ) from None

GATED, UNGATED = "srollout_gated", "srollout_ungated"
TASK_KEY = "srollout_task"  # extra_info key of a row's task (JSON)
CUT_REWARD = 0.0  # every session of a cut group: a constant, so filter_groups evicts the group


# --- settings ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class VerlGateSettings:
    """The agent loop's settings (keys of its entry in the agent-loop config file, or of a
    ``srollout:`` section of verl's trainer config, e.g. ``+srollout.gate=/path/gate.json``).

    gate: a gate.json path (a sweep run directory works) or its dict; None = the paper's R1 gate.
    G: None = take ``actor_rollout_ref.rollout.n``. timeout_s: how long a group may go without any
    session reporting a step before it is released and kept. model_dir: None =
    ``actor_rollout_ref.model.path``. stall / stall_from, shadow, log_dir: docs/integrations.md.
    """

    gate: str | Mapping[str, Any] | None = None
    G: int | None = None
    T_max: int = 30
    timeout_s: float = 600.0
    model_dir: str | None = None
    stall: int = 0
    stall_from: int = 10
    shadow: bool = False
    log_dir: str | None = None

    @classmethod
    def resolve(cls, overrides: Mapping[str, Any], trainer_config: Any) -> VerlGateSettings:
        """``overrides`` (agent-loop config entry) over the trainer config's ``srollout:``
        section over the defaults; unknown keys are a SrolloutError naming the known ones."""
        section = trainer_config.get("srollout", None) if hasattr(trainer_config, "get") else None
        merged: dict[str, Any] = {}
        for source, where in (
            (section or {}, "srollout: section of the trainer config"),
            (overrides, "agent-loop config entry"),
        ):
            for key, value in dict(source).items():
                if key not in cls.__dataclass_fields__:
                    known = ", ".join(cls.__dataclass_fields__)
                    raise SrolloutError(
                        f"unknown srollout setting {key!r} in the {where} (known: {known})"
                    )
                merged[key] = _plain(value)
        return cls(**merged)


def _plain(value: Any) -> Any:
    """An OmegaConf node as plain Python (dicts and lists), anything else as it is."""
    try:
        from omegaconf import DictConfig, ListConfig, OmegaConf

        if isinstance(value, (DictConfig, ListConfig)):
            return OmegaConf.to_container(value, resolve=True)
    except ImportError:  # pragma: no cover - omegaconf comes with verl
        pass
    return value


def resolve_gate(spec: str | Mapping[str, Any] | Gate | None) -> Gate:
    """A gate from a gate.json path, its dict, a gate object, or None (the paper's R1 gate), as
    every stage resolves it (:func:`srollout.core.gate.resolve_gate`)."""
    if isinstance(spec, Mapping):
        spec = gate_from_dict(spec, "srollout gate setting")
    if not (spec is None or isinstance(spec, (str, Path, Gate))):
        raise SrolloutError(f"gate must be a gate.json path or its dict, got {type(spec).__name__}")
    return core_resolve_gate(spec)[0]


# One barrier per (gate, G, timeout) in each worker process: the n sessions of a uid must meet
# at the same object, and verl instantiates the agent loop anew for every session.
_BARRIERS: dict[tuple[str, int, float], GroupBarrier] = {}


def barrier_for(gate: Gate, G: int, timeout_s: float) -> GroupBarrier:
    """The process-wide barrier of this gate and group size."""
    key = (json.dumps(gate.to_dict(), sort_keys=True, default=str), G, float(timeout_s))
    barrier = _BARRIERS.get(key)
    if barrier is None:
        barrier = _BARRIERS[key] = GroupBarrier(gate, G=G, timeout_s=timeout_s)
    return barrier


# --- tasks in verl's dataset ------------------------------------------------------------------


def task_to_json(task: Task) -> str:
    """A task as the JSON a dataset row carries (generated games carry their PDDL problem)."""
    meta = {k: list(v) if isinstance(v, tuple) else v for k, v in (task.meta or {}).items()}
    return json.dumps({**asdict(task), "meta": meta})


def task_from_row(row: Mapping[str, Any]) -> Task:
    """The task of a verl dataset row (``extra_info.srollout_task``), or a SrolloutError."""
    extra = row.get("extra_info") or {}
    text = extra.get(TASK_KEY) if isinstance(extra, Mapping) else None
    if not text:
        raise SrolloutError(
            f"the dataset row has no extra_info.{TASK_KEY}: build the dataset "
            "with srollout.integrations.verl.write_verl_dataset"
        )
    try:
        fields = json.loads(text)
        meta = dict(fields.get("meta") or {})
        if "walkthrough" in meta:
            meta["walkthrough"] = tuple(meta["walkthrough"])
        named = {k: fields[k] for k in Task.__dataclass_fields__ if k != "meta"}
        return Task(**named, meta=meta)
    except (ValueError, KeyError, TypeError) as err:
        raise SrolloutError(
            f"extra_info.{TASK_KEY} is not a srollout task ({err!r}); rebuild "
            "the dataset with write_verl_dataset"
        ) from None


def write_verl_dataset(
    tasks: Sequence[Task], path: str | Path, agent_name: str = GATED, *, overwrite: bool = False
) -> Path:
    """A Parquet dataset for verl's RLHFDataset: one row per task (verl repeats it n times); the
    agent loop builds the real conversation from ``extra_info``'s task JSON, and agent_name is
    ``GATED`` for training files, ``UNGATED`` for validation files."""
    import polars as pl

    from srollout import schemas

    if agent_name not in (GATED, UNGATED):
        raise SrolloutError(f"agent_name must be {GATED!r} or {UNGATED!r}, got {agent_name!r}")
    if not tasks:
        raise SrolloutError("no tasks to write")
    path = Path(path)
    if path.exists() and not overwrite:
        raise SrolloutError(f"{path} exists; pass overwrite=True or choose another path")
    rows = [
        {
            "data_source": "srollout/alfworld",
            "prompt": [{"role": "user", "content": task.task_text}],
            "agent_name": agent_name,
            "reward_model": {"style": "env", "ground_truth": ""},
            "extra_info": {"index": i, "task_id": task.task_id, TASK_KEY: task_to_json(task)},
        }
        for i, task in enumerate(tasks)
    ]
    return schemas.write(pl.DataFrame(rows), path)


def write_agent_loop_config(
    path: str | Path, settings: VerlGateSettings | None = None, *, overwrite: bool = False
) -> Path:
    """The file for ``actor_rollout_ref.rollout.agent.agent_loop_config_path``: both loops, the
    gated one with ``settings`` (its keys become the loop's constructor arguments)."""
    from srollout.atomic import atomic_write_text

    path = Path(path)
    if path.exists() and not overwrite:
        raise SrolloutError(f"{path} exists; pass overwrite=True or choose another path")
    body = {k: v for k, v in asdict(settings or VerlGateSettings()).items() if v is not None}
    entries = [
        {"name": GATED, "_target_": f"{__name__}.SrolloutAgentLoop", **body},
        {
            "name": UNGATED,
            "_target_": f"{__name__}.SrolloutUngatedAgentLoop",
            **{k: v for k, v in body.items() if k in ("T_max", "model_dir")},
        },
    ]
    # JSON is YAML: OmegaConf.load reads it as it is.
    return atomic_write_text(json.dumps(entries, indent=2) + "\n", path)


# --- the agent loop ---------------------------------------------------------------------------


@register(GATED)
class SrolloutAgentLoop(AgentLoopBase):
    """One session of a group: an ALFWorld episode, gated at step K with its n-1 siblings."""

    gated = True

    def __init__(
        self, *args: Any, name: str | None = None, tools: Any = None, **settings: Any
    ) -> None:
        # verl passes the agent-loop config entry's keys (name included) and a tools wrapper.
        super().__init__(*args, **{k: v for k, v in settings.items() if k in _VERL_INIT_KEYS})
        self.continuous_token_builder = _matching_builder(
            self.tokenizer, self.continuous_token_builder
        )
        own = {k: v for k, v in settings.items() if k not in _VERL_INIT_KEYS}
        self.settings = VerlGateSettings.resolve(own, self.config)
        from srollout.rollout.react import ReactPrompter

        model_dir = self.settings.model_dir or _get(self.config, "actor_rollout_ref.model.path")
        self.prompter = ReactPrompter.for_model(model_dir)
        self.response_length = int(self.rollout_config.response_length)
        if self.settings.T_max < 1:
            raise SrolloutError(f"T_max must be >= 1, got {self.settings.T_max}")
        self.traj_gate = None
        if self.gated and self.settings.stall:
            from srollout.core.trajectory_gate import StallGate

            self.traj_gate = StallGate(W=self.settings.stall, k0=self.settings.stall_from)
            self.traj_gate.check(self.settings.T_max)
        self.barrier: GroupBarrier | None = None
        if self.gated:
            n = self.rollout_config.get("n", None)
            G = self.settings.G if self.settings.G is not None else n
            if G is None:
                raise SrolloutError(
                    "set the group size: actor_rollout_ref.rollout.n (or G in the "
                    "srollout settings)"
                )
            if n is not None and int(n) != int(G):
                raise SrolloutError(
                    f"the gate was set for groups of G={G} but "
                    f"actor_rollout_ref.rollout.n={n}: set rollout.n={G}"
                )
            gate = resolve_gate(self.settings.gate)
            self.barrier = barrier_for(gate, int(G), self.settings.timeout_s)

    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> AgentLoopOutput:
        from srollout.envs.alfworld_env import AlfworldEnv

        task = task_from_row(kwargs)
        member = None
        if self.barrier is not None:
            uid = kwargs.get("uid")
            if uid is None:
                raise SrolloutError(
                    "verl passed no uid to the agent loop: run verl's v1 trainer "
                    "(trainer.use_v1=true, its default)"
                )
            session = kwargs.get("session_id")
            member = self.barrier.join(str(uid), None if session is None else int(session))
        env = AlfworldEnv(expert_plan=False)
        log = None
        if self.gated and self.settings.log_dir is not None:
            from srollout.rollout.trainer_log import SessionLog

            index = member.index if member is not None else int(kwargs.get("session_id") or 0)
            log = SessionLog(
                str(kwargs.get("uid", "u")), index, int(kwargs.get("global_steps") or 0)
            )
        try:
            output = await self._play(env, task, member, sampling_params, log)
            if log is not None:
                settings = {k: v for k, v in asdict(self.settings).items() if k != "timeout_s"}
                log.write(settings.pop("log_dir"), settings, task, output.extra_fields)
            return output
        finally:
            env.close()
            if member is not None:
                member.end()

    async def _play(
        self, env: Any, task: Task, member: Any, sampling_params: dict[str, Any], log: Any = None
    ) -> AgentLoopOutput:
        t0 = time.perf_counter()
        observation, info = env.reset(task, 0)
        env_s = time.perf_counter() - t0
        if log is not None:
            log.initial = observation
        gen_s = 0.0
        messages = [
            {"role": "system", "content": self.prompter.system(task)},
            {"role": "user", "content": self.prompter.user(observation, 1, task, info.admissible)},
        ]
        prompt_ids = await self.ct_build_initial_tokens(messages)
        response_mask: list[int] = []
        logprobs: list[float] | None = None
        request_id = uuid4().hex  # one sticky session for all turns (prefix cache)
        reward, steps, ended_by = 0.0, 0, "max_steps"
        decision = GateDecision(cut=False)
        novelty, rejected = NoveltyTracker(observation), 0  # what the trajectory gate reads
        shadow, shadow_stop = self.settings.shadow, -1
        for t in range(1, self.settings.T_max + 1):
            g0, n_prompt = time.perf_counter(), len(prompt_ids)
            out = await self.server_manager.generate(
                request_id=request_id, prompt_ids=prompt_ids, sampling_params=sampling_params
            )
            gen_s += time.perf_counter() - g0
            if out.log_probs and logprobs is None:
                logprobs = [0.0] * len(response_mask)  # observation tokens carry 0.0, as verl's
            merged, response_mask, new_logprobs = await self.ct_merge_assistant_token(
                prompt_ids,
                out.token_ids,
                response_mask,
                logprobs,
                assistant_logprobs=out.log_probs or None,
            )
            prompt_ids = merged.token_ids
            if new_logprobs is not None:
                logprobs = new_logprobs
            text = self.tokenizer.decode(out.token_ids, skip_special_tokens=True)
            turn = self.prompter.parse(text)
            e0 = time.perf_counter()
            result = env.step(turn.action)
            env_s += time.perf_counter() - e0
            reward += float(result.reward)
            steps = t
            ended = bool(result.done) or t == self.settings.T_max
            lost = bool(result.done) and getattr(result, "won", None) is False
            ended_by = ("lost" if lost else "done") if result.done else "max_steps"
            if not ended and len(response_mask) >= self.response_length:
                ended, ended_by = True, "max_tokens"
            rejected = 0 if result.valid else rejected + 1
            state = TrajectoryState(t, novelty.step(result.observation), rejected)
            if log is not None:
                log.step(t, turn, text, result, n_prompt, len(out.token_ids), state)
            stops = not ended and self.traj_gate is not None and shadow_stop < 0
            if stops and self.traj_gate.stops(state):
                if shadow:
                    shadow_stop = t  # recorded; the session plays on
                else:
                    ended, ended_by = True, "stalled"  # keeps its reward so far, as T_max does
            if not ended:
                # as verl's tool loop: the assistant turn is in the context already (its
                # generated tokens), the next user turn is the delta to merge
                messages.append({"role": "assistant", "content": text})
                previous = list(messages)
                user = self.prompter.user(result.observation, t + 1, task, result.admissible)
                messages.append({"role": "user", "content": user})
                merged, mask, new_logprobs = await self.ct_merge_context_msg(
                    previous, messages, prompt_ids, response_mask, logprobs
                )
                if len(mask) >= self.response_length:
                    # as verl's tool loop: the budget is spent, the observation is not added
                    ended, ended_by = True, "max_tokens"
                else:
                    prompt_ids, response_mask = merged.token_ids, mask
                    if logprobs is not None:
                        logprobs = new_logprobs or []
            if member is not None and not decision.cut:  # (in shadow, play on after a cut)
                decision = await member.step(turn.normalized, observation, ended=ended)
            observation = result.observation
            if ended:
                break
            if decision.cut and not shadow:
                ended_by = "gate"
                break
        if member is not None:
            decision = await member.outcome()  # a session that ended before K waits here
        cut = decision.cut and not shadow
        reward_score = CUT_REWARD if cut else reward
        n_resp = len(response_mask)
        response_ids = prompt_ids[len(prompt_ids) - n_resp :]
        prompt_only = prompt_ids[: len(prompt_ids) - n_resp]
        max_len = self.response_length  # verl's fixed response width
        extra = {
            "turn_scores": [],
            "tool_rewards": [],  # verl's own loops always carry these keys
            "srollout_cut": bool(cut),
            "srollout_cut_step": int(decision.K) if cut else -1,
            "srollout_shadow_cut_step": int(decision.K) if decision.cut and shadow else -1,
            "srollout_shadow_stop_step": shadow_stop,
            "srollout_steps": steps,
            "srollout_ended_by": ended_by,
            "srollout_task_id": task.task_id,
            "srollout_env_reward": reward,
            "reward_extra_info": {"score": reward_score, "srollout_cut": float(cut)},
        }
        return AgentLoopOutput(
            prompt_ids=prompt_only,
            response_ids=response_ids[:max_len],
            response_mask=response_mask[:max_len],
            response_logprobs=logprobs[:max_len] if logprobs else None,
            reward_score=reward_score,
            num_turns=2 * steps + 1,
            metrics=AgentLoopMetrics(generate_sequences=gen_s, tool_calls=env_s),
            extra_fields=extra,
        )


@register(UNGATED)
class SrolloutUngatedAgentLoop(SrolloutAgentLoop):
    """The same episodes without the barrier (validation rows; a baseline arm)."""

    gated = False


# (tokenizer path, chat template) -> the builder class that renders that template token for token
_BUILDERS: dict[tuple[str, str], type] = {}


def _matching_builder(tokenizer: Any, builder: Any) -> Any:
    """verl's Continuous Token builder, or verl's generic one when only that one reproduces the
    tokenizer's own chat template over a two-step episode (verl picks by ``model_type`` alone, and
    its qwen2 builder adds ChatML newlines the shipped policy's compact template never has)."""
    from verl.utils.tokenizer.continuous_token import ContinuousTokenBuilder

    key = (
        str(getattr(tokenizer, "name_or_path", "")),
        str(getattr(tokenizer, "chat_template", "")),
    )
    cls = _BUILDERS.get(key)
    if cls is None:
        cls = type(builder)
        kwargs = builder.chat_template_kwargs
        if cls is not ContinuousTokenBuilder and not _renders_like_template(tokenizer, builder):
            generic = ContinuousTokenBuilder(tokenizer, chat_template_kwargs=kwargs)
            if _renders_like_template(tokenizer, generic):
                cls = ContinuousTokenBuilder
        _BUILDERS[key] = cls
    if cls is type(builder):
        return builder
    return cls(tokenizer, chat_template_kwargs=builder.chat_template_kwargs)


def _renders_like_template(tokenizer: Any, builder: Any) -> bool:
    """Does ``builder``'s incremental path give the template's tokens for s, u1, a1, u2?"""
    try:
        first = [{"role": "system", "content": "s"}, {"role": "user", "content": "u1"}]
        with_answer = first + [{"role": "assistant", "content": "a1"}]
        full = with_answer + [{"role": "user", "content": "u2"}]
        expected = tokenizer.apply_chat_template(
            full, tokenize=True, add_generation_prompt=True, return_dict=False
        )
        eot = [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []
        ids = builder.build_initial_tokens(first)
        answer = tokenizer.encode("a1", add_special_tokens=False) + eot
        ids = builder.merge_assistant_tokens(ids, answer).token_ids
        ids = builder.merge_context_tokens(with_answer, full, ids).token_ids
        return list(ids) == list(expected)
    except Exception:  # a template this probe cannot render: keep verl's choice
        return True


# what verl's AgentLoopBase takes; the other keys of an agent loop's entry are srollout's settings
_VERL_INIT_KEYS = tuple(
    "trainer_config server_manager tokenizer processor dataset_cls data_config "
    "hf_model_type".split()
)


def _get(config: Any, dotted: str) -> Any:
    node = config
    for part in dotted.split("."):
        node = node.get(part, None) if hasattr(node, "get") else None
        if node is None:
            return None
    return node
