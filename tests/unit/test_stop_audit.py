"""The trajectory gate's audit (``train-onpolicy --audit`` on a stall arm), on hand-made
trajectories worked on paper: which trajectories it labels and how, the W it moves to, and its
ledger across a resume."""

from __future__ import annotations

import math

import numpy as np
import pytest

from srollout.core.audit import audit_pick, audit_pick_stop, clopper_pearson_lower
from srollout.core.stall_sweep import Trajectories, stall_stops
from srollout.core.trajectory_gate import StallGate
from srollout.core.trajectory_signals import longest_stall
from srollout.rollout.engine import GroupRecord, GroupSpec, TrajRecord
from srollout.rollout.stop_audit import STOP_WINDOW, StopAuditor, W_of, stop_score, theta_of


def traj(idx: int, since_new: list[int], *, success: bool, ended_by: str, stop: int | None = None):
    t = TrajRecord(idx, seed=idx, env_seed=idx, ended_by=ended_by, success=success)
    t.steps = [{"steps_since_new": s} for s in since_new]
    t.actions = ["look"] * len(since_new)
    t.audited_stop = stop
    return t


def group(index: int, trajs: list[TrajRecord]) -> GroupRecord:
    return GroupRecord(
        spec=GroupSpec(index=index, task=None), G=len(trajs), arm="stall", trajs=trajs
    )


def test_longest_stall_reads_the_steps_the_gate_was_asked_after():
    since = [0, 1, 2, 0, 1, 2, 3, 4]  # 8 steps; the gate is asked after steps 1..7
    assert longest_stall(since, 1) == 3  # step 8's 4 comes after the last question
    assert longest_stall(since, 5) == 3
    assert longest_stall(since, 7) == 3
    assert longest_stall(since, 8) is None  # no question from step 8 on
    assert longest_stall([0], 1) is None
    # the rule (W, k0) fires iff the longest stall is >= W: W 3 after step 7; W 4 only after
    # step 8, the last, where the gate is not asked (the trajectory ended there)
    one = Trajectories(
        group=np.array([0]),
        n_steps=np.array([len(since)]),
        success=np.array([False]),
        since_new=np.array([since]),
        step_reward=np.zeros((1, len(since))),
        step_tokens=np.zeros((1, len(since)), dtype=np.int64),
    )
    assert stall_stops(one, 3, 1).tolist() == [7]
    assert stall_stops(one, 4, 1).tolist() == [0]


@pytest.mark.parametrize("W", range(1, 31))
def test_theta_and_W_are_one_rule(W):
    assert W_of(theta_of(W)) == W
    # "stop iff -run < theta": a run of W is stopped, a run of W - 1 is not
    assert -W < theta_of(W) <= -(W - 1)


def test_W_of_the_thresholds_the_audit_moves_to():
    assert W_of(-5.5) == 6  # the midpoint between runs 6 and 5: stops 6, lets 5 through
    assert W_of(-4 + 1e-6) == 4  # just above the score of a run of 4: stops it
    assert W_of(-4.0) == 5  # exactly at it: a run of 4 is let through
    assert W_of(3.0) == 1  # never below 1


def test_an_iteration_labels_audited_stops_and_trajectories_let_through(tmp_path):
    gate = StallGate(W=3, k0=3)
    records = [
        group(
            0,
            [
                # stopped and the stop stood: unknown outcome, not in the ledger
                traj(0, [0, 0, 1, 2, 3], success=False, ended_by="stalled"),
                # audited: the gate fired after step 5 (run 3), it played on to step 9, failed
                traj(1, [0, 0, 1, 2, 3, 4, 0, 1, 2], success=False, ended_by="max_steps", stop=5),
                # let through: longest run 2 from step 3 on, won at step 6
                traj(2, [0, 0, 1, 2, 0, 0], success=True, ended_by="done"),
                # ended before the gate was ever asked (won at step 2): nothing to label
                traj(3, [0, 0], success=True, ended_by="done"),
            ],
        )
    ]
    auditor = StopAuditor(gate, fraction=0.5, floor=0.9, seed=7, ckpt_dir=tmp_path)
    assert auditor.W == 3 and auditor.current_gate() == gate
    assert auditor.ledger.window == STOP_WINDOW == 200
    m = auditor.audit(records, iteration=1)
    assert (m.stop_audited, m.stop_audit_tp, m.stop_audit_fp) == (1, 1, 0)
    assert m.stall_W == 3
    assert m.stop_audit_steps == 9 - 5
    assert m.stop_precision_lb == pytest.approx(clopper_pearson_lower(1, 1, 0.95))  # 0.05
    rows = sorted((r.score, r.zero_var, r.source) for r in auditor.ledger.rows)
    assert rows == [(-4.0, True, "audit"), (-2.0, False, "through")]
    # one audit of 29 the floor needs (0.05^(1/29) >= 0.9), not refuted: W holds
    assert auditor.W == 3


def test_stops_that_were_wrong_move_W_up_to_what_the_audits_do_not_refute(tmp_path):
    auditor = StopAuditor(StallGate(W=3, k0=1), fraction=1.0, floor=0.9, seed=7, ckpt_dir=tmp_path)
    # three audited stops, longest runs 6, 5 and 4 (the last step's count is not asked), all won
    trajs = [
        traj(i, [0, *range(1, run + 1), 0], success=True, ended_by="done", stop=4)
        for i, run in enumerate((6, 5, 4))
    ]
    m = auditor.audit([group(0, trajs)], iteration=1)
    assert (m.stop_audited, m.stop_audit_tp, m.stop_audit_fp) == (3, 0, 3)
    assert m.stop_precision_lb == 0.0
    # 0 right of 3: upper bound 1 - 0.05^(1/3) = 0.63 < 0.9, refuted; of the prefixes by run,
    # 0 of 1 is not (upper bound 0.95): W rises to stop only the run of 6
    assert auditor.W == 6
    auditor.save()
    again = StopAuditor(
        StallGate(W=3, k0=1), fraction=1.0, floor=0.9, seed=7, ckpt_dir=tmp_path,
        iteration=1, resume=True,
    )  # fmt: skip
    assert again.W == 6 and again.ledger.rows == auditor.ledger.rows
    # a resume from before that iteration forgets it and starts from the file's W again
    before = StopAuditor(
        StallGate(W=3, k0=1), fraction=1.0, floor=0.9, seed=7, ckpt_dir=tmp_path,
        iteration=0, resume=True,
    )  # fmt: skip
    assert before.W == 3 and before.ledger.rows == []


def test_stop_scores_and_draws():
    assert stop_score(traj(0, [0, 1, 2, 3], success=False, ended_by="max_steps"), 2) == -2.0
    assert math.isnan(stop_score(traj(0, [0, 1], success=False, ended_by="done"), 3))
    draws = [audit_pick_stop(7, g, t, 0.25) for g in range(200) for t in range(8)]
    assert 0.2 < sum(draws) / len(draws) < 0.3  # 1,600 seeded draws at 0.25
    assert draws == [audit_pick_stop(7, g, t, 0.25) for g in range(200) for t in range(8)]
    # a stream of its own: not the group audit's draw for the same numbers
    assert [audit_pick_stop(7, g, 0, 0.5) for g in range(64)] != [
        audit_pick(7, g, 0.5) for g in range(64)
    ]
    assert audit_pick_stop(7, 0, 0, 1.0) and not audit_pick_stop(7, 0, 0, 0.0)


def test_a_judged_and_audited_row_from_before_the_stops_reads_with_their_columns():
    from srollout.training.metrics import (
        AUDIT_COLUMNS,
        JUDGE_COLUMNS,
        NO_STOP_AUDIT,
        STOP_AUDIT_COLUMNS,
        onpolicy_columns,
        upgrade_onpolicy_row,
    )

    now = [c for c in onpolicy_columns() if c != "rollout/adapter_iteration"]
    old_judge = ["gate/cut_tp", "gate/cut_fp", "gate/cut_prefix_matched", "time/judge_s"]
    row = {c: 1 for c in [*now, *old_judge, *AUDIT_COLUMNS]}
    up = upgrade_onpolicy_row(row)
    assert list(up) == [*now, *JUDGE_COLUMNS, *AUDIT_COLUMNS, *STOP_AUDIT_COLUMNS]
    assert (up["gate/stop_tp"], up["gate/stop_fp"]) == (0, 0)
    assert up["gate/stall_W"] == 0 and math.isnan(up["gate/stop_precision_lb"])
    assert {k: up[k] for k in STOP_AUDIT_COLUMNS if k != "gate/stop_precision_lb"} == {
        k: v for k, v in NO_STOP_AUDIT.columns().items() if k != "gate/stop_precision_lb"
    }
    assert all(up[c] == 1 for c in [*now, *old_judge, *AUDIT_COLUMNS])
    # a row of today comes back as it is
    assert upgrade_onpolicy_row(up) == up


def test_what_a_high_W_let_through_counts_below_the_lower_W_it_certified(tmp_path):
    """Iteration 1 runs with W 16 (the gate never fires): 40 trajectories stall 5 steps and
    fail, 20 stall 1 and win, all let through. Their band certifies W 4 (40 of 40 fail: bound
    0.05^(1/40) = 0.928 >= 0.9; with the 20 winners it would not). Iteration 2 at W 4: 30
    audited stops of run 5, 28 failed. Read alone they refute W 4 (bound 0.805) and W would
    jump back to 6; with the 40 let through at W 16, which W 4 stops, 68 of 70 are right (bound
    0.913): W 4 holds. So the audit does not swing between W 4 and W 6 every iteration."""
    from srollout.core.audit import next_threshold
    from srollout.rollout.stop_audit import evidence

    auditor = StopAuditor(
        StallGate(W=16, k0=1), fraction=0.25, floor=0.9, seed=7, ckpt_dir=tmp_path
    )
    stall5 = [0, 1, 2, 3, 4, 5, 0]  # longest stall 5 before the last step
    stall1 = [0, 1, 0]
    first = [traj(i, stall5, success=False, ended_by="max_steps") for i in range(40)]
    first += [traj(40 + i, stall1, success=True, ended_by="done") for i in range(20)]
    m = auditor.audit([group(0, first)], iteration=1)
    assert (m.stall_W, m.stop_audited) == (16, 0)
    assert auditor.W == 4
    second = [traj(i, stall5, success=i >= 28, ended_by="max_steps", stop=5) for i in range(30)] + [
        traj(30 + i, stall1, success=True, ended_by="done") for i in range(10)
    ]
    m = auditor.audit([group(1, second)], iteration=2)
    assert (m.stall_W, m.stop_audited, m.stop_audit_tp) == (4, 30, 28)
    assert m.stop_precision_lb == pytest.approx(clopper_pearson_lower(68, 70))
    assert auditor.W == 4
    # read as the group gate reads its ledger (audits only), the same evidence swings W to 6
    alone = next_threshold(auditor.ledger.thresholds[2], auditor.ledger.recent(2), floor=0.9)
    assert W_of(alone.threshold) == 6 and alone.precision_lb == pytest.approx(
        clopper_pearson_lower(28, 30)
    )
    assert sum(r.source == "audit" for r in evidence(auditor.ledger.recent(2), -3.0)) == 70
