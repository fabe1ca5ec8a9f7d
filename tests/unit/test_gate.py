"""Unit tests of srollout.core.gate: rules, validation, gate.json round trip and bad files."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from srollout.core.gate import FixedGate, GateRule, load_gate, register_gate_kind, should_cut
from srollout.core.signals import GroupSignals, compute_signals
from srollout.errors import SrolloutError
from srollout.signal_names import SIGNAL_NAMES


def _signals(d: float, tau: float = 0.0) -> GroupSignals:
    return GroupSignals(d, 0.5, 0.5, 0.5, 0.5, math.nan, tau)


def test_r1_is_strict_threshold_on_d_k():
    gate = GateRule("r1", K=10, d_L=0.12)
    assert gate.decide(_signals(0.11))
    assert not gate.decide(_signals(0.12))  # d_K < d_L, strictly
    assert not gate.decide(_signals(0.5, tau=1.0))  # tau is ignored by R1
    assert not gate.decide(_signals(math.nan))


def test_r3_adds_termination_clause():
    gate = GateRule("r3", K=10, d_L=0.12, t_high=0.9)
    assert gate.decide(_signals(0.11, tau=0.0))
    assert gate.decide(_signals(0.5, tau=0.9))  # tau_K >= t_high
    assert not gate.decide(_signals(0.5, tau=0.875))


def test_never_gate_never_fires_even_on_identical_group():
    identical = [["go to desk 1"] * 10] * 8
    assert compute_signals(identical, 10).prefix_edit_distance_mean == 0.0
    assert not GateRule.never().should_cut(identical)
    assert FixedGate(True).should_cut(identical)
    assert not FixedGate(False).decide(_signals(0.0))


def test_should_cut_hand_worked():
    # 7 identical + 1 differing at step 3: d_3 = 7 pairs * (1/3) / 28 = 1/12 = 0.083 < 0.12.
    shelf_1 = ["go to desk 1", "take pen 1 from desk 1", "go to shelf 1"]
    shelf_2 = ["go to desk 1", "take pen 1 from desk 1", "go to shelf 2"]
    group = [shelf_1] * 7 + [shelf_2]
    assert should_cut(group, K=3, d_L=0.12)
    assert not should_cut(group, K=3, d_L=0.08)
    # Two of eight differ: 12 pairs * 1/3 / 28 = 0.143 -> no cut.
    assert not should_cut([shelf_1] * 6 + [shelf_2] * 2, K=3, d_L=0.12)
    # R3 fires on termination: 7 of 8 trajectories ended before K=3.
    ended = [["look"]] * 7 + [["look", "inventory", "look"]]
    assert should_cut(ended, K=3, d_L=0.01, rule="r3", t_high=0.8)
    assert not should_cut(ended, K=3, d_L=0.01)
    # With observations the full-signal path decides the same.
    obs = [[f"o{t}" for t in range(3)] for _ in group]
    assert should_cut(group, K=3, d_L=0.12, observations=obs)


@settings(max_examples=80, deadline=None)
@given(
    st.lists(st.lists(st.sampled_from("abcd"), max_size=6), min_size=2, max_size=10),
    st.integers(1, 6),
    st.floats(0, 1),
    st.floats(0, 1),
)
def test_should_cut_agrees_with_decide(actions, K, d_L, t_high):
    for gate in (GateRule("r1", K, d_L), GateRule("r3", K, d_L, t_high)):
        s = compute_signals(actions, K)
        assert gate.should_cut(actions) == gate.decide(s)
        assert bool(
            gate.decide_arrays([s.prefix_edit_distance_mean], [s.termination_fraction])[0]
        ) == gate.decide(s)


def test_one_body_decides_one_group_as_it_decides_a_batch():
    # decide_arrays is the rule; one group's floats go through it as they are (a bool back, no
    # array made), a batch as arrays, and decide / should_cut call it
    r3 = GateRule("r3", K=3, d_L=0.12, t_high=0.9)
    assert r3.decide_arrays(0.05, 0.0) is True and r3.decide_arrays(0.5, 0.0) is False
    assert r3.decide_arrays(0.5, 1.0) is True and r3.decide_arrays(float("nan"), 0.0) is False
    d, tau = [0.05, 0.5, 0.5, float("nan")], [0.0, 0.0, 1.0, 0.0]
    batch = r3.decide_arrays(d, tau)
    assert isinstance(batch, np.ndarray) and batch.tolist() == [True, False, True, False]
    assert [r3.decide_arrays(x, t) for x, t in zip(d, tau, strict=True)] == batch.tolist()
    with pytest.raises(SrolloutError, match="r3 needs tau_K"):
        r3.decide_arrays(0.5)
    # a group whose three trajectories all ended before K=3: d_K = 0, τ_K = 1 -> cut by both
    ended = [["a"], ["a"], ["a"]]
    assert r3.should_cut(ended) and GateRule("r1", K=3, d_L=0.0).should_cut(ended) is False


def test_decide_arrays_vectorised():
    d = np.array([0.0, 0.05, 0.12, 0.5, np.nan])
    tau = np.array([0.0, 0.0, 0.0, 1.0, 1.0])
    assert GateRule("r1", d_L=0.12).decide_arrays(d).tolist() == [True, True, False, False, False]
    assert GateRule("r3", d_L=0.12, t_high=0.9).decide_arrays(d, tau).tolist() == [
        True,
        True,
        False,
        True,
        True,
    ]
    named = {name: d for name in SIGNAL_NAMES}  # the contract's default: decide() row by row
    assert FixedGate(True).decide_batch(10, named).tolist() == [True] * 5
    assert FixedGate(True).decide_batch(9, named).tolist() == [False] * 5  # only at its K
    assert FixedGate(False).decide_batch(10, named).tolist() == [False] * 5


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"rule": "r2"}, "one of r1, r3"),
        ({"d_L": 1.5}, r"d_L must be in \[0, 1\]"),
        ({"d_L": -0.1}, r"d_L must be in \[0, 1\]"),
        ({"d_L": float("nan")}, r"d_L must be in \[0, 1\]"),
        ({"d_L": "0.1"}, "d_L must be a number"),
        ({"K": 0}, "K must be an integer step >= 1"),
        ({"K": 2.0}, "K must be an integer step >= 1"),
        ({"rule": "r3"}, "r3 needs t_high"),
        ({"rule": "r3", "t_high": 1.2}, r"t_high must be in \[0, 1\]"),
        ({"rule": "r1", "t_high": 0.9}, "only used by rule r3"),
    ],
)
def test_bad_rule_values(kwargs, match):
    with pytest.raises(SrolloutError, match=match) as err:
        GateRule(**kwargs)
    assert "\n" not in str(err.value)


def test_rule_normalisation():
    assert GateRule("R1").rule == "r1"
    assert GateRule("r1", t_high=float("nan")).t_high is None  # a null t_high from a sweep table
    assert isinstance(GateRule(K=np.int64(5)).K, int)


@pytest.mark.parametrize(
    "gate",
    [
        GateRule(),
        GateRule("r3", K=15, d_L=0.2, t_high=0.9),
        GateRule.never(5),
        FixedGate(True, K=3),
    ],
)
def test_save_load_round_trip(tmp_path, gate):
    path = gate.save(tmp_path / "sub" / "gate.json")
    assert load_gate(path) == gate
    assert type(gate).load(path) == gate
    assert load_gate(tmp_path / "sub") == gate  # a run directory holding gate.json
    data = json.loads(path.read_text())
    assert data["version"] == 1 and data["kind"] in ("threshold", "fixed")
    assert not list((tmp_path / "sub").glob(".*.tmp"))  # atomic write leaves no temp file


def test_gate_json_content(tmp_path):
    data = json.loads(GateRule().save(tmp_path / "g.json").read_text())
    assert data == {
        "kind": "threshold",
        "version": 1,
        "rule": "r1",
        "K": 10,
        "d_L": 0.12,
        "t_high": None,
    }


@pytest.mark.parametrize(
    "content, match",
    [
        (None, "no such gate file"),
        ("{not json", "not valid JSON"),
        ("[1, 2]", "must be a JSON object"),
        ('{"kind": "magic"}', "unknown gate kind 'magic'"),
        ('{"rule": "r1", "K": 10, "d_L": 0.1}', "unknown gate kind None"),
        ('{"kind": "threshold", "version": 1, "rule": "r1", "K": 10}', "missing 'd_L'"),
        (
            '{"kind": "threshold", "version": 1, "rule": "r1", "K": 10, "d_L": 0.1, "x": 1}',
            "unknown gate field",
        ),
        (
            '{"kind": "threshold", "version": 99, "rule": "r1", "K": 10, "d_L": 0.1}',
            "version 99 is not supported",
        ),
        (
            '{"kind": "threshold", "version": 1, "rule": "r1", "K": 10, "d_L": 3}',
            r"d_L must be in \[0, 1\]",
        ),
        ('{"kind": "fixed", "version": 1, "cut": "yes"}', "true or false"),
    ],
)
def test_bad_gate_files(tmp_path, content, match):
    path = tmp_path / "gate.json"
    if content is not None:
        path.write_text(content)
    with pytest.raises(SrolloutError, match=match) as err:
        load_gate(path)
    assert "\n" not in str(err.value)
    assert str(path) in str(err.value)


def test_load_wrong_kind_for_class(tmp_path):
    path = FixedGate(False).save(tmp_path / "gate.json")
    with pytest.raises(SrolloutError, match="expected a threshold gate"):
        GateRule.load(path)


def test_registry_extends_loader(tmp_path, monkeypatch):
    import srollout.core.gate as gate_module

    monkeypatch.setattr(gate_module, "_GATE_KINDS", dict(gate_module._GATE_KINDS))  # no leak

    class Learned(FixedGate):
        pass

    def from_dict(d, source):
        return Learned(cut=bool(d["cut"]), K=int(d["K"]))

    register_gate_kind("test-learned", from_dict)
    path = tmp_path / "gate.json"
    path.write_text(json.dumps({"kind": "test-learned", "cut": True, "K": 4}))
    gate = load_gate(path)
    assert isinstance(gate, Learned) and gate.K == 4 and gate.decide(_signals(0.9))


def test_should_cut_bad_parameters():
    with pytest.raises(SrolloutError, match="d_L"):
        should_cut([["a"], ["b"]], K=1, d_L=2.0)
    with pytest.raises(SrolloutError, match="r3 needs t_high"):
        should_cut([["a"], ["b"]], K=1, rule="r3")
    with pytest.raises(SrolloutError, match="G >= 2"):
        should_cut([["a"]], K=1)


def _columns(**given):
    """Three groups' signals by name: every agreement signal 0.5 unless given."""
    from srollout.signal_names import SIGNAL_NAMES

    return {n: np.asarray(given.get(n, [0.5, 0.5, 0.5]), dtype=float) for n in SIGNAL_NAMES} | {
        k: np.asarray(v, dtype=float) for k, v in given.items() if k not in SIGNAL_NAMES
    }


def test_decide_batch_reads_signals_by_name_at_the_gates_own_step():
    cols = _columns(prefix_edit_distance_mean=[0.05, 0.2, math.nan], termination_fraction=[0, 1, 1])
    r1 = GateRule(rule="r1", K=10, d_L=0.12)
    assert r1.decide_batch(10, cols).tolist() == [True, False, False]  # nan never cuts
    assert r1.decide_batch(5, cols).tolist() == [False, False, False]  # not its step
    r3 = GateRule(rule="r3", K=10, d_L=0.12, t_high=0.9)
    assert r3.decide_batch(10, cols).tolist() == [True, True, True]
    # the contract's default (row by row through decide_at) sees step signals by name too
    from srollout.core.gate import Gate

    class Repeats(Gate):
        K = 4

        def decide(self, signals):
            return (
                signals.unique_action_ratio <= 0.3 and signals.as_dict()["invalid_action_rate"] > 0
            )

    cols = _columns(unique_action_ratio=[0.2, 0.2, 0.9], invalid_action_rate=[0.5, 0.0, 0.5])
    assert Repeats().decide_batch(4, cols).tolist() == [True, False, False]
    assert Repeats().decide_batch(3, cols).tolist() == [False, False, False]
    assert Repeats().check_steps() == (4,) and Repeats().check_steps(T_max=3) == ()
    with pytest.raises(SrolloutError, match="^gate K=4 is larger than T_max=3$"):
        Repeats().check(3)


def test_a_learned_gate_decides_a_batch_by_name_as_it_decides_a_matrix():
    from srollout.core.learned_gate import LearnedGate, LogisticModel

    # P(zero-variance) = sigmoid(-5 d_K): 0.5 at d_K = 0, 0.269 at d_K = 0.2; threshold 0.5
    model = LogisticModel(mean=(0.0,) * 8, std=(1.0,) * 8, coef=(-5.0,) + (0.0,) * 7, intercept=0)
    gate = LearnedGate(model, K=10, threshold=0.5)
    cols = _columns(prefix_edit_distance_mean=[0.0, 0.2, 0.01])
    assert gate.decide_batch(10, cols).tolist() == [True, False, False]
    matrix = np.column_stack([cols[n] for n in model.signal_names])
    assert gate.decide_batch(10, cols).tolist() == gate.decide_matrix(matrix).tolist()
    assert gate.decide_batch(5, cols).tolist() == [False, False, False]


def test_a_dataclass_kind_gets_its_gate_json_from_the_contract(tmp_path):
    """A new kind writes no to_dict / from_dict: its fields are the file, each field without a
    default required, no other accepted; decide / stops outside its scope is one line."""
    from dataclasses import dataclass

    from srollout.core.gate import _GATE_KINDS, Gate, gate_kind
    from srollout.core.trajectory_gate import StallGate

    @gate_kind("test-below")
    @dataclass(frozen=True)
    class Below(Gate):
        d_max: float
        K: int = 3

        def decide(self, signals):
            return signals.prefix_edit_distance_mean < self.d_max

    try:
        gate = Below(0.25)
        assert gate.to_dict() == {"kind": "test-below", "version": 1, "d_max": 0.25, "K": 3}
        back = load_gate(gate.save(tmp_path / "gate.json"))
        assert back == gate and back.decide(_signals(0.2)) and not back.decide(_signals(0.3))
        with pytest.raises(SrolloutError, match="gate is missing 'd_max'"):
            Below.from_dict({"kind": "test-below", "K": 3})
        with pytest.raises(SrolloutError, match=r"unknown gate field\(s\) 'W'"):
            Below.from_dict({"kind": "test-below", "d_max": 0.1, "W": 2})
        with pytest.raises(SrolloutError, match="'test-below' gate stops no trajectory"):
            gate.stops(None)
        with pytest.raises(SrolloutError, match="'stall' gate decides no group"):
            StallGate(W=3, k0=5).decide(_signals(0.0))
    finally:
        _GATE_KINDS.pop("test-below")
