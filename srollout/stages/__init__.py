"""The stages of the pipeline, one function each, passing Parquet artifacts (DESIGN.md).

Offline stages (no torch): :func:`srollout.stages.analyze.run_analyze` and
:func:`srollout.stages.sweep.run_sweep`; both read their input through
:func:`srollout.stages.buffer.load_buffer`. The stages that roll groups out (``collect``,
``ab_rollout``) build their tasks, policy, environments and gate with
:mod:`srollout.stages.rollout_setup`. Stages never call each other's internals.
"""
