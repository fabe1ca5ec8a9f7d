"""srollout.core: the pure selective-rollout algorithm (no torch, no engine, no file I/O except
gate.json).

- :mod:`srollout.core.signals` — the seven mid-rollout divergence signals of a group at step K
  (d_K = mean pairwise prefix edit distance, ..., τ_K = termination fraction);
- :mod:`srollout.core.gate` — the gate rules R1 (d_K < d_L) and R3 (… or τ_K >= t_high),
  gate.json save/load, and the one-call :func:`~srollout.core.gate.should_cut`;
- :mod:`srollout.core.grpo` — group advantages, zero-variance labels, loss denominators;
- :mod:`srollout.core.sweep` — TP/FP, precision/recall, safe/raw/measured savings over a grid
  of gates, random-cut and oracle references, the operating point under a precision floor;
- :mod:`srollout.core.stats` — Spearman, AUROC, seeded (paired) bootstrap, exact McNemar.
- :mod:`srollout.core.arms` — the arm type (gate / DAPO / GRESO switches), DAPO refill, GRESO
  skipping;
- :mod:`srollout.core.ab_scoring` — scoring of a matched-seed A/B: wall-clock attribution, cuts
  judged by the baseline arm, the seed-match proof, savings with their CIs.

Drop the gate into your own GRPO loop::

    from srollout.core.gate import should_cut

    # actions_by_traj[i] = the normalised actions trajectory i took so far (shorter = it ended)
    shelf_1 = ["go to desk 1", "take pen 1 from desk 1", "go to shelf 1"]
    shelf_2 = ["go to desk 1", "take pen 1 from desk 1", "go to shelf 2"]
    actions_by_traj = [shelf_1] * 7 + [shelf_2]  # a group of G = 8 at step K = 3
    if should_cut(actions_by_traj, K=3, d_L=0.12):  # d_K = 7 pairs * (1/3) / 28 = 0.083: cut
        ...  # stop the group now and drop it from the GRPO batch

Or keep a gate chosen by ``srollout sweep``::

    from srollout.core.gate import load_gate
    gate = load_gate("runs/sweep-.../gate.json")
    cut = gate.should_cut(actions_by_traj)  # evaluate once the group reaches step gate.K
"""
