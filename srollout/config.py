"""One frozen dataclass per stage. Defaults are the paper's.

Each field is documented once, in the ``metadata["help"]`` of the field; the Typer options of
``srollout.cli`` take their help text from there (``help_for``), so CLI and library agree.
Paper defaults: K=10, d_L=0.12, G=8, T_max=30, temperature 0.7, precision floor 0.80.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from srollout.errors import SrolloutError

# The paper's operating point and rollout settings (Table "Hyperparameters").
PAPER_K = 10
PAPER_D_L = 0.12
PAPER_G = 8
PAPER_T_MAX = 30
PAPER_TEMPERATURE = 0.7
PAPER_PRECISION_FLOOR = 0.80
PAPER_K_VALUES = (5, 10, 15, 20)


def doc(default: Any, help: str, **kw: Any) -> Any:
    """A dataclass field with its help text attached."""
    if isinstance(default, (list, dict, set)):
        return field(default_factory=lambda: type(default)(default), metadata={"help": help}, **kw)
    return field(default=default, metadata={"help": help}, **kw)


def help_for(config_cls: type, name: str) -> str:
    """The help text of ``config_cls.name`` (used by the CLI option of the same name)."""
    for f in dataclasses.fields(config_cls):
        if f.name == name:
            return f.metadata.get("help", "")
    raise KeyError(f"{config_cls.__name__} has no field {name}")


# --- stage configs are appended below, one frozen dataclass per stage -------------------------


# --- analyze / sweep (offline stages of §4.2–4.4) ----------------------------------------------


def _check_K(values: tuple[int, ...], option: str) -> None:
    if not values:
        raise SrolloutError(f"{option}: give at least one K")
    bad = [k for k in values if k < 1]
    if bad:
        raise SrolloutError(f"{option}: K must be >= 1, got {bad[0]}")


def _check_unit(values: tuple[float, ...], option: str) -> None:
    bad = [v for v in values if not 0.0 <= v <= 1.0]
    if bad:
        raise SrolloutError(f"{option}: values must lie in [0, 1], got {bad[0]:g}")


def _check_choice(value: str, choices: Any, option: str) -> None:
    if value not in choices:
        raise SrolloutError(f"{option}: expected one of {', '.join(choices)}, got {value!r}")


@dataclass(frozen=True)
class AnalyzeConfig:
    """`srollout analyze`: how well mid-rollout divergence predicts zero-variance groups."""

    input: Path = doc(Path("."), "A run directory, a steps.parquet or a signals.parquet (made by "
                      "anyone).")
    K: tuple[int, ...] | None = doc(None, "Steps K at which to compute the signals (comma list); "
                                    "default 5,10,15,20, or every K present in a signals table.")
    gate_K: int = doc(PAPER_K, "Step K of the gate used for the false-positive listing and the d_K "
                      "figures.")
    d_L: float = doc(PAPER_D_L, "Threshold d_L in [0, 1] of that gate (rule r1: cut iff d_K < "
                     "d_L).")
    seed: int = doc(0, "Seed of the G=8 sub-samples drawn from larger groups (App. G16 panel).")
    figures: bool = doc(True, "Save the PNG figures (heatmap, d_K histogram by label, d_K vs "
                        "reward variance).")
    out: Path | None = doc(None, "Run directory to write (default runs/analyze-<UTC timestamp>).")
    overwrite: bool = doc(False, "Replace --out if it already exists.")

    def __post_init__(self) -> None:
        if self.K is not None:
            _check_K(tuple(self.K), "--K")
        _check_K((self.gate_K,), "--gate-K")
        _check_unit((self.d_L,), "--d-L")


SWEEP_RULES = ("r1", "r3", "both")


@dataclass(frozen=True)
class SweepConfig:
    """`srollout sweep`: sweep gate thresholds; choose an operating point with a precision floor."""

    input: Path = doc(Path("."), "A run directory, a steps.parquet or a signals.parquet (made by "
                      "anyone).")
    K: tuple[int, ...] = doc((PAPER_K,), "Gate step(s) K to sweep (one or a comma list).")
    d_L_grid: tuple[float, ...] = doc(tuple(round(0.05 + 0.01 * i, 10) for i in range(14)),
                                      "Grid of d_L thresholds: start:stop:step (stop included) or "
                                      "a comma list.")
    rule: str = doc("r1", "Gate rule: r1 (d_K < d_L), r3 (d_K < d_L or tau_K >= t_high) or both.")
    t_high_grid: tuple[float, ...] = doc((0.8, 0.9, 1.0), "Grid of t_high for r3: start:stop:step "
                                         "(stop included) or a comma list.")
    T_max: int = doc(PAPER_T_MAX, "Rollout horizon T_max (steps) of the paper's savings formulas.")
    precision_floor: float = doc(PAPER_PRECISION_FLOOR, "Smallest precision (TP / cuts, in [0, 1]) "
                                 "an operating point may have.")
    n_boot: int = doc(10_000, "Bootstrap resamples (over groups) for the chosen point's confidence "
                      "intervals.")
    seed: int = doc(0, "Seed of the bootstrap (and of the --learned/--adaptive folds).")
    out: Path | None = doc(None, "Run directory to write (default runs/sweep-<UTC timestamp>).")
    overwrite: bool = doc(False, "Replace --out if it already exists.")

    def __post_init__(self) -> None:
        _check_K(tuple(self.K), "--K")
        if not self.d_L_grid:
            raise SrolloutError("--d-L-grid: the grid is empty")
        _check_unit(tuple(self.d_L_grid), "--d-L-grid")
        _check_choice(self.rule, SWEEP_RULES, "--rule")
        if self.rule != "r1":
            if not self.t_high_grid:
                raise SrolloutError("--t-high-grid: the grid is empty")
            _check_unit(tuple(self.t_high_grid), "--t-high-grid")
        if self.T_max < 1:
            raise SrolloutError(f"--T-max must be >= 1, got {self.T_max}")
        too_late = [k for k in self.K if k > self.T_max]
        if too_late:
            raise SrolloutError(f"--K {too_late[0]} is larger than --T-max {self.T_max}")
        _check_unit((self.precision_floor,), "--precision-floor")
        if self.n_boot < 1:
            raise SrolloutError("--n-boot must be >= 1")


def parse_int_list(text: str, option: str) -> tuple[int, ...]:
    """``"5,10,15"`` -> ``(5, 10, 15)``; one clear SrolloutError on anything else."""
    parts = [p.strip() for p in str(text).split(",")]
    try:
        values = tuple(int(p) for p in parts)
    except ValueError:
        raise SrolloutError(
            f"{option}: expected integers separated by commas, got {text!r}"
        ) from None
    if len(set(values)) != len(values):
        raise SrolloutError(f"{option}: repeated value in {text!r}")
    return values


def parse_grid(text: str, option: str) -> tuple[float, ...]:
    """A float grid: ``"start:stop:step"`` (stop included within float tolerance) or ``"a,b,c"``.

    ``"0.05:0.18:0.01"`` -> (0.05, 0.06, ..., 0.18), 14 values, each rounded to 10 decimals so
    that 0.05 + 7*0.01 prints (and compares) as 0.12. Raises SrolloutError naming ``option``.
    """
    text = str(text).strip()
    malformed = (
        f"{option}: malformed grid {text!r}; use start:stop:step (e.g. 0.05:0.18:0.01) "
        "or a comma list"
    )
    try:
        if ":" in text:
            parts = text.split(":")
            if len(parts) != 3:
                raise SrolloutError(malformed)
            start, stop, step = (float(p) for p in parts)
            if not step > 0 or stop < start or not all(map(_finite, (start, stop, step))):
                raise SrolloutError(malformed)
            n = int((stop - start) / step + 1e-9) + 1
            if n > 100_000:
                raise SrolloutError(f"{option}: grid {text!r} has {n} points; use a coarser step")
            values = [round(start + i * step, 10) for i in range(n)]
        else:
            values = [float(p) for p in text.split(",")]
            if not all(map(_finite, values)):
                raise SrolloutError(malformed)
    except ValueError:
        raise SrolloutError(malformed) from None
    if len(set(values)) != len(values):
        raise SrolloutError(f"{option}: repeated value in {text!r}")
    return tuple(values)


def _finite(x: float) -> bool:
    return x == x and abs(x) != float("inf")


# --- collect (the rollout engine, §3 data collection) ------------------------------------------

COLLECT_POLICIES = ("lm", "expert", "noisy-expert")
COLLECT_BACKENDS = ("transformers", "vllm", "vllm-server")
GATE_RULES = ("r1", "r3")
ROLLOUT_POLICIES = COLLECT_POLICIES
# `--quick`: a one-minute look (groups and T_max not given explicitly take these).
QUICK_GROUPS = 8
QUICK_T_MAX = 15


DIFFICULTY_HELP = (
    "Room size of the generated task sets: small (<= 6 receptacles; the default policy's), medium "
    "(10), large (16) or full (the whole FloorPlan); official splits have their own rooms."
)


def _check_group_size(G: int) -> None:
    if G < 2:
        raise SrolloutError(f"--G must be >= 2 (a group of one has no reward variance), got {G}")


def _check_concurrency(concurrency: int, G: int) -> None:
    if concurrency < G:
        raise SrolloutError(
            f"--concurrency ({concurrency}) must be >= --G ({G}): a group starts "
            "only when all G trajectories fit"
        )


def _check_backend(backend: str, base_url: str | None) -> None:
    _check_choice(backend, COLLECT_BACKENDS, "--backend")
    if (backend == "vllm-server") != (base_url is not None):
        raise SrolloutError(
            "--base-url goes with --backend vllm-server, and --backend vllm-server needs "
            "--base-url"
        )


@dataclass(frozen=True)
class RolloutOptions:
    """The rollout options shared by every stage that rolls groups out (``collect``,
    ``ab-rollout``): sizes, sampling, who acts, the model, the task set, the gate, the recorded
    signals, the concurrency, and their checks. A stage's config extends it, restating a field only
    to give it its own default or help. The CLI declares them once
    (``srollout.cli.rollout_options``) and ``srollout.stages.rollout_setup`` builds tasks,
    policy, environments and gate from them.
    ``TrainOnpolicyConfig`` does not extend it: its rollout fields come from a preset, with a
    concrete K and d_L and no seed, policy kind or task set of this kind.
    """

    groups: int = doc(100, "Groups (tasks) to roll out; group i plays task i of the task set, "
                      "repeated with fresh seeds past its end.")
    G: int = doc(PAPER_G, "Trajectories per group (group size G).")
    T_max: int = doc(PAPER_T_MAX, "Step limit per trajectory (T_max); a trajectory that reaches it "
                     "ends with ended_by=max_steps.")
    temperature: float = doc(PAPER_TEMPERATURE, "Sampling temperature of the LM policy (>= 0).")
    top_p: float = doc(1.0, "Nucleus sampling top-p of the LM policy, in (0, 1].")
    seed: int = doc(0, "Run seed; every trajectory's sampling and environment seeds derive from "
                    "(seed, group, traj_idx).")
    model: Path | None = doc(None, "Local Hugging Face causal-LM directory, or `default`: the "
                             "default policy the package ships.")
    adapter: Path | None = doc(None, "LoRA adapter directory (peft) to load on top of --model.")
    backend: str = doc("transformers", "LM backend: transformers, vllm (in this process; `make "
                       "setup-vllm`) or vllm-server (a running server at --base-url).")
    base_url: str | None = doc(None, "URL of the vLLM server for --backend vllm-server, e.g. "
                               "http://127.0.0.1:8000.")
    tasks: str = doc("eval", "Task set to draw groups from: train, eval or heldout (generated), or "
                     "an official ALFWorld split when $ALFWORLD_DATA is set.")
    difficulty: str = doc("small", DIFFICULTY_HELP)
    policy: str = doc("lm", "Who acts: lm (the model), expert (the planner) or noisy-expert (the "
                      "planner with --eps random actions).")
    eps: float = doc(0.3, "Probability, in [0, 1], of a random admissible action per step for "
                     "--policy noisy-expert.")
    gate: Path | None = doc(None, "gate.json (from `srollout sweep`) to apply at its step K; off "
                            "by default, so outcomes are complete.")
    K: int | None = doc(None, "Turn the gate on at step K (with d_L 0.12 and rule r1 unless "
                        "given).")
    d_L: float | None = doc(None, "Gate threshold d_L in [0, 1]: cut a group iff d_K < d_L (rule "
                            "r1); turns the gate on.")
    rule: str = doc("r1", "Gate rule: r1 (d_K < d_L) or r3 (d_K < d_L or tau_K >= t_high).")
    t_high: float | None = doc(None, "Termination-fraction threshold t_high in [0, 1] of rule r3.")
    signal_K: tuple[int, ...] = doc(PAPER_K_VALUES, "Steps K at which the seven signals are "
                                    "recorded for every group (comma list; K > T_max is dropped).")
    concurrency: int = doc(64, "Most trajectories in flight at once (a new group starts when G "
                           "slots are free).")

    def __post_init__(self) -> None:
        self._check_rollout()

    def _check_rollout(self) -> None:
        """Sizes, sampling, who acts, the model, the gate (--gate or --K/--d-L/--rule/--t-high)."""
        if self.groups < 1:
            raise SrolloutError(f"--groups must be >= 1, got {self.groups}")
        _check_group_size(self.G)
        if self.T_max < 1:
            raise SrolloutError(f"--T-max must be >= 1, got {self.T_max}")
        if not self.temperature >= 0.0:
            raise SrolloutError(f"--temperature must be >= 0, got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise SrolloutError(f"--top-p must lie in (0, 1], got {self.top_p}")
        _check_choice(self.policy, ROLLOUT_POLICIES, "--policy")
        _check_backend(self.backend, self.base_url)
        _check_unit((self.eps,), "--eps")
        from srollout.envs.gen import DIFFICULTIES
        from srollout.envs.tasks import OFFICIAL_SPLITS

        _check_choice(self.difficulty, DIFFICULTIES, "--difficulty")
        if self.difficulty != "small" and self.tasks in OFFICIAL_SPLITS:
            raise SrolloutError(
                f"--difficulty sizes the generated task sets; the official split {self.tasks!r} "
                "has its own rooms"
            )
        if self.model is not None and str(self.model) != "default":
            if not Path(self.model).is_dir():
                raise SrolloutError(f"--model {self.model}: no such model directory")
        if self.adapter is not None and not Path(self.adapter).is_dir():
            raise SrolloutError(f"--adapter {self.adapter}: no such adapter directory")
        explicit = self.K is not None or self.d_L is not None or self.t_high is not None
        if self.gate is not None and explicit:
            raise SrolloutError("give either --gate gate.json or --K/--d-L/--t-high, not both")
        if self.gate is not None and not Path(self.gate).is_file():
            raise SrolloutError(f"--gate {self.gate}: no such file")
        if self.K is not None:
            _check_K((self.K,), "--K")
            if self.K > self.T_max:
                raise SrolloutError(f"--K {self.K} is larger than --T-max {self.T_max}")
        if self.d_L is not None:
            _check_unit((self.d_L,), "--d-L")
        _check_choice(self.rule, GATE_RULES, "--rule")
        if self.t_high is not None:
            _check_unit((self.t_high,), "--t-high")
        if self.rule == "r3" and self.t_high is None and self.gate is None:
            raise SrolloutError("--rule r3 needs --t-high")


@dataclass(frozen=True)
class CollectConfig(RolloutOptions):
    """`srollout collect`: roll out G trajectories per task; record steps, outcomes and signals."""

    out: Path | None = doc(None, "Run directory to write (default runs/collect-<UTC timestamp>).")
    overwrite: bool = doc(False, "Replace --out if it already exists.")
    resume: bool = doc(False, "Continue the run in --out: finished groups are kept, the rest "
                       "rolled out.")
    quick: bool = doc(False,
                      f"A one-minute look: {QUICK_GROUPS} groups and T_max {QUICK_T_MAX} unless "
                      "given explicitly.")

    def __post_init__(self) -> None:
        self._check_rollout()
        _check_K(tuple(self.signal_K), "--signal-K")
        _check_concurrency(self.concurrency, self.G)
        if self.overwrite and self.resume:
            raise SrolloutError("--overwrite and --resume exclude each other")

    @property
    def gate_on(self) -> bool:
        """The gate runs when a gate.json or any of --K / --d-L / --t-high / --rule r3 is given."""
        explicit = self.K is not None or self.d_L is not None or self.t_high is not None
        return self.gate is not None or explicit or self.rule != "r1"

    def resume_key(self) -> dict[str, Any]:
        """Fields that must match for --resume to continue a run (all but where/how to write)."""
        # base_url: a server may move between runs
        skip = {"out", "overwrite", "resume", "concurrency", "base_url"}
        fields = dataclasses.fields(self)
        return {f.name: getattr(self, f.name) for f in fields if f.name not in skip}


# --- train-offpolicy / train-onpolicy (GRPO with the gate, §5.2–5.4) ---------------------------

TRAIN_ARMS = ("baseline", "gated")
LOSS_DENOMINATOR_CHOICES = ("paper", "token_mean", "seq_mean", "constant")


def _check_training(cfg: Any) -> None:
    """Checks shared by both training configs (lr, LoRA, loss denominator, gate)."""
    if not cfg.lr > 0:
        raise SrolloutError(f"--lr must be > 0, got {cfg.lr}")
    if cfg.lora_r < 1 or cfg.lora_alpha < 1:
        raise SrolloutError(
            f"--lora-r and --lora-alpha must be >= 1, got {cfg.lora_r}, {cfg.lora_alpha}"
        )
    if not cfg.lora_targets:
        raise SrolloutError("--lora-targets: give at least one module name")
    _check_choice(cfg.denominator, LOSS_DENOMINATOR_CHOICES, "--denominator")
    if cfg.denominator == "constant" and not (cfg.denominator_constant or 0) > 0:
        raise SrolloutError("--denominator constant needs --denominator-constant > 0")
    if cfg.clip_eps is not None and not 0 < cfg.clip_eps < 1:
        raise SrolloutError(f"--clip-eps must lie in (0, 1), got {cfg.clip_eps}")
    if cfg.kl_coef < 0:
        raise SrolloutError(f"--kl-coef must be >= 0, got {cfg.kl_coef}")
    if cfg.micro_batch < 1:
        raise SrolloutError(f"--micro-batch must be >= 1, got {cfg.micro_batch}")
    _check_K((cfg.K,), "--K")
    _check_unit((cfg.d_L,), "--d-L")
    _check_choice(cfg.rule, GATE_RULES, "--rule")
    if cfg.rule == "r3" and cfg.t_high is None and cfg.gate is None:
        raise SrolloutError("--rule r3 needs --t-high")
    if cfg.t_high is not None:
        _check_unit((cfg.t_high,), "--t-high")
    if cfg.gate is not None and not Path(cfg.gate).is_file():
        raise SrolloutError(f"--gate {cfg.gate}: no such file")
    if cfg.model is not None and str(cfg.model) != "default" and not Path(cfg.model).is_dir():
        raise SrolloutError(f"--model {cfg.model}: no such model directory")


@dataclass(frozen=True)
class TrainOffpolicyConfig:
    """`srollout train-offpolicy`: GRPO on a fixed collected buffer, baseline vs gated (Tier 2)."""

    buffer: Path = doc(Path("."), "A `collect` run directory (un-gated, LM policy: trajectories "
                       "with token_ids/action_mask).")
    steps: int = doc(20, "GRPO steps per arm.")
    groups_per_step: int = doc(4, "Groups sampled from the buffer per step (the same groups in "
                               "both arms).")
    turns_per_traj: int = doc(8, "Most action turns sampled per trajectory (an item is one "
                              "trajectory x one action turn).")
    max_items: int = doc(128, "Most items per step; turns per trajectory = min(--turns-per-traj, "
                         "max_items // (groups_per_step*G)), so 256 gives the paper's 8.")
    lr: float = doc(5e-5, "AdamW learning rate (paper: 5e-5).")
    lora_r: int = doc(8, "LoRA rank (paper Tier 2: 8).")
    lora_alpha: int = doc(16, "LoRA alpha (paper Tier 2: 16).")
    lora_targets: tuple[str, ...] = doc(("q_proj", "v_proj"), "LoRA target modules (comma list; "
                                        "paper Tier 2: q_proj,v_proj).")
    denominator: str = doc("paper", "Loss denominator: paper (1/N trajectories), token_mean, "
                           "seq_mean or constant.")
    denominator_constant: float | None = doc(None, "The constant of --denominator constant (Dr. "
                                             "GRPO style).")
    clip_eps: float | None = doc(None, "PPO ratio clipping epsilon in (0, 1) (off by default, as "
                                 "in the paper).")
    kl_coef: float = doc(0.0, "k3 KL coefficient to the base model (0 = off, as in the paper).")
    gate: Path | None = doc(None, "gate.json from `srollout sweep` (else --K/--d-L/--rule).")
    K: int = doc(PAPER_K, "Gate step K.")
    d_L: float = doc(PAPER_D_L, "Gate threshold d_L (rule r1: cut iff d_K < d_L).")
    rule: str = doc("r1", "Gate rule: r1 or r3.")
    t_high: float | None = doc(None, "Termination-fraction threshold of rule r3.")
    seed: int = doc(42, "Seed of the group/turn sampling and of the LoRA init (paper Tier 2: 42).")
    model: Path | None = doc(None, "Model directory the buffer was collected with (default: the "
                             "one in its manifest).")
    micro_batch: int = doc(8, "Trajectories per forward/backward chunk (gradients accumulate; the "
                           "step is the same).")
    out: Path | None = doc(None, "Run directory to write (default runs/train-offpolicy-<UTC "
                           "timestamp>).")
    overwrite: bool = doc(False, "Replace --out if it already exists.")

    def __post_init__(self) -> None:
        if not Path(self.buffer).is_dir():
            raise SrolloutError(
                f"BUFFER {self.buffer}: not a directory (give a `srollout collect` run directory)"
            )
        for name in ("steps", "groups_per_step", "turns_per_traj", "max_items"):
            if getattr(self, name) < 1:
                raise SrolloutError(
                    f"--{name.replace('_', '-')} must be >= 1, got {getattr(self, name)}"
                )
        _check_training(self)


# Presets of `train-onpolicy` (values a run takes unless an option is given explicitly).
ONPOLICY_PRESETS: dict[str, dict[str, Any]] = {
    # The paper's Tier 3: 60 iterations x 10 prompts, G=8, T_max=30, eval every 10 on 50 tasks.
    "paper": dict(iterations=60, prompts_per_iter=10, G=8, T_max=30, eval_every=10, n_eval=50,
                  train_tasks=1000, K=PAPER_K, lr=5e-5, max_new_tokens=64, denominator="paper"),
    # Fits 2 CPU cores with the embedded default policy (both arms of one seed in <= 45 min)
    # and learns; how it was chosen (seq_mean against the paper's denominator, 2026-11-24):
    # docs/training.md. Held-out = `eval`, the paper's valid_seen protocol.
    "default": dict(iterations=40, prompts_per_iter=8, G=8, T_max=20, eval_every=10, n_eval=100,
                    train_tasks=200, K=PAPER_K, lr=2e-4, max_new_tokens=48, denominator="seq_mean"),
    # Seconds, for tests and a first look (any model; T_max and K small).
    "tiny": dict(iterations=3, prompts_per_iter=2, G=4, T_max=4, eval_every=2, n_eval=3,
                 train_tasks=6, K=2, lr=1e-3, max_new_tokens=16, eval_set="heldout"),
}


@dataclass(frozen=True)
class TrainOnpolicyConfig:
    """`srollout train-onpolicy`: GRPO per seed, baseline vs gated, held-out eval (Tier 3)."""

    seeds: tuple[int, ...] = doc((7, 13, 23, 42), "Seeds (comma list); each runs both arms, one "
                                 "seed after another.")
    preset: str = doc("default", "Values of the options not given: default (2 CPU cores, default "
                      "policy), tiny (seconds) or paper (Tier 3).")
    iterations: int = doc(40, "On-policy iterations per arm.")
    prompts_per_iter: int = doc(8, "Prompts (groups) sampled per iteration (the same in both "
                                "arms).")
    G: int = doc(PAPER_G, "Trajectories per group.")
    T_max: int = doc(20, "Step limit per trajectory (training and evaluation).")
    temperature: float = doc(PAPER_TEMPERATURE, "Rollout sampling temperature (evaluation is "
                             "greedy).")
    eval_every: int = doc(10, "Greedy held-out evaluation every E iterations (and at iteration 0 "
                          "and the last).")
    n_eval: int = doc(100, "Held-out tasks evaluated (the first n of the held-out set).")
    train_tasks: int = doc(200, "Size of the training task pool prompts are sampled from.")
    train_set: str = doc("train", "Task set of the training prompts.")
    eval_set: str = doc("eval", "Task set of the held-out evaluation: eval (new tasks in the "
                        "training scenes, the paper's valid_seen) or heldout (unseen scenes).")
    lr: float = doc(2e-4, "AdamW learning rate (paper: 5e-5).")
    lora_r: int = doc(16, "LoRA rank (paper Tier 3: 16).")
    lora_alpha: int = doc(32, "LoRA alpha (paper Tier 3: 32).")
    lora_targets: tuple[str, ...] = doc(
        ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"),
        "LoRA target modules (comma list).",
    )
    denominator: str = doc("seq_mean", "Loss denominator: paper (1/N trajectories), token_mean, "
                           "seq_mean (each trajectory's mean token log-prob) or constant.")
    denominator_constant: float | None = doc(None, "The constant of --denominator constant.")
    clip_eps: float | None = doc(None, "PPO ratio clipping epsilon in (0, 1) (off by default).")
    kl_coef: float = doc(0.0, "k3 KL coefficient to the base model (off by default).")
    gate: Path | None = doc(None, "gate.json from `srollout sweep` (else --K/--d-L/--rule).")
    K: int = doc(PAPER_K, "Gate step K.")
    d_L: float = doc(PAPER_D_L, "Gate threshold d_L.")
    rule: str = doc("r1", "Gate rule: r1 or r3.")
    t_high: float | None = doc(None, "Termination-fraction threshold of rule r3.")
    model: Path | None = doc(None, "Local Hugging Face model directory, or default (the embedded "
                             "default policy).")
    backend: str = doc("transformers", "Rollout backend: transformers (the trained module), vllm "
                       "(in process) or vllm-server (--base-url; a `srollout serve --lora` "
                       "server).")
    base_url: str | None = doc(None, "URL of the vLLM server for --backend vllm-server.")
    max_new_tokens: int = doc(48, "Cap on the tokens of one response.")
    concurrency: int = doc(64, "Most trajectories in flight at once in the rollout engine.")
    micro_batch: int = doc(8, "Trajectories per forward/backward chunk.")
    arms: tuple[str, ...] = doc(TRAIN_ARMS, "Arms to run (comma list of baseline, gated, dapo, "
                                "greso, gated+dapo, gated+greso; docs/training.md).")
    dapo_max_rounds: int = doc(3, "DAPO arms: most extra sampling rounds per iteration, after "
                               "which it trains on the useful groups it has.")
    greso_p_explore: float = doc(0.5, "GRESO arms: a prompt whose last z groups were zero-variance "
                                 "is still rolled out with probability p^z.")
    interleave: bool = doc(True, "Run a seed's arms iteration by iteration, alternating which goes "
                           "first, so both see the same machine load.")
    out: Path | None = doc(None, "Run directory to write (default runs/train-onpolicy-<UTC "
                           "timestamp>).")
    overwrite: bool = doc(False, "Replace --out if it already exists.")
    resume: bool = doc(False, "Continue the run in --out from its last per-iteration checkpoints.")

    def __post_init__(self) -> None:
        if not self.seeds:
            raise SrolloutError("--seeds: give at least one seed")
        _check_choice(self.preset, ONPOLICY_PRESETS, "--preset")
        sizes = ("iterations", "prompts_per_iter", "eval_every", "n_eval", "train_tasks",
                 "max_new_tokens")
        for name in sizes:
            if getattr(self, name) < 1:
                raise SrolloutError(
                    f"--{name.replace('_', '-')} must be >= 1, got {getattr(self, name)}"
                )
        _check_group_size(self.G)
        if self.T_max < 1:
            raise SrolloutError(f"--T-max must be >= 1, got {self.T_max}")
        if self.K > self.T_max:
            raise SrolloutError(f"--K {self.K} is larger than --T-max {self.T_max}")
        if not self.temperature >= 0:
            raise SrolloutError(f"--temperature must be >= 0, got {self.temperature}")
        if self.concurrency < self.G:
            raise SrolloutError(f"--concurrency ({self.concurrency}) must be >= --G ({self.G})")
        from srollout.core.arms import parse_arms

        try:
            object.__setattr__(self, "arms", tuple(a.name for a in parse_arms(tuple(self.arms))))
        except SrolloutError as err:
            raise SrolloutError(f"--arms: {err}") from None
        if self.dapo_max_rounds < 0:
            raise SrolloutError(f"--dapo-max-rounds must be >= 0, got {self.dapo_max_rounds}")
        if not 0.0 <= self.greso_p_explore <= 1.0:
            raise SrolloutError(f"--greso-p-explore must lie in [0, 1], got {self.greso_p_explore}")
        if self.overwrite and self.resume:
            raise SrolloutError("--overwrite and --resume exclude each other")
        _check_backend(self.backend, self.base_url)
        _check_training(self)

    @classmethod
    def from_preset(cls, preset: str = "default", **overrides: Any) -> TrainOnpolicyConfig:
        """The preset's values, then every override that is not None."""
        _check_choice(preset, ONPOLICY_PRESETS, "--preset")
        given = {k: v for k, v in overrides.items() if v is not None}
        values = {**ONPOLICY_PRESETS[preset], **given}
        return cls(preset=preset, **values)

    def resume_key(self) -> dict[str, Any]:
        """Fields that must match for --resume (all but where/how to write and the seed list)."""
        skip = {"out", "overwrite", "resume", "seeds", "concurrency", "interleave", "base_url"}
        fields = dataclasses.fields(self)
        return {f.name: getattr(self, f.name) for f in fields if f.name not in skip}


def parse_seeds(text: str) -> tuple[int, ...]:
    """``"7,13,23,42"`` -> (7, 13, 23, 42): distinct integers >= 0, else one SrolloutError."""
    seeds = parse_int_list(text, "--seeds")
    if any(s < 0 for s in seeds):
        raise SrolloutError(f"--seeds: seeds must be >= 0, got {text!r}")
    return seeds


def parse_names(text: str, option: str) -> tuple[str, ...]:
    """``"q_proj, v_proj"`` -> ("q_proj", "v_proj"); empty items are an error."""
    names = tuple(p.strip() for p in str(text).split(","))
    if not names or any(not n for n in names):
        raise SrolloutError(f"{option}: expected names separated by commas, got {text!r}")
    return names


@dataclass(frozen=True)
class GateFitConfig:
    """`srollout sweep --learned/--adaptive`: gates fit on one set of groups, judged on another."""

    learned: bool = doc(False, "Also fit the learned gate (logistic regression on the seven "
                        "signals) and report it cross-fitted.")
    adaptive: bool = doc(False, "Also fit the adaptive-K gate (cut at the first confident check "
                         "step) and report it cross-fitted.")
    check_K: tuple[int, ...] = doc((5, 10, 15), "Check steps of the adaptive gate; the learned "
                                   "model is also trained on rows at these K.")
    n_folds: int = doc(5, "Folds (>= 2) of the cross-fitting over groups: every reported number is "
                       "a decision on a group nothing was fit on.")
    l2: float = doc(1.0, "L2 penalty λ (>= 0) of the logistic model, on standardised features with "
                    "the intercept unpenalised.")
    eval_buffer: Path | None = doc(None, "Judge the gates on this second buffer (fit on INPUT) "
                                   "instead of k-fold cross-fitting.")

    def __post_init__(self) -> None:
        _check_K(tuple(self.check_K), "--check-K")
        object.__setattr__(self, "check_K", tuple(sorted(set(self.check_K))))
        if isinstance(self.n_folds, bool) or not isinstance(self.n_folds, int) or self.n_folds < 2:
            raise SrolloutError(f"--n-folds must be an integer >= 2, got {self.n_folds!r}")
        if not (self.l2 >= 0 and self.l2 < float("inf")):
            raise SrolloutError(f"--l2 must be a finite number >= 0, got {self.l2}")

    @property
    def any(self) -> bool:
        return self.learned or self.adaptive


# --- ab-rollout (Tier 1: the matched-seed wall-clock A/B, paper §5.1) --------------------------

# The default task count: 24 tasks of `eval` x 2 arms at G=8, T_max=30 is what the embedded
# default policy rolls out in <= 30 min on 2 CPU cores (docs/ab-rollout.md has the arithmetic).
AB_GROUPS = 24
AB_BLOCKS = 2
AB_ARMS = ("baseline", "gated")


@dataclass(frozen=True)
class AbRolloutConfig(RolloutOptions):
    """`srollout ab-rollout`: the same tasks and seeds rolled out with and without the gate
    (:class:`RolloutOptions`, some restated with the A/B's own default or help)."""

    groups: int = doc(AB_GROUPS, "Tasks (groups) per arm; group i plays task i of the task set, "
                      "with the same seeds in every arm.")
    tasks: str = doc("eval", "Task set to draw the tasks from: train, eval or heldout (generated), "
                     "or an official ALFWorld split when $ALFWORLD_DATA is set.")
    T_max: int = doc(PAPER_T_MAX, "Step limit per trajectory (T_max).")
    seed: int = doc(0, "Run seed; every trajectory's seeds derive from (seed, group, traj_idx), "
                    "identical in every arm.")
    gate: Path | None = doc(None, "gate.json (from `srollout sweep`) for the gated arm; default: "
                            "rule r1 at (K, d_L) = (10, 0.12).")
    K: int | None = doc(None, "Gate step K of the gated arm (default 10).")
    d_L: float | None = doc(None, "Gate threshold d_L in [0, 1] of the gated arm: cut a group iff "
                            "d_K < d_L (default 0.12).")
    repeats: int = doc(3, "Repeat the whole A/B R times with the same seeds, the arms swapping "
                       "order every repeat; the wall-clock CI is over the blocks × repeats timed "
                       "pairs (default 2 × 3 = 6).")
    blocks: int = doc(AB_BLOCKS, "Blocks of tasks per repeat; the arms alternate over blocks in "
                      "ABBA order, so machine drift favours neither.")
    concurrency: int = doc(64, "Most trajectories in flight at once, the same in every arm (a "
                           "group starts when G slots are free).")
    warmup: bool = doc(True, "Before timing, load every task's game and roll a throw-away batch to "
                       "T_max, so neither arm pays start-up costs.")
    n_boot: int = doc(1_000, "Bootstrap resamples over tasks for the confidence intervals (the "
                      "paper used 1,000).")
    figures: bool = doc(True, "Save the PNG figures (per-task time by arm, the saving decomposed).")
    out: Path | None = doc(None, "Run directory to write (default runs/ab-rollout-<UTC "
                           "timestamp>).")
    overwrite: bool = doc(False, "Replace --out if it already exists.")
    resume: bool = doc(False, "Continue the run in --out: finished (arm, repeat, block) runs are "
                       "kept with their timings.")
    quick: bool = doc(False,
                      f"A short look: {QUICK_GROUPS} tasks and T_max {QUICK_T_MAX} unless given "
                      "explicitly.")
    arms: tuple[str, ...] = doc(AB_ARMS, "Arms to compare (comma list of baseline, gated, dapo, "
                                "greso, gated+dapo, gated+greso); baseline is required.")
    dapo_max_rounds: int = doc(3, "DAPO arms: most extra rollout rounds per block, after which the "
                               "block keeps the useful groups it has.")
    greso_p_explore: float = doc(0.5, "GRESO arms: a task whose last z groups were zero-variance "
                                 "is still rolled out with probability p^z.")
    greso_history: Path | None = doc(None, "GRESO arms: groups.parquet (or a run directory holding "
                                     "one) counted as each task's history before repeat 0.")

    def __post_init__(self) -> None:
        self._check_rollout()
        if self.rule == "r1" and self.t_high is not None:
            raise SrolloutError("--t-high is only used by --rule r3")
        if self.repeats < 1:
            raise SrolloutError(f"--repeats must be >= 1, got {self.repeats}")
        if not 1 <= self.blocks <= self.groups:
            raise SrolloutError(
                f"--blocks must lie in [1, --groups={self.groups}], got {self.blocks}"
            )
        _check_K(tuple(self.signal_K), "--signal-K")
        _check_concurrency(self.concurrency, self.G)
        if self.n_boot < 1:
            raise SrolloutError(f"--n-boot must be >= 1, got {self.n_boot}")
        if self.overwrite and self.resume:
            raise SrolloutError("--overwrite and --resume exclude each other")
        from srollout.core.arms import parse_arms

        try:
            names = tuple(a.name for a in parse_arms(tuple(self.arms)))
        except SrolloutError as err:
            raise SrolloutError(f"--arms: {err}") from None
        if "baseline" not in names:
            raise SrolloutError(
                "--arms must include baseline (every arm is judged against it), got "
                f"{','.join(names)!r}"
            )
        object.__setattr__(self, "arms", ("baseline", *(n for n in names if n != "baseline")))
        if self.dapo_max_rounds < 0:
            raise SrolloutError(f"--dapo-max-rounds must be >= 0, got {self.dapo_max_rounds}")
        if not 0.0 <= self.greso_p_explore <= 1.0:
            raise SrolloutError(f"--greso-p-explore must lie in [0, 1], got {self.greso_p_explore}")
        if self.greso_history is not None and not Path(self.greso_history).exists():
            raise SrolloutError(f"--greso-history {self.greso_history}: no such file or directory")

    def resume_key(self) -> dict[str, Any]:
        """Fields that must match for --resume (all but where/how to write and the report knobs)."""
        skip = {"out", "overwrite", "resume", "n_boot", "figures", "warmup", "base_url"}
        fields = dataclasses.fields(self)
        return {f.name: getattr(self, f.name) for f in fields if f.name not in skip}


@dataclass(frozen=True)
class DistConfig:
    """`--workers N` (collect, train-onpolicy): scale out on Ray (extra `dist`).

    Not part of a run's resume key.
    """

    workers: int = doc(1, "Parallel workers: 1 runs in this process; N > 1 runs on Ray (extra "
                       "`dist`), in $RAY_ADDRESS or a local cluster of N CPUs.")
    chunk_groups: int | None = doc(None, "Groups a rollout worker takes at a time (default: twice "
                                   "its groups in flight, concurrency // G).")

    def __post_init__(self) -> None:
        if self.workers < 1:
            raise SrolloutError(f"--workers must be >= 1, got {self.workers}")
        if self.chunk_groups is not None and self.chunk_groups < 1:
            raise SrolloutError(f"chunk_groups must be >= 1, got {self.chunk_groups}")
