"""srollout.core: the pure selective-rollout algorithm (no torch, no engine, no file I/O except
gate.json).

Which module holds which concept: docs/architecture.md ("Where each concept lives").

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
