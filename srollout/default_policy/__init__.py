"""The default policy: the recipe that builds it, and the build the package ships.

srollout makes its default policy from the environment alone (no download): noisy-expert
demonstrations, a BPE tokenizer, a small Qwen2 trained by SFT, optional DAgger rounds. This
package is that build, a layer above ``policy/``, ``rollout/`` and ``training/``, which it uses;
docs/architecture.md lists its modules, and ``model/`` is the shipped build (package data).

Resolving ``--model default`` needs none of this: it is :mod:`srollout.policy.shipped` (whose
:func:`default_policy` and :data:`SHIPPED_DIR` are re-exported here).
:func:`replace_shipped` puts a rebuild in the shipped one's place."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from srollout.atomic import atomic_dir
from srollout.errors import SrolloutError
from srollout.policy import shipped
from srollout.policy.shipped import REBUILD_SHIPPED, SHIPPED_DIR, default_policy

__all__ = ["REBUILD_SHIPPED", "SHIPPED_DIR", "default_policy", "replace_shipped"]


def replace_shipped(built: Path, target: Path | None = None, skip: tuple[str, ...] = ()) -> Path:
    """Copy a finished build over the shipped one (``target``: the default policy's directory,
    or the SmolLM2 adapter's) through :func:`srollout.atomic.atomic_dir` (a temp dir beside it,
    then a rename), so the package never holds half a model; files named in ``skip`` stay out.
    Needs a writable package (a clone, ``pip install -e``)."""
    from srollout.default_policy.build import is_built

    target = target or shipped.SHIPPED_DIR
    finished = (
        is_built(built) if target == shipped.SHIPPED_DIR else (built / "build.json").is_file()
    )
    if not finished:
        raise SrolloutError(f"{built}: not a finished build")
    if not os.access(target.parent, os.W_OK):
        raise SrolloutError(
            f"{target.parent}: not writable (an installed wheel); "
            "rebuild into the cache and pass --model PATH"
        )
    with atomic_dir(target) as tmp:
        for f in sorted(built.iterdir()):
            if f.is_file() and f.name not in skip:
                shutil.copy2(f, tmp / f.name)
    return target
