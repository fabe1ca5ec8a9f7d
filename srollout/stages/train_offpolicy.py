"""`srollout train-offpolicy`: GRPO on a fixed collected buffer, baseline vs gated arm (Tier 2,
§5.2; docs/training.md).

The story (:func:`run_train_offpolicy`):

1. read the buffer (an ungated `collect` run of the LM policy): token ids, action masks, rewards and
   the per-step cost;
2. evaluate the gate on every group from its signals at K (the engine's rule) and count a cut
   group's post-K cost as saved;
3. draw the plan, the same for both arms: ``steps`` x ``groups_per_step`` groups, and the turns each
   trajectory contributes;
4. per arm, from the same LoRA init: each step builds the GRPO batch (the gated arm drops the cut
   groups), takes one AdamW step and logs;
5. write metrics.parquet, the per-step trace figure, the summary, report.md and the manifest.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np
import polars as pl

from srollout import schemas
from srollout.config import TrainOffpolicyConfig
from srollout.errors import SrolloutError
from srollout.progress import StageBar
from srollout.rundir import Manifest, prepare_run_dir
from srollout.training.metrics import (
    OffpolicyGate,
    OffpolicyTrain,
    StepMetrics,
    StepTimes,
    TrainMetrics,
)

if TYPE_CHECKING:
    from collections.abc import Sequence

    from srollout.core.gate import Gate
    from srollout.training.update import TrainSample


@dataclass(frozen=True)
class BufferGroup:
    """One group of the buffer as the trainer needs it: rewards [G], G token-id and action-mask
    sequences, whether the gate cuts it at K and its d_K there (nan when no trajectory reached K),
    and its measured rollout cost, all of it and after step K (what a cut saves)."""

    group_id: str
    rewards: tuple[float, ...]
    token_ids: tuple[tuple[int, ...], ...]
    action_masks: tuple[tuple[bool, ...], ...]
    cut: bool
    d_K: float
    zero_var: bool
    rollout_s: float
    post_K_s: float
    post_K_steps: int
    post_K_tokens: int


class OffpolicySummary(NamedTuple):
    """Headline numbers (gated vs baseline; savings as fractions of the baseline)."""

    steps: int
    groups_seen: int
    groups_cut: int
    cut_zero_var: int
    items_baseline: int
    items_gated: int
    update_s_baseline: float
    update_s_gated: float
    train_saving: float
    rollout_s_baseline: float
    rollout_s_saved: float
    rollout_saving: float
    end_to_end_saving: float
    grad_l2_baseline: float
    grad_l2_gated: float
    grad_l2_ratio: float
    zero_adv_baseline: float
    zero_adv_gated: float
    dilution_prediction: float


class OffpolicyResult(NamedTuple):
    run_dir: Path
    metrics: Path
    figure: Path
    report: Path
    summary: OffpolicySummary


def run_train_offpolicy(
    config: TrainOffpolicyConfig, console: Any = None, progress: bool = True
) -> OffpolicyResult:
    """Run both arms on the buffer; return the files written and the summary.

    The two arms start from the same LoRA init and are stepped side by side."""
    from srollout.core.gate import resolve_gate
    from srollout.training.lora import LoraSettings, make_optimizer
    from srollout.training.loss import action_turn_spans
    from srollout.training.model import gate_description, load_trainable
    from srollout.training.update import config_update

    gate, K = resolve_gate(
        config.gate, K=config.K, d_L=config.d_L, rule=config.rule, t_high=config.t_high
    )
    groups, model_spec = read_buffer(Path(config.buffer), gate, K)
    if config.model is not None:
        model_spec = {"model": str(config.model), "adapter": model_spec["adapter"]}
    from srollout.policy import resolve_model

    model_dir = resolve_model(model_spec["model"])  # once for both arms, before anything is written
    run_dir = prepare_run_dir(config.out, "train-offpolicy", overwrite=config.overwrite)
    manifest = Manifest(run_dir, "train-offpolicy", config)
    manifest.update(gate=gate_description(gate, K), buffer_groups=len(groups), model=model_spec)

    G_max = max(len(g.rewards) for g in groups.values())
    k_turns = max(
        1, min(config.turns_per_traj, config.max_items // (config.groups_per_step * G_max))
    )
    plan = sample_plan(sorted(groups), config.steps, config.groups_per_step, config.seed)
    lora = LoraSettings(config.lora_r, config.lora_alpha, tuple(config.lora_targets))
    rows: list[dict[str, Any]] = []
    bar = StageBar(console, "train-offpolicy", 2 * config.steps, enabled=progress)
    arms = ("baseline", "gated")
    # Both arms in memory, stepped side by side (alternating which goes first), so a load change
    # on a shared machine hits both arms alike; each starts from the same LoRA init.
    models = {
        arm: load_trainable(model_dir, lora, config.seed, model_spec["adapter"]) for arm in arms
    }
    optimizers = {arm: make_optimizer(models[arm].model, config.lr) for arm in arms}
    _check_vocabulary(groups, models["baseline"].model, model_spec["model"])
    cum_update_s = dict.fromkeys(arms, 0.0)
    cum_rollout_s = dict.fromkeys(arms, 0.0)
    with bar:
        for step, gids in enumerate(plan, start=1):
            planned = [groups[g] for g in gids]
            for arm in arms if step % 2 else arms[::-1]:
                trainable = models[arm]
                kept = [g for g in planned if arm == "baseline" or not g.cut]
                samples = step_samples(kept, config.seed, step, k_turns)
                stats = config_update(config, trainable, optimizers[arm], samples)
                # rollout cost of this step's groups as the buffer measured it: a cut group only to
                # K
                rollout_s = sum(
                    g.rollout_s - (g.post_K_s if (arm == "gated" and g.cut) else 0.0)
                    for g in planned
                )
                cum_update_s[arm] += stats.update_s
                cum_rollout_s[arm] += rollout_s
                rows.append(
                    StepMetrics(
                        arm=arm,
                        seed=config.seed,
                        step=step,
                        gate=OffpolicyGate(
                            cuts=sum(g.cut for g in planned) if arm == "gated" else 0,
                            kept=len(kept),
                            zero_var_kept=sum(g.zero_var for g in kept),
                        ),
                        train=OffpolicyTrain(
                            **TrainMetrics.fields_of(stats, config.denominator),
                            items=sum(len(action_turn_spans(s.action_mask)) for s in samples),
                        ),
                        time=StepTimes(
                            rollout_s=rollout_s,
                            update_s=stats.update_s,
                            sync_s=0.0,
                            cum_update_s=cum_update_s[arm],
                            cum_rollout_s=cum_rollout_s[arm],
                        ),
                    ).row()
                )
                bar.update(advance=1, info=f"{arm} step {step}: grad L2 {stats.grad_l2:.4f}")

    metrics = pl.DataFrame(rows).sort("arm", "step")
    metrics_path = schemas.write(metrics, run_dir / "metrics.parquet", schemas.METRICS)
    summary = summarise(metrics, groups, plan)
    figure = trace_figure(metrics, run_dir / "offpolicy_trace.png")
    report = write_report(run_dir, config, summary, gate_description(gate, K), k_turns, figure)
    schemas.write_json(summary._asdict(), run_dir / "summary.json")
    manifest.complete(
        [metrics_path, figure, report, run_dir / "summary.json"],
        summary=summary._asdict(),
        turns_per_traj_used=k_turns,
    )
    return OffpolicyResult(run_dir, metrics_path, figure, report, summary)


# --- the buffer --------------------------------------------------------------------------------


def read_buffer(path: Path, gate: Gate, K: int) -> tuple[dict[str, BufferGroup], dict[str, Any]]:
    """Groups of a collect run (un-gated, with tokens), the gate's decision on each, and the
    model the buffer was collected with ({"model": ..., "adapter": ...})."""
    from srollout.core.signals import GroupSignals
    from srollout.schemas import SIGNAL_NAMES
    from srollout.stages.buffer import load_buffer

    traj_file = path / "trajectories.parquet"
    steps_file = path / "steps.parquet"
    for f in (traj_file, steps_file):
        if not f.exists():
            raise SrolloutError(
                f"BUFFER {path}: no {f.name}; give a `srollout collect` run directory"
            )
    trajs = schemas.read(traj_file, schemas.TRAJECTORIES)
    for col in ("token_ids", "action_mask"):
        if col not in trajs.columns:
            raise SrolloutError(
                f"{traj_file}: no '{col}' column; training needs the rollout's own tokens (collect "
                "with the LM policy)"
            )
    if not trajs["token_ids"].list.len().gt(0).any():
        raise SrolloutError(
            f"{traj_file}: no trajectory has tokens (was it collected with --policy expert?); "
            "collect with the LM policy"
        )
    buf = load_buffer(path, [K], [K])  # refuses gated buffers; computes the signals at K from steps
    at_K = {r["group_id"]: r for r in buf.at_K(K).iter_rows(named=True)}
    steps = schemas.read(steps_file, schemas.STEPS)
    cost = steps.group_by("group_id").agg(
        (pl.col("gen_s") + pl.col("env_s")).sum().alias("rollout_s"),
        (pl.col("gen_s") + pl.col("env_s")).filter(pl.col("step") > K).sum().alias("post_K_s"),
        (pl.col("step") > K).sum().alias("post_K_steps"),
        pl.col("n_gen_tokens").filter(pl.col("step") > K).sum().alias("post_K_tokens"),
    )
    cost_of = {r["group_id"]: r for r in cost.iter_rows(named=True)}
    groups: dict[str, BufferGroup] = {}
    for (gid,), part in trajs.sort("group_id", "traj_idx").group_by(
        ["group_id"], maintain_order=True
    ):
        sig = at_K.get(gid)
        reached = int(part["n_steps"].max()) > K  # the engine shows a group to the gate only then
        cut = False
        d_K = float("nan")
        if sig is not None and sig.get(SIGNAL_NAMES[0]) is not None:
            d_K = float(sig[SIGNAL_NAMES[0]])
            cut = reached and bool(
                gate.decide(GroupSignals(**{n: float(sig[n]) for n in SIGNAL_NAMES}))
            )
        rewards = tuple(float(r) for r in part["reward"])
        c = cost_of.get(gid, {})  # a group without steps rows cost nothing measured
        groups[gid] = BufferGroup(
            group_id=gid,
            rewards=rewards,
            token_ids=tuple(tuple(t) for t in part["token_ids"].to_list()),
            action_masks=tuple(tuple(m) for m in part["action_mask"].to_list()),
            cut=cut,
            d_K=d_K,
            zero_var=max(rewards) - min(rewards) == 0.0,
            rollout_s=float(c.get("rollout_s") or 0.0),
            post_K_s=float(c.get("post_K_s") or 0.0),
            post_K_steps=int(c.get("post_K_steps") or 0),
            post_K_tokens=int(c.get("post_K_tokens") or 0),
        )
    if not groups:
        raise SrolloutError(f"{traj_file}: the buffer has no groups")
    return groups, buffer_model(path)


def _check_vocabulary(groups: dict[str, BufferGroup], model: Any, name: str) -> None:
    """Token ids beyond the model's vocabulary mean the buffer was made with another model."""
    top = max((max(ids) for g in groups.values() for ids in g.token_ids if ids), default=-1)
    size = model.get_input_embeddings().num_embeddings
    if top >= size:
        raise SrolloutError(
            f"the buffer holds token id {top} but model {name} has {size} tokens; pass the --model "
            "it was collected with"
        )


def buffer_model(path: Path) -> dict[str, Any]:
    """The model (and adapter) a collect run used, from its manifest (default policy if unknown)."""
    manifest = path / "manifest.json"
    cfg = json.loads(manifest.read_text()).get("config", {}) if manifest.exists() else {}
    if cfg.get("policy", "lm") != "lm":
        raise SrolloutError(
            f"BUFFER {path}: collected with --policy "
            f"{cfg.get('policy')}; training needs an LM policy's buffer"
        )
    return {"model": cfg.get("model") or "default", "adapter": cfg.get("adapter")}


# --- the plan ---------------------------------------------------------------------------------


def sample_plan(group_ids: list[str], steps: int, per_step: int, seed: int) -> list[list[str]]:
    """``steps`` lists of ``per_step`` group ids: a seeded permutation of the buffer consumed in
    order (reshuffled when it runs out), so no group repeats while the buffer lasts."""
    if per_step > len(group_ids):
        raise SrolloutError(
            f"--groups-per-step {per_step} is more than the buffer's {len(group_ids)} groups"
        )
    rng = np.random.default_rng([seed, 0x5EED])
    order: list[str] = []
    plan = []
    for _ in range(steps):
        if len(order) < per_step:
            order += [group_ids[i] for i in rng.permutation(len(group_ids))]
        plan.append(order[:per_step])
        order = order[per_step:]
    return plan


def step_samples(
    groups: list[BufferGroup], seed: int, step: int, k_turns: int
) -> list[TrainSample]:
    """The batch of one step: every trajectory of ``groups`` with ``k_turns`` of its action turns
    kept (drawn from a seed of (seed, step, group, trajectory), so both arms draw the same),
    cut after its last kept turn. Advantages come from the group's full rewards."""
    from srollout.training.loss import subsample_turns
    from srollout.training.update import samples_from_groups

    def keep_turns(g: BufferGroup, i: int, mask: Sequence[bool]) -> list[bool]:
        gi = int("".join(ch for ch in g.group_id if ch.isdigit()) or 0)
        return subsample_turns(mask, k_turns, np.random.default_rng([seed, step, gi, i]))

    return samples_from_groups(groups, keep_turns=keep_turns)


# --- summary, figure, report ------------------------------------------------------------------


def _mean(values: pl.Series) -> float:
    """Mean over the non-NaN values (an all-cut step logs NaN), NaN when there are none."""
    v = values.drop_nulls().drop_nans()
    return float(v.mean()) if v.len() else float("nan")


def _frac_saved(base: float, gated: float) -> float:
    return (base - gated) / base if base > 0 else float("nan")


def summarise(
    metrics: pl.DataFrame, groups: dict[str, BufferGroup], plan: list[list[str]]
) -> OffpolicySummary:
    """Wall-clock savings (training step, rollout from the buffer's measurements, end to end),
    cut counts, items, gradient L2 means and the dilution prediction (1-z_g)/(1-z_b) of §5.4."""
    base = metrics.filter(pl.col("arm") == "baseline")
    gated = metrics.filter(pl.col("arm") == "gated")
    seen = [groups[gid] for step in plan for gid in step]
    cut = [x for x in seen if x.cut]
    update_base = float(base["time/update_s"].sum())
    update_gated = float(gated["time/update_s"].sum())
    rollout_base = float(sum(x.rollout_s for x in seen))
    saved = float(sum(x.post_K_s for x in cut))
    grad_base = _mean(base["train/grad_l2"])
    grad_gated = _mean(gated.filter(pl.col("train/stepped"))["train/grad_l2"])
    z_base, z_gated = _mean(base["train/zero_adv_frac"]), _mean(gated["train/zero_adv_frac"])
    nan = float("nan")
    return OffpolicySummary(
        steps=base.height,
        groups_seen=len(seen),
        groups_cut=len(cut),
        cut_zero_var=sum(x.zero_var for x in cut),
        items_baseline=int(base["train/items"].sum()),
        items_gated=int(gated["train/items"].sum()),
        update_s_baseline=update_base,
        update_s_gated=update_gated,
        train_saving=_frac_saved(update_base, update_gated),
        rollout_s_baseline=rollout_base,
        rollout_s_saved=saved,
        rollout_saving=saved / rollout_base if rollout_base > 0 else nan,
        end_to_end_saving=_frac_saved(
            update_base + rollout_base, update_gated + rollout_base - saved
        ),
        grad_l2_baseline=grad_base,
        grad_l2_gated=grad_gated,
        grad_l2_ratio=grad_gated / grad_base if grad_base > 0 else nan,
        zero_adv_baseline=z_base,
        zero_adv_gated=z_gated,
        dilution_prediction=(1 - z_gated) / (1 - z_base) if z_base < 1 else nan,
    )


ARM_COLORS = {"baseline": "#1f77b4", "gated": "#ff7f0e"}


def trace_figure(metrics: pl.DataFrame, path: Path) -> Path:
    """The paper's per-step trace (App. "Off-policy training per-step trace"): cumulative
    training wall-clock, gradient L2 norm, items per step, loss per step; one line per arm."""
    from srollout.report.figures import pyplot, save_figure

    plt = pyplot()
    fig, axes = plt.subplots(2, 2, figsize=(10, 7))
    panels = [
        ("time/cum_update_s", "cumulative training wall-clock (s)"),
        ("train/grad_l2", "gradient L2 norm"),
        ("train/items", "training items per step"),
        ("train/loss", "GRPO loss"),
    ]
    for ax, (col, label) in zip(axes.flat, panels, strict=True):
        for arm in ("baseline", "gated"):
            d = metrics.filter(pl.col("arm") == arm).sort("step")
            ax.plot(
                d["step"].to_list(),
                d[col].to_list(),
                marker="o",
                ms=3,
                label=arm,
                color=ARM_COLORS[arm],
            )
        ax.set_xlabel("step")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    axes[0][0].legend()
    fig.suptitle("Off-policy GRPO A/B: baseline vs gated")
    fig.tight_layout()
    return save_figure(fig, path)


def summary_frame(s: OffpolicySummary) -> pl.DataFrame:
    """The (quantity, baseline, gated, delta) table of the paper's Tier-2 table."""

    def pct(x: float) -> str:
        return "—" if x != x else f"{-100 * x:+.1f}%"

    rows = [
        (
            "training-step wall-clock (s)",
            f"{s.update_s_baseline:.2f}",
            f"{s.update_s_gated:.2f}",
            pct(s.train_saving),
        ),
        (
            "rollout wall-clock of the groups (s, buffer)",
            f"{s.rollout_s_baseline:.2f}",
            f"{s.rollout_s_baseline - s.rollout_s_saved:.2f}",
            pct(s.rollout_saving),
        ),
        (
            "end to end (rollout + training, s)",
            f"{s.update_s_baseline + s.rollout_s_baseline:.2f}",
            f"{s.update_s_gated + s.rollout_s_baseline - s.rollout_s_saved:.2f}",
            pct(s.end_to_end_saving),
        ),
        (
            "train items",
            str(s.items_baseline),
            str(s.items_gated),
            pct(_frac_saved(s.items_baseline, s.items_gated)),
        ),
        (
            f"groups cut (of {s.groups_seen})",
            "0",
            str(s.groups_cut),
            f"{s.cut_zero_var} of them zero-variance",
        ),
        (
            "gradient L2 mean",
            f"{s.grad_l2_baseline:.4g}",
            f"{s.grad_l2_gated:.4g}",
            f"x{s.grad_l2_ratio:.3f}",
        ),
        (
            "zero-advantage fraction",
            f"{s.zero_adv_baseline:.3f}",
            f"{s.zero_adv_gated:.3f}",
            f"dilution prediction x{s.dilution_prediction:.3f}",
        ),
    ]
    return pl.DataFrame(
        rows,
        schema={"quantity": pl.Utf8, "baseline": pl.Utf8, "gated": pl.Utf8, "delta": pl.Utf8},
        orient="row",
    )


def write_report(
    run_dir: Path,
    config: TrainOffpolicyConfig,
    s: OffpolicySummary,
    gate: str,
    k_turns: int,
    figure: Path,
) -> Path:
    from srollout.report.markdown import Section, doc_link
    from srollout.report.markdown import figure as fig_md
    from srollout.report.markdown import write_report as write
    from srollout.report.tables import to_markdown

    settings = (
        f"buffer `{config.buffer}`; {config.steps} steps x {config.groups_per_step} groups; "
        f"{k_turns} sampled action turns per trajectory (--turns-per-traj {config.turns_per_traj}, "
        f"--max-items {config.max_items}); LoRA r={config.lora_r}, alpha={config.lora_alpha} on "
        f"{', '.join(config.lora_targets)}; AdamW lr {config.lr:g}; loss denominator "
        f"`{config.denominator}`; clip {config.clip_eps}; KL {config.kl_coef:g}; gate {gate}; seed "
        f"{config.seed}.\n\nHow the arms are built and the savings counted: "
        + doc_link("training.md", "`srollout train-offpolicy BUFFER` (Tier 2)")
        + "."
    )
    sections = [
        Section("Summary", to_markdown(summary_frame(s))),
        Section("Settings", settings),
        Section(
            "Per-step trace",
            fig_md(
                figure, run_dir, "cumulative training wall-clock, gradient L2, items per step, loss"
            ),
        ),
        Section(
            "Files",
            "- `metrics.parquet` (one row per arm and step)\n- `summary.json`\n- "
            "`offpolicy_trace.png`",
        ),
    ]
    return write(run_dir, "srollout train-offpolicy", sections)
