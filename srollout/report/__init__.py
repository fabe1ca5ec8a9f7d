"""Run reports shared by every stage: markdown (``report.md``), rich console tables, PNG figures.

- :mod:`srollout.report.tables` — a Polars table as GitHub markdown or as a rich table, one
  number format for both.
- :mod:`srollout.report.markdown` — :class:`Section` and :func:`write_report` (atomic
  ``report.md`` in the run directory, figures linked by relative path).
- :mod:`srollout.report.figures` — matplotlib (Agg backend, imported lazily) figures of the paper:
  the ρ/AUROC heatmap, a signal's histogram by group label, signal vs reward variance, ρ against
  K for several group sizes, the savings–precision Pareto plot.
- :mod:`srollout.report.ab` — the A/B tables, figures and report of ``ab-rollout``.
- :mod:`srollout.report.onpolicy` — ``train-onpolicy``'s per-seed and aggregated numbers, paired
  tests and figures.

The console and the progress bars are base utilities that low layers use too:
:mod:`srollout.console`, :mod:`srollout.progress`.
"""
