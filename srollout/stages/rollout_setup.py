"""What every stage that rolls groups out builds the same way from its rollout options
(:class:`srollout.config.RolloutOptions`): the task set, the policy, the ReAct prompter, the
environment factory, the gate and its audit (``--audit``).

Not a stage: ``collect`` and ``ab-rollout`` both build their rollouts from here, so neither
calls the other's internals. Heavy imports (torch, transformers, alfworld) stay inside the
functions.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from srollout.config import RolloutOptions
from srollout.errors import EnvError, SrolloutError

if TYPE_CHECKING:
    from srollout.core.gate import Gate
    from srollout.core.trajectory_gate import StallGate

OptionsT = TypeVar("OptionsT", bound=RolloutOptions)


def load_tasks(name: str, difficulty: str = "small", env: str = "alfworld") -> list:
    """The tasks of set ``name`` of environment ``env`` (an unknown name is a SrolloutError),
    ALFWorld's with rooms of ``difficulty`` (:meth:`srollout.envs.registry.EnvSpec.task_set`)."""
    from srollout.envs.registry import resolve_env

    return resolve_env(env).task_set(name, difficulty=difficulty)


def build_gate(config: RolloutOptions) -> tuple[Gate, int]:
    """(gate, K) of ``config``'s gate options: --gate gate.json (its own K) or rule --rule at
    (--K, --d-L), the paper's (10, 0.12) where not given
    (:func:`srollout.core.gate.resolve_gate`)."""
    from srollout.core.gate import resolve_gate

    # a trajectory gate's file (gate-stall.json) is the stall arms'; the group gate is the options'
    return resolve_gate(
        config.gate if config.gate_scope != "trajectory" else None,
        K=config.K,
        d_L=config.d_L,
        rule=config.rule,
        t_high=config.t_high,
        T_max=config.T_max,
    )


def build_traj_gate(config: RolloutOptions) -> StallGate | None:
    """The trajectory gate of ``config``: --stall W from --stall-from, or a gate.json of a
    trajectory kind in --gate; None when neither (checked against --T-max)."""
    from srollout.core.gate import load_gate
    from srollout.core.trajectory_gate import StallGate

    if config.stall > 0:
        gate = StallGate(W=config.stall, k0=config.stall_from)
    elif config.gate is not None and (loaded := load_gate(config.gate)).scope == "trajectory":
        gate = loaded
    else:
        return None
    gate.check(config.T_max)
    return gate


def build_policy(config: RolloutOptions) -> Any:
    """The policy that acts: the LM (default policy or --model), the planner, or the noisy
    planner."""
    from srollout.policy import make_policy

    return make_policy(
        kind=config.policy,
        model=config.model if config.model is not None else "default",
        backend=config.backend,
        temperature=config.temperature,
        top_p=config.top_p,
        adapter=config.adapter,
        noise=config.eps,
        seed=config.seed,
        base_url=config.base_url,
    )


def build_prompter(config: RolloutOptions) -> Any:
    """The environment's prompt and parser (:class:`srollout.rollout.react.EnvPrompter`), with the
    LM's own system prompt and user-turn template where its model directory names them (the
    default policy is fine-tuned on a prompt of its own; ``srollout.envs.prompts.model_prompt``)."""
    from srollout.envs.registry import resolve_env
    from srollout.rollout.react import EnvPrompter

    model_dir = None
    if config.policy == "lm":
        from srollout.policy import resolve_model

        model_dir = resolve_model(config.model if config.model is not None else "default")
    return EnvPrompter.for_env(resolve_env(config.env), model_dir)


def check_rollout_env(config: RolloutOptions) -> None:
    """Resolve ``--env``, load its task set ``--tasks`` and play the TextEnv protocol once
    (:func:`srollout.envs.registry.check_env`), so that an unknown name, an option it does not
    take or an environment that does not speak the protocol fails before a run directory
    exists."""
    from srollout.envs.registry import check_env, resolve_env

    spec = resolve_env(config.env)
    if config.difficulty != "small" and "difficulty" not in spec.task_options:
        raise SrolloutError(
            f"--difficulty sizes ALFWorld's generated rooms; not with --env {config.env}"
        )
    check_env(spec, spec.task_set(config.tasks, difficulty=config.difficulty))


def check_policy(config: RolloutOptions) -> None:
    """Fail now (one line) on a missing backend, a damaged model or a server that does not
    answer, before a run directory exists (:func:`srollout.policy.preflight`)."""
    from srollout.policy import preflight

    preflight(
        config.policy, config.model, config.backend, adapter=config.adapter,
        base_url=config.base_url,
    )  # fmt: skip


def build_env_factory(config: RolloutOptions) -> Callable[[], Any]:
    """A callable making one environment of ``--env`` (the engine reuses them); for the
    planner policies the one that also gives the expert's plan (ALFWorld's computes it only
    then)."""
    from srollout.envs.registry import resolve_env

    return resolve_env(config.env).env_factory(expert=config.policy != "lm")


@contextmanager
def resume_hint(run_dir: Path, stage: str) -> Iterator[None]:
    """An environment that fails mid-run (:class:`~srollout.errors.EnvError`) stays one line,
    which now also says what was kept and how to continue: the finished groups are in parts/,
    the manifest says partial, and ``--resume`` rolls out only the rest."""
    try:
        yield
    except EnvError as err:
        from srollout.rollout.parts import finished_groups

        n = len(finished_groups(run_dir))
        raise EnvError(
            f"{err}; the {n} groups finished before it are kept: fix it, then "
            f"`srollout {stage} --resume --out {run_dir}` continues"
        ) from err


def for_workers(config: OptionsT) -> OptionsT:
    """``config`` as Ray workers get it: with the transformers LM, the model directory resolved
    (and the default policy built, if need be) here once rather than by every worker."""
    if config.policy == "lm" and config.backend == "transformers":
        from srollout.policy import resolve_model

        return replace(
            config, model=resolve_model(config.model if config.model is not None else "default")
        )
    return config


__all__ = (
    "build_env_factory",
    "build_gate",
    "build_policy",
    "build_prompter",
    "check_rollout_env",
    "for_workers",
    "load_tasks",
)
