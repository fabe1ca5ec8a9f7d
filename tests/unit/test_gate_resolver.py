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
from srollout.errors import ArgumentError, SrolloutError
from srollout.stages.rollout_setup import plan_gates


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
    # the core names its own arguments; the CLI shows the flags (test_cli_errors)
    with pytest.raises(ArgumentError, match=r"^K=12 is larger than T_max=10$") as err:
        resolve_gate(K=12, T_max=10)
    assert err.value.values == {"K": 12, "T_max": 10}
    path = tmp_path / "gate.json"
    GateRule(K=9).save(path)
    with pytest.raises(ArgumentError, match=r"^gate K=9 is larger than T_max=8$") as err:
        resolve_gate(path, T_max=8)
    assert err.value.values == {"T_max": 8}  # the file's K is no argument, so no flag
    from srollout.cli.app import cli_line  # the CLI's one translation into flags

    assert cli_line(err.value) == "gate K=9 is larger than --T-max 8"
    with pytest.raises(ArgumentError) as err:
        resolve_gate(K=12, T_max=10)
    assert cli_line(err.value) == "--K 12 is larger than --T-max 10"
    assert resolve_gate(path, T_max=9)[1] == 9


def test_collect_and_ab_rollout_resolve_the_same_gate(tmp_path):
    # both stages' plans build their gates through rollout_setup.plan_gates from the shared
    # options; collect's group gate runs only when asked for, an A/B's gated arm always has one
    assert (
        plan_gates(CollectConfig(K=5, T_max=8))
        == plan_gates(AbRolloutConfig(K=5, T_max=8), group=True)
        == (GateRule(K=5), 5, None)
    )
    assert plan_gates(CollectConfig()) == (None, None, None)
    assert plan_gates(AbRolloutConfig(), group=True) == (GateRule(), 10, None)
    path = tmp_path / "gate.json"
    GateRule(K=6, d_L=0.05).save(path)
    assert plan_gates(CollectConfig(gate=path))[1] == 6
    assert plan_gates(AbRolloutConfig(gate=path), group=True)[1] == 6


def test_the_plan_reads_a_gate_file_once_into_the_gate_of_its_scope(tmp_path, monkeypatch):
    import srollout.core.gate as core_gate
    from srollout.core.trajectory_gate import StallGate

    reads = []
    real = core_gate.load_gate
    monkeypatch.setattr(core_gate, "load_gate", lambda p: reads.append(p) or real(p))
    stall = tmp_path / "gate-stall.json"
    StallGate(W=3, k0=4).save(stall)
    # a stall gate.json is the trajectory gate; no group gate is asked for
    assert plan_gates(CollectConfig(gate=stall, T_max=8)) == (None, None, StallGate(W=3, k0=4))
    assert reads == [stall]
    # an A/B's gated arm then takes the options' (paper) rule beside it
    assert plan_gates(AbRolloutConfig(gate=stall), group=True, stall_arms=True)[:2] == (
        GateRule(),
        10,
    )
    assert len(reads) == 2
    with pytest.raises(SrolloutError, match="it is the rule of the stall arms"):
        plan_gates(AbRolloutConfig(gate=stall), group=True, stall_arms=False)
    with pytest.raises(SrolloutError, match="give either --stall W or a stall gate.json"):
        plan_gates(CollectConfig(gate=stall, stall=2, stall_from=4, T_max=8))
    # no stall rule given: a stall arm runs the default one (W 8 from step 10)
    assert plan_gates(AbRolloutConfig(), stall_arms=True)[2] == StallGate()


def test_describe_gate_adds_K_to_the_gates_dict():
    assert describe_gate(None, None) is None
    assert describe_gate(GateRule(K=3, d_L=0.25), 3) == {
        **GateRule(K=3, d_L=0.25).to_dict(),
        "K": 3,
    }
