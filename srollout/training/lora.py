"""LoRA adapters through peft, with the paper's settings (App. "Hyperparameters").

Tier 2 (off-policy): rank 8, alpha 16 on q_proj and v_proj. Tier 3 (on-policy): rank 16,
alpha 32 on q, k, v, o and the MLP projections (gate, up, down). The adapter is attached to the
very module the rollout policy samples from, so an optimizer step changes the rollout policy in
place (the "hot-swap" of App. "Reloading the policy between iterations" costs nothing here).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any

from srollout.errors import SrolloutError

ATTENTION_QV = ("q_proj", "v_proj")
ATTENTION_MLP_ALL = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@dataclass(frozen=True)
class LoraSettings:
    """r: rank; alpha: scaling numerator (update scale = alpha / r); targets: module names
    (suffixes) that get an adapter; dropout: LoRA dropout (0 keeps updates deterministic)."""

    r: int
    alpha: int
    targets: tuple[str, ...]
    dropout: float = 0.0

    def __post_init__(self) -> None:
        if self.r < 1 or self.alpha < 1:
            raise SrolloutError(
                f"LoRA rank and alpha must be >= 1, got r={self.r}, alpha={self.alpha}"
            )
        if not self.targets:
            raise SrolloutError("LoRA needs at least one target module")


OFFPOLICY_LORA = LoraSettings(r=8, alpha=16, targets=ATTENTION_QV)
ONPOLICY_LORA = LoraSettings(r=16, alpha=32, targets=ATTENTION_MLP_ALL)


def attach_lora(model: Any, settings: LoraSettings, seed: int) -> Any:
    """Wrap ``model`` with a fresh LoRA adapter (peft); the A matrices are drawn with torch's
    RNG seeded by ``seed`` (B starts at zero, so the wrapped model equals the base model).
    Returns the peft model; only the adapter's parameters require grad."""
    import torch
    from peft import LoraConfig, get_peft_model

    names = {name.rsplit(".", 1)[-1] for name, _ in model.named_modules()}
    missing = [t for t in settings.targets if t not in names]
    if missing:
        raise SrolloutError(
            f"LoRA target modules {missing} are not in the model (it has e.g. {sorted(names)[:8]})"
        )
    config = LoraConfig(
        r=settings.r,
        lora_alpha=settings.alpha,
        target_modules=list(settings.targets),
        lora_dropout=settings.dropout,
        bias="none",
        task_type="CAUSAL_LM",
    )
    torch.manual_seed(seed)
    with warnings.catch_warnings():
        # peft asks transformers a deprecated question on every wrap; the answer is fine
        warnings.filterwarnings(
            "ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning
        )
        peft_model = get_peft_model(model, config)
    peft_model.eval()  # no dropout anywhere: the update is a deterministic function of the batch
    return peft_model


def trainable_parameters(model: Any) -> list[Any]:
    """The parameters an optimizer should update (the adapter's)."""
    return [p for p in model.parameters() if p.requires_grad]


def adapter_state(model: Any) -> dict[str, Any]:
    """A detached copy of the adapter weights (name -> tensor), for checkpoints and comparisons."""
    from peft import get_peft_model_state_dict

    return {k: v.detach().clone() for k, v in get_peft_model_state_dict(model).items()}


def load_adapter_state(model: Any, state: dict[str, Any]) -> None:
    """Put ``state`` (from :func:`adapter_state`) back into the adapter, in place."""
    from peft import set_peft_model_state_dict

    result = set_peft_model_state_dict(model, state)
    unexpected = getattr(result, "unexpected_keys", None)
    if unexpected:
        raise SrolloutError(
            f"adapter checkpoint does not match the model: unexpected keys {unexpected[:3]}"
        )


def make_optimizer(model: Any, lr: float, weight_decay: float = 0.0) -> Any:
    """AdamW over the adapter's parameters (the paper's optimizer; lr 5e-5 by default upstream).

    weight_decay defaults to 0 so that a step with zero gradient leaves the adapter unchanged
    (a zero-variance batch is then exactly a no-op, as GRPO says it should be)."""
    import torch

    return torch.optim.AdamW(trainable_parameters(model), lr=lr, weight_decay=weight_decay)
