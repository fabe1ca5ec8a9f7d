"""GateAuditor (srollout.rollout.audit) on hand-made groups: which cuts it audits, what it
labels, how it moves a rule gate's d_L and a learned gate's threshold, and its checkpoint."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest

from srollout.core.gate import GateRule
from srollout.core.learned_gate import LearnedGate, LogisticModel
from srollout.core.signals import GroupSignals
from srollout.errors import SrolloutError
from srollout.rollout.audit import GateAuditor, knob

ZERO_VAR, MIXED = [0.0, 0.0], [0.0, 1.0]


def _sig(d: float) -> GroupSignals:
    return GroupSignals(d, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0)


def _group(index, d, cut, rewards, audited=False, steps=(4, 6)) -> SimpleNamespace:
    """A finished group as the engine hands it over (cut at step 2 when cut)."""
    return SimpleNamespace(
        spec=SimpleNamespace(index=index),
        gate_signals=_sig(d),
        cut=cut,
        cut_step=2 if cut else None,
        audited=audited,
        rewards=rewards,
        trajs=[SimpleNamespace(actions=["go"] * n) for n in steps],
    )


def test_audited_cuts_are_labelled_by_their_full_outcome_and_priced_in_steps(tmp_path):
    auditor = GateAuditor(
        GateRule("r1", K=2, d_L=0.3), fraction=1.0, floor=0.85, seed=7, ckpt_dir=tmp_path
    )
    groups = [
        _group(0, 0.1, True, ZERO_VAR, audited=True),  # ran on: 2 + 4 steps after its cut
        _group(1, 0.2, True, MIXED, audited=True),
        _group(2, 0.25, True, ZERO_VAR),  # cut, not audited: no label
        _group(3, 0.5, False, MIXED),
        _group(4, 0.6, False, ZERO_VAR),
    ]
    m = auditor.audit(groups, iteration=1)
    assert (m.audited, m.audit_tp, m.audit_fp) == (2, 1, 1)
    assert m.audit_steps == 2 * ((4 - 2) + (6 - 2))
    assert m.threshold == 0.3  # the d_L this iteration ran with
    # 1 of 2 right: the one-sided 95 % bound solves 1 - (1 - p)^2 = 0.05
    assert m.precision_lb == pytest.approx(1 - math.sqrt(0.95), abs=1e-9)
    rows = sorted((r.score, r.zero_var, r.source) for r in auditor.ledger.rows)
    assert rows == [
        (0.1, True, "audit"),
        (0.2, False, "audit"),
        (0.5, False, "through"),
        (0.6, True, "through"),
    ]
    assert auditor.current_gate() == GateRule("r1", K=2, d_L=0.3)  # 2 audits < 19: d_L holds
    assert auditor.export(1).precision_lb == m.precision_lb  # θ held: the same bound


def test_a_bound_below_the_floor_tightens_d_l_and_the_checkpoint_resumes_it(tmp_path):
    rule = GateRule("r1", K=2, d_L=0.3)
    auditor = GateAuditor(rule, fraction=1.0, floor=0.85, seed=7, ckpt_dir=tmp_path)
    # 20 audited cuts at d_K = 0.00 .. 0.19; the 19 most alike were right, the last was not:
    # 19/20 -> bound 0.78 < 0.85; the prefix of 19 clears it (0.854): d_L -> (0.18 + 0.19) / 2
    groups = [_group(i, i / 100, True, ZERO_VAR if i < 19 else MIXED, True) for i in range(20)]
    m = auditor.audit(groups, iteration=1)
    assert (m.audit_tp, m.audit_fp, m.threshold) == (19, 1, 0.3)
    assert m.precision_lb < 0.85
    assert auditor.current_gate().d_L == pytest.approx(0.185)
    # the exported gate carries the bound at the θ it exports, not at the one the iteration ran
    # with: its 19 audits below 0.185 are all right, 0.05 ** (1 / 19)
    assert auditor.export(1).precision_lb == pytest.approx(0.05 ** (1 / 19), abs=1e-9)
    auditor.save()
    again = GateAuditor(
        rule, fraction=1.0, floor=0.85, seed=7, ckpt_dir=tmp_path, iteration=1, resume=True
    )
    assert again.current_gate().d_L == pytest.approx(0.185)
    assert again.ledger == auditor.ledger
    # a checkpoint one iteration behind audit.json forgets the later iteration
    behind = GateAuditor(
        rule, fraction=1.0, floor=0.85, seed=7, ckpt_dir=tmp_path, iteration=0, resume=True
    )
    assert behind.ledger.rows == [] and behind.current_gate().d_L == 0.3


def test_a_share_of_the_cuts_is_audited_the_same_way_on_every_run(tmp_path):
    auditor = GateAuditor(
        GateRule("r1", K=2, d_L=0.9), fraction=0.3, floor=0.85, seed=13, ckpt_dir=tmp_path
    )
    picked = [i for i in range(200) if auditor.picks(i)]
    assert picked == [i for i in range(200) if auditor.picks(i)]
    assert 40 <= len(picked) <= 80  # about 30 % of 200


def test_a_learned_gate_threshold_moves_in_its_own_units(tmp_path):
    # P(zero-variance) = sigmoid(3 - 10 * d_K): the audit's score is 1 - P
    model = LogisticModel(
        mean=(0.0,) * 8, std=(1.0,) * 8, coef=(-10.0,) + (0.0,) * 7, intercept=3.0
    )
    gate = LearnedGate(model=model, K=2, threshold=0.6)
    k = knob(gate)
    assert k.theta == pytest.approx(0.4) and k.shown(k.theta) == pytest.approx(0.6)
    p = 1 / (1 + math.exp(-2.0))  # d_K = 0.1
    assert k.score(_sig(0.1)) == pytest.approx(1 - p)
    auditor = GateAuditor(gate, fraction=1.0, floor=0.85, seed=7, ckpt_dir=tmp_path)
    groups = [_group(i, i / 1000, True, ZERO_VAR if i < 19 else MIXED, True) for i in range(20)]
    m = auditor.audit(groups, iteration=1)
    assert m.threshold == pytest.approx(0.6)  # logged as the gate's own threshold
    # tightened between the 19th and 20th most confident cut: a higher threshold
    s18, s19 = k.score(_sig(0.018)), k.score(_sig(0.019))
    assert auditor.current_gate().threshold == pytest.approx(1 - (s18 + s19) / 2)
    assert auditor.current_gate().threshold > 0.6


def test_a_gate_the_audit_cannot_move_is_one_line(tmp_path):
    from srollout.core.gate import FixedGate

    with pytest.raises(SrolloutError, match="--audit moves a rule gate's d_L or a learned"):
        GateAuditor(FixedGate(True, K=2), fraction=0.5, floor=0.85, seed=7, ckpt_dir=tmp_path)


def test_the_audit_draw_travels_to_ray_workers_unchanged(tmp_path):
    # ab-rollout --workers N ships RolloutSettings.audit (the auditor's bound `picks`) to Ray
    # workers with Ray's cloudpickle: the copy must draw the same groups as the driver
    ray = pytest.importorskip("ray")
    auditor = GateAuditor(
        GateRule("r1", K=2, d_L=0.3), fraction=0.5, floor=0.85, seed=7, ckpt_dir=tmp_path
    )
    copy = ray.cloudpickle.loads(ray.cloudpickle.dumps(auditor.picks))
    draws = [copy(i) for i in range(200)]
    assert draws == [auditor.picks(i) for i in range(200)]
    assert 70 < sum(draws) < 130  # about half, so the comparison is not all-False


def test_a_closed_gate_says_which_band_kept_it_shut(tmp_path):
    from srollout.stages.collect_audit import AuditSummary

    auditor = GateAuditor(
        GateRule("r1", K=2, d_L=0.0), fraction=0.5, floor=0.85, seed=7, ckpt_dir=tmp_path
    )
    assert auditor.band() is None  # no iteration yet
    # 20 groups let through, the nearest 19 of them 17 zero-variance: bound below 0.85
    zero_var = [i not in (3, 7, 19) for i in range(20)]
    groups = [_group(i, i / 100, False, ZERO_VAR if z else MIXED) for i, z in enumerate(zero_var)]
    m = auditor.audit(groups, iteration=1)
    assert auditor.current_gate().d_L == 0.0 and m.audited == 0  # still shut
    band = auditor.band()
    assert (band.n, band.zero_var) == (19, 17)  # 17 of 19 bounds higher than 17 of 20
    summary = AuditSummary(1, 20, 0, 0, 0, 0, 0, math.nan, 0.85, 0.0, 0.0, band)
    assert summary.line().endswith(
        f"no cut: the best band of the groups let through (the 19 nearest the threshold, "
        f"17 zero-variance) bounds precision at {band.precision_lb:.3f} < floor 0.85"
    )
    assert "no cut" not in summary._replace(cuts=1).line()


def test_the_audit_wraps_a_runs_gates_the_same_way_whether_on_or_off(tmp_path):
    from srollout.core.trajectory_gate import StallGate
    from srollout.rollout.audits import Audit
    from srollout.rollout.engine import RolloutSettings
    from srollout.rollout.stop_audit import NO_STOP_AUDIT

    rule, stall = GateRule("r1", K=2, d_L=0.3), StallGate(W=3, k0=10)
    settings = RolloutSettings(G=2, T_max=20, gate=rule)
    groups = [_group(i, i / 100, True, ZERO_VAR if i < 19 else MIXED, True) for i in range(20)]

    off = Audit(rule, stall, fraction=0.0, floor=0.85, seed=7, ckpt_dir=tmp_path / "off")
    assert off.settings(settings) is settings  # nothing moves, nothing is drawn
    assert off.label(groups, 1) == (None, None)
    off.save()
    assert not (tmp_path / "off").exists()

    on = Audit(rule, None, fraction=1.0, floor=0.85, seed=7, ckpt_dir=tmp_path)
    first = on.settings(settings)
    assert (first.gate, first.audit(3), first.traj_gate) == (rule, True, None)
    gate_m, stop_m = on.label(groups, 1)
    # the group gate's audit as GateAuditor's own (test above): 19 of 20 right, d_L tightens
    assert (gate_m.audit_tp, gate_m.audit_fp) == (19, 1) and stop_m == NO_STOP_AUDIT
    assert on.settings(settings).gate.d_L == pytest.approx(0.185)
    on.save()
    assert (tmp_path / "audit.json").exists()
    resumed = Audit(
        rule, None, fraction=1.0, floor=0.85, seed=7, ckpt_dir=tmp_path, iteration=1, resume=True
    )
    assert resumed.settings(settings).gate.d_L == pytest.approx(0.185)

    both = Audit(rule, stall, fraction=0.5, floor=0.9, seed=7, ckpt_dir=tmp_path / "both")
    s = both.settings(settings)
    assert s.traj_gate == stall and s.traj_audit is not None
    with pytest.raises(SrolloutError, match="audit_knob"):  # a gate the audit cannot move
        Audit(SimpleNamespace(audit_knob=lambda: None, kind="odd"), fraction=0.5, floor=0.9, seed=0)
