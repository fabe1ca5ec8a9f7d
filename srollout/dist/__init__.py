"""Scale-out on Ray (the optional ``dist`` extra: ``pip install 'srollout[dist]'``).

- :mod:`srollout.dist.cluster`: :func:`require_ray` (one clear line when the extra is missing) and
  :func:`ray_session` (join ``$RAY_ADDRESS``, else start a local cluster with one CPU per worker).
- :mod:`srollout.dist.rollout`: ``collect --workers N``: Ray actors that each run the same batched
  engine (:func:`srollout.rollout.engine.run_groups`) on chunks of groups; the driver streams the
  groups back, so a run on N workers has the content of a run on one, and a dead worker is
  replaced with its unfinished chunk rerun.
- :mod:`srollout.dist.seeds`: ``train-onpolicy --workers N``: one Ray task per seed, each a
  one-seed run in ``RUN/seeds/seed<S>/``, merged by the stage's own ``--resume`` pass.

Importing this package does not import Ray; the functions that need it import it.
"""

from __future__ import annotations

from srollout.dist.cluster import ray_session, require_ray

__all__ = ["ray_session", "require_ray"]
