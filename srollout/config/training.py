"""The configs of ``train-offpolicy`` and ``train-onpolicy`` (with its presets)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from srollout.config.common import (
    PAPER_D_L,
    PAPER_G,
    PAPER_K,
    PAPER_TEMPERATURE,
    Resumable,
    _check_choice,
    _check_seed,
    _check_unit,
    audit_field,
    audit_floor_field,
    check_at_least,
    check_run_dir_options,
    check_stall,
    check_stall_arms,
    doc,
    stall_field,
    stall_from_field,
)
from srollout.config.rollout import (
    _check_backend,
    _check_concurrency,
    _check_gate,
    _check_group_size,
)
from srollout.core.gate import check_step
from srollout.errors import SrolloutError

# --- train-offpolicy / train-onpolicy (GRPO with the gate, §5.2–5.4) ---------------------------

TRAIN_ARMS = ("baseline", "gated")
LOSS_DENOMINATOR_CHOICES = ("paper", "token_mean", "seq_mean", "constant")


def _check_training(cfg: Any) -> None:
    """Checks shared by both training configs (lr, LoRA, loss denominator, gate)."""
    if not cfg.lr > 0:
        raise SrolloutError(f"--lr must be > 0, got {cfg.lr}")
    check_at_least(cfg, lora_r=1, lora_alpha=1, kl_coef=0, micro_batch=1)
    if not cfg.lora_targets:
        raise SrolloutError("--lora-targets: give at least one module name")
    _check_choice(cfg.denominator, LOSS_DENOMINATOR_CHOICES, "--denominator")
    if cfg.denominator == "constant" and not (cfg.denominator_constant or 0) > 0:
        raise SrolloutError("--denominator constant needs --denominator-constant > 0")
    if cfg.clip_eps is not None and not 0 < cfg.clip_eps < 1:
        raise SrolloutError(f"--clip-eps must lie in (0, 1), got {cfg.clip_eps}")
    _check_gate(cfg)
    from srollout.policy.named import check_model_arg

    check_model_arg(cfg.model)


@dataclass(frozen=True)
class TrainOffpolicyConfig:
    """`srollout train-offpolicy`: GRPO on a fixed collected buffer, baseline vs gated (Tier 2)."""

    buffer: Path = doc(
        Path("."),
        "A `collect` run directory (un-gated, LM policy: trajectories with token_ids/action_mask).",
    )
    steps: int = doc(20, "GRPO steps per arm.")
    groups_per_step: int = doc(
        4, "Groups sampled from the buffer per step (the same groups in both arms)."
    )
    turns_per_traj: int = doc(
        8, "Most action turns sampled per trajectory (an item is one trajectory x one action turn)."
    )
    max_items: int = doc(
        128,
        "Most items per step; turns per trajectory = min(--turns-per-traj, "
        "max_items // (groups_per_step*G)), so 256 gives the paper's 8.",
    )
    lr: float = doc(5e-5, "AdamW learning rate (paper: 5e-5).")
    lora_r: int = doc(8, "LoRA rank (paper Tier 2: 8).")
    lora_alpha: int = doc(16, "LoRA alpha (paper Tier 2: 16).")
    lora_targets: tuple[str, ...] = doc(
        ("q_proj", "v_proj"), "LoRA target modules (comma list; paper Tier 2: q_proj,v_proj)."
    )
    denominator: str = doc(
        "paper", "Loss denominator: paper (1/N trajectories), token_mean, seq_mean or constant."
    )
    denominator_constant: float | None = doc(
        None, "The constant of --denominator constant (Dr. GRPO style)."
    )
    clip_eps: float | None = doc(
        None, "PPO ratio clipping epsilon in (0, 1) (off by default, as in the paper)."
    )
    kl_coef: float = doc(0.0, "k3 KL coefficient to the base model (0 = off, as in the paper).")
    gate: Path | None = doc(None, "gate.json from `srollout sweep` (else --K/--d-L/--rule).")
    K: int = doc(PAPER_K, "Gate step K.")
    d_L: float = doc(PAPER_D_L, "Gate threshold d_L (rule r1: cut iff d_K < d_L).")
    rule: str = doc("r1", "Gate rule: r1 or r3.")
    t_high: float | None = doc(None, "Termination-fraction threshold of rule r3.")
    seed: int = doc(42, "Seed of the group/turn sampling and of the LoRA init (paper Tier 2: 42).")
    model: Path | None = doc(
        None, "Model directory the buffer was collected with (default: the one in its manifest)."
    )
    micro_batch: int = doc(
        8, "Trajectories per forward/backward chunk (gradients accumulate; the step is the same)."
    )
    out: Path | None = doc(
        None, "Run directory to write (default runs/train-offpolicy-<UTC timestamp>)."
    )
    overwrite: bool = doc(False, "Replace --out if it already exists.")

    def __post_init__(self) -> None:
        _check_seed(self.seed)
        if not Path(self.buffer).is_dir():
            raise SrolloutError(
                f"BUFFER {self.buffer}: not a directory (give a `srollout collect` run directory)"
            )
        check_at_least(self, steps=1, groups_per_step=1, turns_per_traj=1, max_items=1)
        _check_training(self)


# Presets of `train-onpolicy` (values a run takes unless an option is given explicitly):
# paper = the paper's Tier 3; default = fits 2 CPU cores with the embedded default policy (both
# arms of one seed in <= 45 min) and learns, chosen as docs/training.md tells (held-out = `eval`,
# the paper's valid_seen protocol); tiny = seconds, for tests and a first look (any model).
_PRESET_FIELDS = ("iterations", "prompts_per_iter", "G", "T_max", "eval_every", "n_eval",
                  "train_tasks", "K", "lr", "max_new_tokens")  # fmt: skip


def _preset(values: tuple, **extra: Any) -> dict[str, Any]:
    return {**dict(zip(_PRESET_FIELDS, values, strict=True)), **extra}


ONPOLICY_PRESETS: dict[str, dict[str, Any]] = {
    "paper": _preset((60, 10, 8, 30, 10, 50, 1000, PAPER_K, 5e-5, 64), denominator="paper"),
    "default": _preset((40, 8, 8, 20, 10, 100, 200, PAPER_K, 2e-4, 48), denominator="seq_mean"),
    "tiny": _preset((3, 2, 4, 4, 2, 3, 6, 2, 1e-3, 16), eval_set="heldout"),
}


@dataclass(frozen=True)
class TrainOnpolicyConfig(Resumable):
    """`srollout train-onpolicy`: GRPO per seed, baseline vs gated, held-out eval (Tier 3)."""

    # besides where and how to write: the seed list, and how to spend time and memory
    RESUME_SKIP = frozenset(
        "out overwrite resume seeds concurrency interleave base_url judge_cuts micro_batch".split()
    )

    seeds: tuple[int, ...] = doc(
        (7, 13, 23, 42), "Seeds (comma list); each runs both arms, one seed after another."
    )
    preset: str = doc(
        "default",
        "Values of the options not given: default (2 CPU cores, default "
        "policy), tiny (seconds) or paper (Tier 3).",
    )
    iterations: int = doc(40, "On-policy iterations per arm.")
    prompts_per_iter: int = doc(
        8, "Prompts (groups) sampled per iteration (the same in both arms)."
    )
    G: int = doc(PAPER_G, "Trajectories per group.")
    T_max: int = doc(20, "Step limit per trajectory (training and evaluation).")
    temperature: float = doc(
        PAPER_TEMPERATURE, "Rollout sampling temperature (evaluation is greedy)."
    )
    eval_every: int = doc(
        10, "Greedy held-out evaluation every E iterations (and at iteration 0 and the last)."
    )
    n_eval: int = doc(100, "Held-out tasks evaluated (the first n of the held-out set).")
    train_tasks: int = doc(200, "Size of the training task pool prompts are sampled from.")
    train_set: str = doc("train", "Task set of the training prompts.")
    eval_set: str = doc(
        "eval",
        "Task set of the held-out evaluation: eval (new tasks in the "
        "training scenes, the paper's valid_seen) or heldout (unseen scenes).",
    )
    env: str = doc(
        "alfworld",
        "Environment to train in: alfworld (built in), a registered name or entry point of group "
        "srollout.envs, or package.module:attr (an EnvSpec); --train-set / --eval-set then name "
        "its task sets.",
    )
    lr: float = doc(2e-4, "AdamW learning rate (paper: 5e-5).")
    lora_r: int = doc(16, "LoRA rank (paper Tier 3: 16).")
    lora_alpha: int = doc(32, "LoRA alpha (paper Tier 3: 32).")
    lora_targets: tuple[str, ...] = doc(
        ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"),
        "LoRA target modules (comma list).",
    )
    denominator: str = doc(
        "seq_mean",
        "Loss denominator: paper (1/N trajectories), token_mean, "
        "seq_mean (each trajectory's mean token log-prob) or constant.",
    )
    denominator_constant: float | None = doc(None, "The constant of --denominator constant.")
    clip_eps: float | None = doc(None, "PPO ratio clipping epsilon in (0, 1) (off by default).")
    kl_coef: float = doc(0.0, "k3 KL coefficient to the base model (off by default).")
    gate: Path | None = doc(None, "gate.json from `srollout sweep` (else --K/--d-L/--rule).")
    K: int = doc(PAPER_K, "Gate step K.")
    d_L: float = doc(PAPER_D_L, "Gate threshold d_L.")
    rule: str = doc("r1", "Gate rule: r1 or r3.")
    t_high: float | None = doc(None, "Termination-fraction threshold of rule r3.")
    model: Path | None = doc(
        None, "Local Hugging Face model directory, or default (the embedded default policy)."
    )
    backend: str = doc(
        "transformers",
        "Rollout backend: transformers (the trained module), vllm "
        "(in process) or vllm-server (--base-url; a `srollout serve --lora` "
        "server).",
    )
    base_url: str | None = doc(None, "URL of the vLLM server for --backend vllm-server.")
    max_new_tokens: int = doc(48, "Cap on the tokens of one response.")
    concurrency: int = doc(64, "Most trajectories in flight at once in the rollout engine.")
    micro_batch: int = doc(8, "Trajectories per forward/backward chunk.")
    arms: tuple[str, ...] = doc(
        TRAIN_ARMS,
        "Arms to run (comma list of baseline, gated, dapo, greso, gated+dapo, gated+greso, "
        "stall, gated+stall, stall+dapo, stall+greso; a skip part of another package, entry "
        "point group srollout.arms, stands where greso does; docs/training.md).",
    )
    dapo_max_rounds: int = doc(
        3,
        "DAPO arms: most extra sampling rounds per iteration, after "
        "which it trains on the useful groups it has.",
    )
    greso_p_explore: float = doc(
        0.5,
        "GRESO arms: a prompt whose last z groups were zero-variance "
        "is still rolled out with probability p^z.",
    )
    interleave: bool = doc(
        True,
        "Run a seed's arms iteration by iteration, alternating which goes "
        "first, so both see the same machine load.",
    )
    judge_cuts: bool = doc(
        False,
        "Roll every cut group on to T_max after the timed rollout (untimed, same seeds and "
        "weights, no gate) and log whether its full outcome was zero-variance (gate/cut_tp, "
        "gate/cut_fp).",
    )
    audit: float = audit_field("iterations", stops=True)
    audit_floor: float = audit_floor_field()
    stall: int = stall_field()
    stall_from: int = stall_from_field()
    out: Path | None = doc(
        None, "Run directory to write (default runs/train-onpolicy-<UTC timestamp>)."
    )
    overwrite: bool = doc(False, "Replace --out if it already exists.")
    resume: bool = doc(False, "Continue the run in --out from its last per-iteration checkpoints.")

    def __post_init__(self) -> None:
        if not self.seeds:
            raise SrolloutError("--seeds: give at least one seed")
        _check_choice(self.preset, ONPOLICY_PRESETS, "--preset")
        sizes = ("iterations", "prompts_per_iter", "eval_every", "n_eval", "train_tasks")
        check_at_least(self, **dict.fromkeys((*sizes, "max_new_tokens", "T_max"), 1))
        _check_group_size(self.G)
        check_step(self.K, self.T_max)
        if not self.temperature >= 0:
            raise SrolloutError(f"--temperature must be >= 0, got {self.temperature}")
        _check_concurrency(self.concurrency, self.G)
        from srollout.core.arms import parse_arms

        try:
            object.__setattr__(self, "arms", tuple(a.name for a in parse_arms(tuple(self.arms))))
        except SrolloutError as err:
            raise SrolloutError(f"--arms: {err}") from None
        check_stall(self.stall, self.stall_from, self.T_max)
        check_stall_arms(self.stall, parse_arms(self.arms))
        if "loop" in self.arms:
            raise SrolloutError(
                "--arms loop: the loop detector's arm runs in ab-rollout (a baseline to compare "
                "the stall arms with); train-onpolicy trains the stall arms"
            )
        check_at_least(self, dapo_max_rounds=0)
        _check_unit((self.greso_p_explore,), "--greso-p-explore")
        from srollout.core.audit import check_audit_options

        check_audit_options(self.audit, self.audit_floor)
        check_run_dir_options(self)
        _check_backend(self.backend, self.base_url)
        _check_training(self)

    @classmethod
    def from_preset(cls, preset: str = "default", **overrides: Any) -> TrainOnpolicyConfig:
        """The preset's values, then every override that is not None."""
        _check_choice(preset, ONPOLICY_PRESETS, "--preset")
        given = {k: v for k, v in overrides.items() if v is not None}
        values = {**ONPOLICY_PRESETS[preset], **given}
        return cls(preset=preset, **values)
