"""What every stage that rolls groups out resolves and builds the same way from its options: the
plan (:class:`RolloutPlan`: the environment, its task set, the model directory and the gates,
each resolved once before a run directory exists), then from the plan the policy, the ReAct
prompter and the environment factory.

Not a stage: ``collect``, ``ab-rollout`` and ``train-onpolicy`` build their rollouts from here,
so none calls another's internals. Heavy imports (torch, transformers, alfworld) stay inside the
functions.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from srollout.config import RolloutOptions
from srollout.errors import EnvError, SrolloutError

if TYPE_CHECKING:
    from srollout.core.gate import Gate
    from srollout.envs.registry import EnvSpec


@dataclass(frozen=True)
class RolloutPlan:
    """A stage's inputs, each resolved once before anything is written, then handed on.

    env: the EnvSpec of ``--env``; tasks: its task set (``--tasks``; train-onpolicy's training
    pool), loaded once and played once through the TextEnv protocol; eval_tasks: train-onpolicy's
    held-out tasks (() elsewhere); model_dir: the LM's directory, ``resolve_model(--model)`` (its
    files checked), None for the planner policies; gate / gate_K: the group gate and its step K
    (None: no group gate); traj_gate: the trajectory gate (None: none). ``--gate``'s file is read
    once, into whichever of the two it is. loop_gate: the loop arm's loop detector in an A/B
    (``--loop K0``, from step 1 when not given; None without a loop arm).
    """

    env: EnvSpec
    tasks: tuple[Any, ...]
    model_dir: Path | None
    gate: Gate | None = None
    gate_K: int | None = None
    traj_gate: Gate | None = None
    eval_tasks: tuple[Any, ...] = ()
    loop_gate: Gate | None = None

    def prompter(self) -> Any:
        """The environment's prompt and parser (:class:`srollout.rollout.react.EnvPrompter`), with
        the LM's own system prompt and user-turn template where its model directory names them
        (the default policy is fine-tuned on a prompt of its own)."""
        from srollout.rollout.react import EnvPrompter

        return EnvPrompter.for_env(self.env, self.model_dir)

    def env_factory(self, expert: bool = False) -> Callable[[], Any]:
        """A callable making one environment (the engine reuses them); ``expert``: the one that
        also gives the planner's plan (ALFWorld's computes it only then)."""
        return self.env.env_factory(expert=expert)


def plan_rollout(
    config: RolloutOptions,
    *,
    arms: Sequence[Any] | None = None,
    tasks: Sequence[Any] | None = None,
    check_env: bool = True,
    check_policy: bool = True,
) -> RolloutPlan:
    """Resolve ``config`` once: ``--env`` and its task set ``--tasks`` (``tasks``: these instead;
    ``check_env``: play the protocol once), the gates (:func:`plan_gates`; ``arms``: the A/B's,
    whose switches say which gates are needed) and ``--model`` (``check_policy``: also the
    backend, the adapter and the server, :func:`srollout.policy.preflight`). Every failure is
    one SrolloutError line, before a run directory exists."""
    from srollout.envs.registry import check_env as play_once
    from srollout.envs.registry import resolve_env

    env = resolve_env(config.env)
    if config.difficulty != "small" and "difficulty" not in env.task_options:
        raise SrolloutError(
            f"--difficulty sizes ALFWorld's generated rooms; not with --env {config.env}"
        )
    loaded = (
        tuple(tasks)
        if tasks is not None
        else tuple(env.task_set(config.tasks, difficulty=config.difficulty))
    )
    if check_env:
        play_once(env, loaded)
    if arms is None:
        gates = plan_gates(config)
    else:
        gates = plan_gates(
            config, group=any(a.gate for a in arms), stall_arms=any(a.stall for a in arms)
        )
    loop_gate = None
    if arms is not None and any(getattr(a, "loop", False) for a in arms):
        from srollout.core.trajectory_gate import LoopGate

        loop_gate = LoopGate(k0=config.loop or 1)
        loop_gate.check(config.T_max)
    model_dir = plan_model(config, check_policy=check_policy)
    return RolloutPlan(env, loaded, model_dir, *gates, loop_gate=loop_gate)


def plan_model(config: Any, *, check_policy: bool = True) -> Path | None:
    """``--model`` resolved once (:func:`srollout.policy.resolve_model`; None for the planner
    policies); with ``check_policy`` the rest of the policy is checked too (backend, adapter,
    server: :func:`srollout.policy.preflight`), nothing loaded."""
    if getattr(config, "policy", "lm") != "lm":
        return None
    from srollout.policy import preflight, resolve_model

    model_dir = resolve_model(config.model if config.model is not None else "default")
    if check_policy:
        preflight(
            "lm", model_dir, config.backend, adapter=getattr(config, "adapter", None),
            base_url=config.base_url, model_dir=model_dir,
        )  # fmt: skip
    return model_dir


def plan_gates(
    config: Any, *, group: bool | None = None, stall_arms: bool | None = None
) -> tuple[Gate | None, int | None, Gate | None]:
    """(gate, gate_K, traj_gate) of ``config``'s gate options, ``--gate``'s file read once.

    group: whether the group gate is needed (True: an arm applies it, from --gate or rule --rule
    at (--K, --d-L), the paper's (10, 0.12) where not given; None: only when asked for, by a
    group gate.json or any of --K / --d-L / --t-high / --rule r3). stall_arms: whether an arm
    applies the trajectory gate (True: the default rule when none is given; False: a stall
    gate.json is refused; None: no arms, the trajectory gate runs when given). The trajectory
    gate is ``--stall W --stall-from K0``, ``--loop K0`` (collect) or a gate.json of a trajectory
    kind in ``--gate``; with arms, a loop gate file is refused (the loop arm takes --loop)."""
    from srollout.core.gate import load_gate, resolve_gate
    from srollout.core.trajectory_gate import LoopGate, StallGate

    loaded = load_gate(config.gate) if config.gate is not None else None
    stall_file = loaded is not None and loaded.scope == "trajectory"
    loop = getattr(config, "loop", 0)  # collect and ab-rollout have --loop
    if isinstance(loaded, LoopGate) and stall_arms is not None:
        raise SrolloutError(
            f"--gate {config.gate} is a loop gate: with arms, the loop arm's rule is --loop K0"
        )
    if stall_file and loop:
        raise SrolloutError("give either --loop K0 or a trajectory gate.json in --gate, not both")
    if stall_file and config.stall:
        raise SrolloutError("give either --stall W or a stall gate.json in --gate, not both")
    if stall_file and stall_arms is False:
        raise SrolloutError(
            f"--gate {config.gate} is a trajectory gate: it is the rule of the stall arms; add "
            "stall, gated+stall, stall+dapo or stall+greso to --arms"
        )
    if group is None:
        asked = (config.K, config.d_L, config.t_high) != (None, None, None)
        group = asked or config.rule != "r1" or (loaded is not None and not stall_file)
    gate = K = None
    if group:
        # a trajectory gate's file (gate-stall.json) is the stall arms'; the group gate then is
        # the options'
        gate, K = resolve_gate(
            None if stall_file else loaded,
            K=config.K,
            d_L=config.d_L,
            rule=config.rule,
            t_high=config.t_high,
            T_max=config.T_max,
        )
    traj_gate: Gate | None = None
    if config.stall > 0:
        traj_gate = StallGate(W=config.stall, k0=config.stall_from)
    elif loop and stall_arms is None:
        traj_gate = LoopGate(k0=loop)
    elif stall_file:
        traj_gate = loaded
    elif stall_arms:
        traj_gate = StallGate()
    if traj_gate is not None:
        traj_gate.check(config.T_max)
    if isinstance(traj_gate, LoopGate) and getattr(config, "audit", 0) > 0:
        raise SrolloutError(
            "--audit moves a gate's threshold; the loop detector (a loop gate file) has none"
        )
    return gate, K, traj_gate


def build_policy(config: RolloutOptions, model_dir: Path | None) -> Any:
    """The policy that acts: the LM in ``model_dir`` (the plan's, resolved once), the planner,
    or the noisy planner. A Ray worker builds its replica with it too (``functools.partial``)."""
    from srollout.policy import make_policy

    return make_policy(
        kind=config.policy,
        model=model_dir,
        backend=config.backend,
        temperature=config.temperature,
        top_p=config.top_p,
        adapter=config.adapter,
        noise=config.eps,
        seed=config.seed,
        base_url=config.base_url,
        model_dir=model_dir,
    )


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
