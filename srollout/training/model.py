"""What both training loops set up the same way: the trainable model and the gate's report line
(the gate itself comes from :func:`srollout.core.gate.resolve_gate`, as in every stage)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from srollout.training.lora import LoraSettings, attach_lora

if TYPE_CHECKING:
    from srollout.core.gate import Gate


class TrainableModel(NamedTuple):
    """model: the peft-wrapped causal LM (adapter trainable, base frozen); tokenizer; path: the
    base model directory; pad_id: the tokenizer's pad id (used to pad training batches)."""

    model: Any
    tokenizer: Any
    path: Path
    pad_id: int


# above this, activations fill a CPU's memory: the layers recompute them (docs/benchmarks.md)
CHECKPOINT_ABOVE = 50_000_000


def load_trainable(
    path: Path, lora: LoraSettings, seed: int, adapter: str | Path | None = None
) -> TrainableModel:
    """Load the model in ``path`` (a directory :func:`srollout.policy.resolve_model` gave: the
    stage resolves it once) in float32 on CPU, merge an existing ``adapter`` into it (the policy
    a buffer was collected with), and attach a fresh LoRA adapter seeded by ``seed``. Over
    :data:`CHECKPOINT_ABOVE` parameters, gradient checkpointing (training.update.recomputing)."""
    from srollout.policy.transformers_backend import load_model

    base, tokenizer = load_model(path, adapter)
    if adapter is not None:
        base = base.merge_and_unload()
    if sum(p.numel() for p in base.parameters()) > CHECKPOINT_ABOVE:
        base.gradient_checkpointing_enable({"use_reentrant": False})
    peft_model = attach_lora(base, lora, seed)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    return TrainableModel(peft_model, tokenizer, Path(path), int(pad if pad is not None else 0))


def gate_description(gate: Gate, K: int) -> str:
    """One line for reports: the rule and its operating point."""
    d = gate.to_dict()
    rule = d.get("rule", type(gate).__name__)
    extra = f", t_high={d['t_high']}" if d.get("t_high") is not None else ""
    d_L = d.get("d_L")
    return f"{rule} at K={K}" + (f", d_L={d_L}" if d_L is not None else "") + extra
