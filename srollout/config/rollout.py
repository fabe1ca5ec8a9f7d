"""The configs of the stages that roll groups out: the shared :class:`RolloutOptions`,
``collect``, ``ab-rollout``, and ``--workers`` (:class:`DistConfig`)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from srollout.config.common import (
    PAPER_G,
    PAPER_K_VALUES,
    PAPER_T_MAX,
    PAPER_TEMPERATURE,
    Resumable,
    _check_choice,
    _check_K,
    _check_seed,
    _check_unit,
    audit_field,
    audit_floor_field,
    check_at_least,
    check_loop,
    check_loop_arms,
    check_run_dir_options,
    check_stall,
    check_stall_arms,
    doc,
    loop_field,
    stall_field,
    stall_from_field,
)
from srollout.core.gate import check_step
from srollout.errors import SrolloutError

# --- collect (the rollout engine, §3 data collection) ------------------------------------------

COLLECT_POLICIES = ("lm", "expert", "noisy-expert")
COLLECT_BACKENDS = ("transformers", "vllm", "vllm-server")
GATE_RULES = ("r1", "r3")
# `--quick`: a one-minute look (groups and T_max not given explicitly take these).
QUICK_GROUPS = 8
QUICK_T_MAX = 15


def _check_group_size(G: int) -> None:
    if G < 2:
        raise SrolloutError(f"--G must be >= 2 (a group of one has no reward variance), got {G}")


def _check_concurrency(concurrency: int, G: int) -> None:
    from srollout.rollout.settings import check_concurrency

    check_concurrency(concurrency, G)


def _check_gate(cfg: Any) -> None:
    """The gate options: --gate's file, or --K / --d-L / --rule / --t-high (None: not given)."""
    if cfg.gate is not None and not Path(cfg.gate).is_file():
        raise SrolloutError(f"--gate {cfg.gate}: no such file")
    if cfg.K is not None:
        _check_K((cfg.K,), "--K")
    if cfg.d_L is not None:
        _check_unit((cfg.d_L,), "--d-L")
    _check_choice(cfg.rule, GATE_RULES, "--rule")
    if cfg.t_high is not None:
        _check_unit((cfg.t_high,), "--t-high")
    if cfg.rule == "r3" and cfg.t_high is None and cfg.gate is None:
        raise SrolloutError("--rule r3 needs --t-high")


def _check_backend(backend: str, base_url: str | None) -> None:
    _check_choice(backend, COLLECT_BACKENDS, "--backend")
    if (backend == "vllm-server") != (base_url is not None):
        raise SrolloutError(
            "--base-url goes with --backend vllm-server, and --backend vllm-server needs --base-url"
        )


@dataclass(frozen=True)
class RolloutOptions:
    """The rollout options of ``collect`` and ``ab-rollout``, and their checks; a stage's config
    extends it, restating a field only for its own default or help. ``TrainOnpolicyConfig`` does
    not: its rollout fields come from a preset, with a concrete K and d_L."""

    groups: int = doc(
        100,
        "Groups (tasks) to roll out; group i plays task i of the task set, "
        "repeated with fresh seeds past its end.",
    )
    G: int = doc(PAPER_G, "Trajectories per group (group size G).")
    T_max: int = doc(
        PAPER_T_MAX,
        "Step limit per trajectory (T_max); a trajectory that reaches it "
        "ends with ended_by=max_steps.",
    )
    temperature: float = doc(PAPER_TEMPERATURE, "Sampling temperature of the LM policy (>= 0).")
    top_p: float = doc(1.0, "Nucleus sampling top-p of the LM policy, in (0, 1].")
    seed: int = doc(
        0,
        "Run seed; every trajectory's sampling and environment seeds derive from "
        "(seed, group, traj_idx).",
    )
    model: Path | None = doc(
        None,
        "Local Hugging Face causal-LM directory, or `default`: the "
        "default policy the package ships.",
    )
    adapter: Path | None = doc(None, "LoRA adapter directory (peft) to load on top of --model.")
    backend: str = doc(
        "auto",
        "LM backend: transformers, vllm (in this process; `make setup-vllm`), vllm-server (a "
        "running server at --base-url) or auto: vllm for the smollm2 models where installed "
        "(their fastest), else transformers.",
    )
    base_url: str | None = doc(
        None, "URL of the vLLM server for --backend vllm-server, e.g. http://127.0.0.1:8000."
    )
    tasks: str = doc(
        "eval",
        "Task set to draw groups from: train, eval or heldout (generated), or "
        "an official ALFWorld split when $ALFWORLD_DATA is set.",
    )
    difficulty: str = doc(
        "small",
        "Room size of the generated task sets: small (<= 6 receptacles; the default policy's), "
        "medium (10), large (16) or full (the whole FloorPlan); official splits have their own "
        "rooms.",
    )
    policy: str = doc(
        "lm",
        "Who acts: lm (the model), expert (the planner) or noisy-expert (the "
        "planner with --eps random actions).",
    )
    eps: float = doc(
        0.3,
        "Probability, in [0, 1], of a random admissible action per step for --policy noisy-expert.",
    )
    gate: Path | None = doc(
        None,
        "gate.json (from `srollout sweep`) to apply at its step K; off "
        "by default, so outcomes are complete.",
    )
    K: int | None = doc(
        None, "Turn the gate on at step K (with d_L 0.12 and rule r1 unless given)."
    )
    d_L: float | None = doc(
        None,
        "Gate threshold d_L in [0, 1]: cut a group iff d_K < d_L (rule r1); turns the gate on.",
    )
    rule: str = doc("r1", "Gate rule: r1 (d_K < d_L) or r3 (d_K < d_L or tau_K >= t_high).")
    t_high: float | None = doc(None, "Termination-fraction threshold t_high in [0, 1] of rule r3.")
    signal_K: tuple[int, ...] = doc(
        PAPER_K_VALUES,
        "Steps K at which the seven signals are "
        "recorded for every group (comma list; K > T_max is dropped).",
    )
    concurrency: int = doc(
        64, "Most trajectories in flight at once (a new group starts when G slots are free)."
    )
    env: str = doc(
        "alfworld",
        "Environment to roll out in: alfworld (built in), a name registered with "
        "srollout.envs.registry.register_env or an entry point of group srollout.envs, or "
        "package.module:attr (an EnvSpec); --tasks then names one of its task sets.",
    )
    audit: float = audit_field("chunks of groups", stops=True)
    audit_floor: float = audit_floor_field()
    stall: int = stall_field()
    stall_from: int = stall_from_field()
    loop: int = loop_field()

    def __post_init__(self) -> None:
        self._check_rollout()

    def _check_rollout(self) -> None:
        """Every rollout option; the gate is --gate or --K/--d-L/--rule/--t-high."""
        _check_seed(self.seed)
        check_at_least(self, groups=1)
        _check_group_size(self.G)
        check_at_least(self, T_max=1)
        if not self.temperature >= 0.0:
            raise SrolloutError(f"--temperature must be >= 0, got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise SrolloutError(f"--top-p must lie in (0, 1], got {self.top_p}")
        _check_choice(self.policy, COLLECT_POLICIES, "--policy")
        if self.backend == "auto":  # resolved here, so a run's manifest names the backend it used
            from srollout.policy.named import default_backend

            object.__setattr__(self, "backend", default_backend(self.model))
        _check_backend(self.backend, self.base_url)
        _check_unit((self.eps,), "--eps")
        from srollout.envs.gen import DIFFICULTIES
        from srollout.envs.tasks import OFFICIAL_SPLITS

        _check_choice(self.difficulty, DIFFICULTIES, "--difficulty")
        if not self.env.strip():
            raise SrolloutError("--env must name an environment (default alfworld)")
        if self.difficulty != "small" and self.tasks in OFFICIAL_SPLITS:
            raise SrolloutError(
                f"--difficulty sizes the generated task sets; the official split {self.tasks!r} "
                "has its own rooms"
            )
        from srollout.policy.named import check_model_arg

        check_model_arg(self.model)
        if self.adapter is not None and not Path(self.adapter).is_dir():
            raise SrolloutError(f"--adapter {self.adapter}: no such adapter directory")
        explicit = self.K is not None or self.d_L is not None or self.t_high is not None
        if self.gate is not None and explicit:
            raise SrolloutError("give either --gate gate.json or --K/--d-L/--t-high, not both")
        _check_gate(self)
        if self.K is not None:
            check_step(self.K, self.T_max)
        from srollout.core.audit import check_audit_options

        check_audit_options(self.audit, self.audit_floor)
        # --stall beside a stall gate.json in --gate is the plan's to refuse: it reads the file
        # once (srollout.stages.rollout_setup.plan_gates)
        check_stall(self.stall, self.stall_from, self.T_max)
        check_loop(self.loop, self.T_max)
        _check_K(tuple(self.signal_K), "--signal-K")
        _check_concurrency(self.concurrency, self.G)

    @property
    def gate_given(self) -> bool:
        """A gate of either scope is asked for: --gate, --K, --d-L, --t-high, --rule r3 or
        --stall or --loop (which one runs is the plan's to say: it reads --gate's file)."""
        explicit = (self.K, self.d_L, self.t_high) != (None, None, None)
        trajectory = self.stall > 0 or self.loop > 0
        return explicit or self.rule != "r1" or self.gate is not None or trajectory


@dataclass(frozen=True)
class CollectConfig(RolloutOptions, Resumable):
    """`srollout collect`: roll out G trajectories per task; record steps, outcomes and signals."""

    # base_url: a server may move between runs
    RESUME_SKIP = frozenset({"out", "overwrite", "resume", "concurrency", "base_url"})

    out: Path | None = doc(None, "Run directory to write (default runs/collect-<UTC timestamp>).")
    overwrite: bool = doc(False, "Replace --out if it already exists.")
    resume: bool = doc(
        False, "Continue the run in --out: finished groups are kept, the rest rolled out."
    )
    quick: bool = doc(
        False,
        f"A one-minute look: {QUICK_GROUPS} groups and T_max {QUICK_T_MAX} unless "
        "given explicitly.",
    )
    shadow: bool = doc(
        False,
        "Run the gates in shadow: ask the group gate (--gate, --K, --d-L) and the trajectory gate "
        "(--stall, or a gate-stall.json) where they would act and record it "
        "(groups.shadow_cut_step, trajectories.shadow_stop_step), cutting and stopping nothing; "
        "the report scores every decision by the full outcome.",
    )

    def __post_init__(self) -> None:
        self._check_rollout()
        check_run_dir_options(self)
        if self.loop and self.stall:
            raise SrolloutError("give either --stall W or --loop K0: one trajectory gate per run")
        if self.loop and self.audit > 0:
            raise SrolloutError(
                "--audit moves a gate's threshold; the loop detector (--loop) has none to move"
            )
        if self.audit > 0 and not self.gate_given:
            raise SrolloutError(
                "--audit audits a gate's cuts and stops: turn one on (--gate, --K, --d-L or "
                "--stall)"
            )
        if self.shadow and not self.gate_given:
            raise SrolloutError(
                "--shadow records what a gate would do: give one (--gate, --K, --d-L or --stall)"
            )
        if self.shadow and self.audit > 0:
            raise SrolloutError(
                "--shadow cuts nothing, so there is nothing for --audit to audit: give one of them"
            )


# --- ab-rollout (Tier 1: the matched-seed wall-clock A/B, paper §5.1) --------------------------

# The default task count: 24 tasks of `eval` x 2 arms at G=8, T_max=30 is what the embedded
# default policy rolls out in <= 30 min on 2 CPU cores (docs/ab-rollout.md has the arithmetic).
AB_GROUPS = 24
AB_BLOCKS = 2
AB_ARMS = ("baseline", "gated")


@dataclass(frozen=True)
class AbRolloutConfig(RolloutOptions, Resumable):
    """`srollout ab-rollout`: the same tasks and seeds rolled out with and without the gate
    (:class:`RolloutOptions`, some restated with the A/B's own default or help)."""

    # the report's knobs (n_boot, figures) and --warmup may change on --resume
    RESUME_SKIP = frozenset("out overwrite resume n_boot figures warmup base_url".split())

    groups: int = doc(
        AB_GROUPS,
        "Tasks (groups) per arm; group i plays task i of the task set, "
        "with the same seeds in every arm.",
    )
    tasks: str = doc(
        "eval",
        "Task set to draw the tasks from: train, eval or heldout (generated), "
        "or an official ALFWorld split when $ALFWORLD_DATA is set.",
    )
    T_max: int = doc(PAPER_T_MAX, "Step limit per trajectory (T_max).")
    seed: int = doc(
        0,
        "Run seed; every trajectory's seeds derive from (seed, group, traj_idx), "
        "identical in every arm.",
    )
    gate: Path | None = doc(
        None,
        "gate.json (from `srollout sweep`) for the gated arm; default: "
        "rule r1 at (K, d_L) = (10, 0.12).",
    )
    K: int | None = doc(None, "Gate step K of the gated arm (default 10).")
    d_L: float | None = doc(
        None,
        "Gate threshold d_L in [0, 1] of the gated arm: cut a group iff d_K < d_L (default 0.12).",
    )
    repeats: int = doc(
        3,
        "Repeat the whole A/B R times with the same seeds, the arms swapping "
        "order every repeat; the wall-clock CI is over the blocks × repeats timed "
        "pairs (default 2 × 3 = 6).",
    )
    blocks: int = doc(
        AB_BLOCKS,
        "Blocks of tasks per repeat; the arms alternate over blocks in "
        "ABBA order, so machine drift favours neither.",
    )
    concurrency: int = doc(
        64,
        "Most trajectories in flight at once, the same in every arm (a "
        "group starts when G slots are free).",
    )
    warmup: bool = doc(
        True,
        "Before timing, load every task's game and roll a throw-away batch to "
        "T_max, so neither arm pays start-up costs.",
    )
    n_boot: int = doc(
        1_000, "Bootstrap resamples over tasks for the confidence intervals (the paper used 1,000)."
    )
    figures: bool = doc(True, "Save the PNG figures (per-task time by arm, the saving decomposed).")
    out: Path | None = doc(
        None, "Run directory to write (default runs/ab-rollout-<UTC timestamp>)."
    )
    overwrite: bool = doc(False, "Replace --out if it already exists.")
    resume: bool = doc(
        False,
        "Continue the run in --out: finished (arm, repeat, block) runs are "
        "kept with their timings.",
    )
    quick: bool = doc(
        False,
        f"A short look: {QUICK_GROUPS} tasks and T_max {QUICK_T_MAX} unless given explicitly.",
    )
    arms: tuple[str, ...] = doc(
        AB_ARMS,
        "Arms to compare (comma list of baseline, gated, dapo, greso, gated+dapo, gated+greso, "
        "stall, gated+stall, stall+dapo, stall+greso; a skip part of another package, entry "
        "point group srollout.arms, stands where greso does); baseline is required.",
    )
    audit: float = audit_field("an arm's timed runs, in schedule order", stops=True)
    dapo_max_rounds: int = doc(
        3,
        "DAPO arms: most extra rollout rounds per block, after which the "
        "block keeps the useful groups it has.",
    )
    greso_p_explore: float = doc(
        0.5,
        "GRESO arms: a task whose last z groups were zero-variance "
        "is still rolled out with probability p^z.",
    )
    greso_history: Path | None = doc(
        None,
        "GRESO arms: groups.parquet (or a run directory holding "
        "one) counted as each task's history before repeat 0.",
    )

    def __post_init__(self) -> None:
        self._check_rollout()
        if self.rule == "r1" and self.t_high is not None:
            raise SrolloutError("--t-high is only used by --rule r3")
        check_at_least(self, repeats=1, n_boot=1, dapo_max_rounds=0)
        if not 1 <= self.blocks <= self.groups:
            raise SrolloutError(
                f"--blocks must lie in [1, --groups={self.groups}], got {self.blocks}"
            )
        check_run_dir_options(self)
        from srollout.core.arms import parse_arms

        try:
            parsed = parse_arms(tuple(self.arms))
        except SrolloutError as err:
            raise SrolloutError(f"--arms: {err}") from None
        names = tuple(a.name for a in parsed)
        if "baseline" not in names:
            raise SrolloutError(
                "--arms must include baseline (every arm is judged against it), got "
                f"{','.join(names)!r}"
            )
        check_loop_arms(self.loop, self.stall, self.stall_from, parsed, self.audit)
        check_stall_arms(self.stall, parsed)  # a stall gate.json: the plan's (plan_gates)
        object.__setattr__(self, "arms", ("baseline", *(n for n in names if n != "baseline")))
        if self.audit > 0 and not any(a.gate or a.stall for a in parsed):
            raise SrolloutError(
                "--audit audits a gated arm's cuts and a stall arm's stops: --arms has neither "
                "(add gated, stall, or one of their combinations)"
            )
        _check_unit((self.greso_p_explore,), "--greso-p-explore")
        if self.greso_history is not None and not Path(self.greso_history).exists():
            raise SrolloutError(f"--greso-history {self.greso_history}: no such file or directory")


@dataclass(frozen=True)
class DistConfig:
    """`--workers N`: scale out on Ray (extra `dist`); not part of a run's resume key."""

    workers: int = doc(
        1,
        "Parallel workers: 1 runs in this process; N > 1 runs on Ray (extra "
        "`dist`), in $RAY_ADDRESS or a local cluster of N CPUs.",
    )
    chunk_groups: int | None = doc(
        None,
        "Groups a rollout worker takes at a time (default: twice "
        "its groups in flight, concurrency // G).",
    )

    def __post_init__(self) -> None:
        check_at_least(self, workers=1)
        if self.chunk_groups is not None and self.chunk_groups < 1:
            raise SrolloutError(f"chunk_groups must be >= 1, got {self.chunk_groups}")


@dataclass(frozen=True)
class ServeConfig:
    """`srollout serve`: a vLLM server, the server side of ``--backend vllm-server``."""

    model: str = doc("default", "`default` or a local Hugging Face model directory.")
    host: str = doc("127.0.0.1", "Address to listen on.")
    port: int = doc(8000, "Port to listen on.")
    lora: bool = doc(
        False, "Serve LoRA adapters loaded at run time (on-policy training); costs throughput."
    )
    dry_run: bool = doc(False, "Print the command instead of running it.")

    def __post_init__(self) -> None:
        if isinstance(self.port, bool) or not 0 < self.port < 65536:
            raise SrolloutError(f"--port must lie in 1..65535, got {self.port}")
