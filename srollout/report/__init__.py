"""Run reports shared by every stage: markdown (``report.md``), rich console tables, PNG figures
(matplotlib, Agg backend, imported lazily); :mod:`srollout.report.ab` and
:mod:`srollout.report.onpolicy` hold the A/B and on-policy stages' own. The console and the
progress bars are base utilities that low layers use too: :mod:`srollout.console`,
:mod:`srollout.progress`."""
