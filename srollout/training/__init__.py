"""GRPO training: the teacher-forcing loss over the rollout's own tokens, off- and on-policy loops
(docs/training.md). The on-policy run's tables, paired tests and figures are
:mod:`srollout.report.onpolicy`."""
