"""The default policy as package data: the v5 model that ``srollout policy build`` made from its
recipe and seed, shipped so that no user's first run builds anything.

``model/`` is an ordinary Hugging Face directory (config.json, model.safetensors, tokenizer,
chat template, srollout.json with the policy's prompt, build.json with the recipe, seed,
precision, machine and figures). :func:`default_policy` is what ``--model default`` resolves to;
:func:`replace_shipped` puts a rebuild (:mod:`srollout.policy.default_model`) in its place.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from srollout.errors import SrolloutError

SHIPPED_DIR = Path(__file__).resolve().parent / "model"
REBUILD_SHIPPED = "srollout policy build --replace-shipped"


def default_policy() -> Path:
    """The directory ``--model default`` names: the shipped model, checked file by file (a
    damaged one is one line naming the file and the command that rebuilds it). Nothing is built."""
    from srollout.policy.model_files import check_model_dir

    check_model_dir(SHIPPED_DIR, rebuild=REBUILD_SHIPPED)
    if not (SHIPPED_DIR / "build.json").is_file():
        raise SrolloutError(f"{SHIPPED_DIR / 'build.json'}: missing; rebuild it with `{REBUILD_SHIPPED}`")
    return SHIPPED_DIR


def replace_shipped(built: Path) -> Path:
    """Copy a finished build over the shipped model: into a temp dir beside it, then two renames,
    so the package never holds half a model. Needs a writable package (a clone, ``pip install -e``)."""
    from srollout.policy.default_model import is_built

    target, parent = SHIPPED_DIR, SHIPPED_DIR.parent
    if not is_built(built):
        raise SrolloutError(f"{built}: not a finished build")
    if not os.access(parent, os.W_OK):
        raise SrolloutError(f"{parent}: not writable (an installed wheel); rebuild into the cache and pass --model PATH")
    tmp = Path(tempfile.mkdtemp(prefix=".model.", dir=parent))
    old = parent / f".model.old-{os.getpid()}"
    try:
        for f in sorted(built.iterdir()):
            if f.is_file():
                shutil.copy2(f, tmp / f.name)
        if target.exists():
            os.replace(target, old)
        os.replace(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        if old.exists() and not target.exists():
            os.replace(old, target)
        raise
    shutil.rmtree(old, ignore_errors=True)
    return target
