"""The audited gate as a file (srollout.core.audited_gate): round trips, every bad field as one
line, and an audit that starts from a saved calibration (GateAuditor with an audited gate)."""

from __future__ import annotations

import json
import math

import pytest
from test_rollout_audit import MIXED, _group, _sig  # the same hand-made groups

from srollout.core.audit import AuditLedger, Labelled, clopper_pearson_lower
from srollout.core.audited_gate import AuditedGate, unwrap
from srollout.core.gate import GateRule, load_gate, resolve_gate
from srollout.core.learned_gate import LearnedGate, LogisticModel
from srollout.errors import SrolloutError
from srollout.rollout.audit import AUDITED_GATE_FILE, GateAuditor, carried_over


def _ledger() -> AuditLedger:
    rows = [Labelled(1, 0.01, True, "audit"), Labelled(2, 0.05, False, "audit")]
    rows += [Labelled(2, 0.4, False, "through")]
    return AuditLedger(window=20, rows=rows, thresholds={1: 0.12, 2: 0.12})


def _gate(**kw) -> AuditedGate:
    fields = dict(
        base=GateRule("r1", K=10, d_L=0.087),
        fraction=0.5,
        floor=0.85,
        window=20,
        precision_lb=0.61,
        ledger=_ledger(),
    )
    return AuditedGate(**{**fields, **kw})


def test_an_audited_gate_round_trips_and_decides_as_its_base(tmp_path):
    gate = _gate()
    path = gate.save(tmp_path / "gate-audited.json")
    back = load_gate(path)
    assert isinstance(back, AuditedGate)
    assert back.to_dict() == gate.to_dict()
    assert back.base == GateRule("r1", K=10, d_L=0.087) and back.K == 10
    assert back.ledger == _ledger()
    assert back.decide(_sig(0.08)) and not back.decide(_sig(0.09))  # d_K < 0.087
    assert AuditedGate.load(path) == back
    # resolve_gate (every stage's --gate) reads it with its base's K
    assert resolve_gate(path, T_max=20)[1] == 10
    assert unwrap(back) == (back.base, back.ledger, back.confidence)
    assert unwrap(back.base) == (back.base, None, None)
    # a learned base round-trips too; no ledger and no bound are allowed
    model = LogisticModel(
        mean=(0.0,) * 8, std=(1.0,) * 8, coef=(-10.0,) + (0.0,) * 7, intercept=3.0
    )
    learned = AuditedGate(LearnedGate(model, K=15, threshold=0.9), 0.25, 0.9)
    again = load_gate(learned.save(tmp_path / "learned.json"))
    assert again.to_dict() == learned.to_dict() and again.K == 15 and again.ledger is None


def _broken(tmp_path, edit) -> str:
    d = _gate().to_dict()
    edit(d)
    path = tmp_path / "gate.json"
    path.write_text(json.dumps(d))
    with pytest.raises(SrolloutError) as err:
        load_gate(path)
    message = str(err.value)
    assert "\n" not in message and message.startswith(str(path))
    return message


@pytest.mark.parametrize(
    ("edit", "says"),
    [
        (lambda d: d.pop("base"), "gate is missing 'base'"),
        (lambda d: d.pop("audit"), "gate is missing 'audit'"),
        (lambda d: d.pop("precision_floor"), "gate is missing 'precision_floor'"),
        (lambda d: d.update(audit=float("nan")), "audit must be a number in [0.0, 1.0], got nan"),
        (lambda d: d.update(audit=1.5), "audit must be a number in [0.0, 1.0], got 1.5"),
        (
            lambda d: d.update(precision_floor=float("nan")),
            "precision_floor must be a number in (0.0, 1.0], got nan",
        ),
        (lambda d: d.update(precision_floor=1.0), "precision_floor must lie in (0, 1), got 1.0"),
        (lambda d: d.update(precision_floor="high"), "precision_floor must be a number"),
        (lambda d: d.update(confidence=1.0), "confidence must lie in (0, 1), got 1.0"),
        (lambda d: d.update(window=0), "window must be an integer >= 1, got 0"),
        (lambda d: d.update(precision_lb=float("nan")), "precision_lb must be a number"),
        (lambda d: d["base"].update(d_L=float("nan")), "base: d_L must be in [0, 1], got nan"),
        (lambda d: d["base"].pop("K"), "base: gate is missing 'K'"),
        (lambda d: d.update(base={"kind": "fixed", "cut": True, "K": 3}), "got 'fixed'"),
        (lambda d: d.update(base=[1, 2]), "base must be a threshold or learned gate"),
        (lambda d: d["ledger"]["rows"][0].__setitem__(1, float("nan")), "ledger.rows[0] must"),
        (lambda d: d["ledger"]["rows"][1].__setitem__(3, "judge"), "ledger.rows[1] must"),
        (lambda d: d["ledger"]["rows"][2].__setitem__(2, 1), "ledger.rows[2] must"),
        (lambda d: d["ledger"].pop("rows"), "ledger must be an object with"),
        (lambda d: d["ledger"]["thresholds"].update({"3": -0.1}), "ledger.thresholds[3] must"),
        (lambda d: d.update(extra=1), "unknown gate field(s) 'extra'"),
    ],
)
def test_every_bad_field_of_an_audited_gate_is_one_line(tmp_path, edit, says):
    assert says in _broken(tmp_path, edit)


def test_an_audit_starts_from_a_saved_calibration_and_exports_the_next(tmp_path):
    # the saved evidence: 3 audited cuts below d_L 0.2, 2 of them wrong, at iterations 5 and 6
    saved = AuditLedger(
        window=50,
        rows=[
            Labelled(5, 0.02, True, "audit"),
            Labelled(5, 0.10, False, "audit"),
            Labelled(6, 0.15, False, "audit"),
        ],
        thresholds={5: 0.2, 6: 0.2},
    )
    assert [r.iteration for r in carried_over(saved).rows] == [-1, -1, 0]
    assert carried_over(saved).thresholds == {}
    start = AuditedGate(GateRule("r1", K=2, d_L=0.2), 1.0, 0.85, ledger=saved)
    auditor = GateAuditor(start, fraction=1.0, floor=0.85, seed=7, ckpt_dir=tmp_path)
    assert auditor.current_gate() == GateRule("r1", K=2, d_L=0.2)  # the file's threshold
    # this run's first iteration adds one more wrong audit at 0.12: 1 right of 4 below 0.2, upper
    # bound 1 - lower(3 of 4) = 0.75 < 0.85: refuted on the carried evidence plus the new one;
    # the prefix {0.02} (1 of 1) stands, {0.02, 0.10} (1 of 2, upper 0.975) too, adding 0.12
    # (1 of 3: upper 1 - lower(2 of 3) = 0.865) too, all four (0.75) not: d_L -> (0.12 + 0.15)/2
    m = auditor.audit([_group(0, 0.12, True, MIXED, audited=True)], iteration=1)
    assert (m.audited, m.audit_tp, m.audit_fp) == (1, 0, 1)
    assert m.precision_lb == pytest.approx(clopper_pearson_lower(1, 4))
    assert auditor.current_gate().d_L == pytest.approx(0.135)
    auditor.save()
    exported = load_gate(tmp_path / AUDITED_GATE_FILE)
    assert isinstance(exported, AuditedGate)
    assert exported.base.K == 2 and exported.base.d_L == pytest.approx(0.135)
    assert (exported.fraction, exported.floor) == (1.0, 0.85)
    assert len(exported.ledger.rows) == 4 and exported.ledger.thresholds == {1: 0.2}
    # the bound at the exported threshold: 1 right of the 3 audited cuts below 0.135
    assert exported.precision_lb == pytest.approx(clopper_pearson_lower(1, 3))
    assert not math.isnan(exported.precision_lb)
