"""The stages of the pipeline, one function each, passing Parquet artifacts (DESIGN.md).

Offline stages (no torch): :func:`srollout.stages.analyze.run_analyze` and
:func:`srollout.stages.sweep.run_sweep`; both read their input through
:func:`srollout.stages.buffer.load_buffer`. Stages never call each other's internals.
"""
