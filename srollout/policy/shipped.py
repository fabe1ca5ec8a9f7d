"""Where ``--model default`` points: the default policy the package ships, checked, never built.

The files live in ``srollout/default_policy/model/`` (package data: config.json,
model.safetensors, tokenizer, chat template, srollout.json with the policy's prompt, build.json
with the recipe, seed, precision, machine and figures). Resolving them needs no part of the build
(:mod:`srollout.default_policy`, a layer above this one), so this module names the folder by its
path instead of importing that package.
"""

from __future__ import annotations

from pathlib import Path

from srollout.errors import SrolloutError

SHIPPED_DIR = Path(__file__).resolve().parents[1] / "default_policy" / "model"
REBUILD_SHIPPED = "srollout policy build --replace-shipped"


def default_policy() -> Path:
    """The directory ``--model default`` names: the shipped model, checked file by file (a
    damaged one is one line naming the file and the command that rebuilds it). Nothing is built."""
    from srollout.policy.model_files import check_model_dir

    check_model_dir(SHIPPED_DIR, rebuild=REBUILD_SHIPPED)
    if not (SHIPPED_DIR / "build.json").is_file():
        raise SrolloutError(
            f"{SHIPPED_DIR / 'build.json'}: missing; rebuild it with `{REBUILD_SHIPPED}`"
        )
    return SHIPPED_DIR
