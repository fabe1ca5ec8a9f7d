"""The batched, streaming group-rollout engine that applies the gate at step K.

- :mod:`srollout.rollout.engine`: :func:`run_groups` keeps a pool of groups in flight, asks the
  policy for one batched response per live trajectory per tick, steps the environments, applies
  the gate when a group reaches step K, and hands back one :class:`GroupRecord` per finished group.
- :mod:`srollout.rollout.seeding`: per-trajectory sampling and environment seeds.
- :mod:`srollout.rollout.records`: a finished group's rows as the Parquet tables of DESIGN.md.
- :mod:`srollout.rollout.parts`: atomic per-group part directories, resume and the final merge.

Nothing here imports torch or alfworld at module level.
"""
