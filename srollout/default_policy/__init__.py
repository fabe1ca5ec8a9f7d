"""The default policy as package data: the v5 model that ``srollout policy build`` made from its
recipe and seed, shipped so that no user's first run builds anything.

``model/`` is an ordinary Hugging Face directory (config.json, model.safetensors, tokenizer,
chat template, srollout.json with the policy's prompt, build.json with the recipe, seed,
precision, machine and figures). :mod:`srollout.policy.default_model` resolves ``--model
default`` to it and rebuilds it (``srollout policy build``, ``--replace-shipped``).
"""

from __future__ import annotations

from pathlib import Path

SHIPPED_DIR = Path(__file__).resolve().parent / "model"
