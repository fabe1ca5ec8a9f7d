"""GRPO training: the teacher-forcing loss over the rollout's own tokens, off- and on-policy loops.

loss (teacher-forcing GRPO loss, action-token mask), update (one GRPO step: advantages, loss
denominator, micro-batches, metrics), lora (peft adapters with the paper's settings, AdamW),
model (trainable model + gate rule set-up), onpolicy (the Tier-3 loop of one seed and arm),
evaluate (greedy held-out evaluation), checkpoint (per-iteration state for --resume), metrics
(one metrics.parquet row from one record per namespace: rollout/, gate/, train/, time/). The
on-policy run's tables, paired tests and figures are :mod:`srollout.report.onpolicy`. See
docs/training.md.
"""
