"""srollout.core.gate.resolve_gate: the one place every stage builds its gate (options or
gate.json), and its one rule for K."""

from __future__ import annotations

import json

import pytest

from srollout.config import PAPER_D_L, PAPER_K, AbRolloutConfig, CollectConfig
from srollout.core.gate import (
    _GATE_KINDS,
    GATE_FILE_VERSION,
    Gate,
    GateRule,
    describe_gate,
    register_gate_kind,
    resolve_gate,
)
from srollout.errors import SrolloutError
from srollout.stages.rollout_setup import build_gate


def test_options_left_out_take_the_papers_operating_point():
    gate, K = resolve_gate()
    assert (gate, K) == (GateRule(rule="r1", K=10, d_L=0.12), 10)
    assert (K, gate.d_L) == (PAPER_K, PAPER_D_L)  # GateRule's defaults are the paper's
    gate, K = resolve_gate(K=4, d_L=0.3, rule="r3", t_high=0.75)
    assert (gate.rule, gate.K, gate.d_L, gate.t_high, K) == ("r3", 4, 0.3, 0.75, 4)


def test_a_gate_file_brings_its_own_K(tmp_path):
    path = tmp_path / "gate.json"
    GateRule(rule="r1", K=7, d_L=0.2).save(path)
    gate, K = resolve_gate(
        path, K=3, T_max=30
    )  # --gate excludes --K in every config; the file wins here too
    assert (K, gate.K, gate.d_L) == (7, 7, 0.2)
    # a sweep run directory holding gate.json is read the same way
    assert resolve_gate(tmp_path)[1] == 7


def test_a_gate_without_K_is_an_error_not_a_silent_default(tmp_path):
    class NoStep(Gate):
        def decide(self, signals):
            return False

        def to_dict(self):
            return {"kind": "test-no-step"}

    register_gate_kind("test-no-step", lambda d, source: NoStep())
    try:
        path = tmp_path / "gate.json"
        path.write_text(json.dumps({"kind": "test-no-step", "version": GATE_FILE_VERSION}))
        with pytest.raises(SrolloutError, match="has no step K"):
            resolve_gate(path)
    finally:
        _GATE_KINDS.pop("test-no-step")


def test_K_beyond_T_max_is_refused(tmp_path):
    with pytest.raises(SrolloutError, match=r"gate K=12 is larger than --T-max 10"):
        resolve_gate(K=12, T_max=10)
    path = tmp_path / "gate.json"
    GateRule(K=9).save(path)
    with pytest.raises(SrolloutError, match=r"gate K=9 is larger than --T-max 8"):
        resolve_gate(path, T_max=8)
    assert resolve_gate(path, T_max=9)[1] == 9


def test_collect_and_ab_rollout_resolve_the_same_gate(tmp_path):
    # both stages build their gate through rollout_setup.build_gate from the shared options
    assert (
        build_gate(CollectConfig(K=5, T_max=8))
        == build_gate(AbRolloutConfig(K=5, T_max=8))
        == (GateRule(K=5), 5)
    )
    path = tmp_path / "gate.json"
    GateRule(K=6, d_L=0.05).save(path)
    assert build_gate(CollectConfig(gate=path))[1] == build_gate(AbRolloutConfig(gate=path))[1] == 6


def test_describe_gate_adds_K_to_the_gates_dict():
    assert describe_gate(None, None) is None
    assert describe_gate(GateRule(K=3, d_L=0.25), 3) == {
        **GateRule(K=3, d_L=0.25).to_dict(),
        "K": 3,
    }
