"""srollout.stages.sweep: the rule's cuts agree with the core gate; bootstrap statistics."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from srollout.config import SweepConfig
from srollout.core.stats import ratio_of_sums
from srollout.stages.buffer import load_buffer
from srollout.stages.sweep import bootstrap_operating_point, choose, cut_mask, sweep_table


@pytest.mark.parametrize("rule", ["r1", "r3"])
def test_vectorised_cuts_agree_with_gate_rule_decide(rule: str) -> None:
    from srollout.core.gate import GateRule
    from srollout.core.signals import GroupSignals

    rng = np.random.default_rng(0)
    d = np.round(rng.random(300) * 0.3, 2)  # many values exactly at a threshold
    tau = np.round(rng.random(300), 1)
    for d_L in (0.0, 0.05, 0.12, 0.2):
        t_high = 0.9 if rule == "r3" else None
        gate = GateRule(rule=rule, K=10, d_L=d_L, t_high=t_high)
        expected = [
            gate.decide(GroupSignals(float(di), 0.0, 0.0, 0.0, 0.0, 0.0, float(ti)))
            for di, ti in zip(d, tau, strict=True)
        ]
        assert cut_mask(d, tau, rule, 10, d_L, t_high).tolist() == expected


def test_ratio_of_sums_keeps_a_batch_axis() -> None:
    data = np.array([[1.0, 2.0], [0.0, 2.0], [3.0, 4.0]])
    assert ratio_of_sums(data) == pytest.approx(0.5)
    batch = np.stack([data, data[[0, 0, 0]]])
    assert ratio_of_sums(batch).tolist() == pytest.approx([0.5, 0.5])


def test_never_firing_gate_keeps_plain_grpo(hand_buffer: Path) -> None:
    config = SweepConfig(input=hand_buffer, K=(4,), d_L_grid=(0.0,), T_max=10)
    table = sweep_table(load_buffer(hand_buffer, [4], default_K=(4,)), config)
    row = table.row(0, named=True)
    assert (
        row["n_cut"],
        row["safe_savings"],
        row["raw_savings"],
        row["measured_step_savings"],
    ) == (0, 0.0, 0.0, 0.0)
    assert row["adv_l2_kept"] == pytest.approx(1.0)


def test_bootstrap_interval_of_the_chosen_point_is_seeded_and_brackets_the_estimate(
    hand_buffer: Path,
) -> None:
    config = SweepConfig(
        input=hand_buffer, K=(4,), d_L_grid=(0.05, 0.13), T_max=10, precision_floor=0.6, n_boot=500
    )
    buffer = load_buffer(hand_buffer, [4], default_K=(4,))
    table = sweep_table(buffer, config)
    index = choose(table, 0.6)
    assert index == 1
    one = bootstrap_operating_point(buffer, table, index, config)
    two = bootstrap_operating_point(buffer, table, index, config)
    assert one == two
    by_name = {iv.name: iv for iv in one.intervals}
    assert set(by_name) == {"safe_savings", "raw_savings", "precision", "measured_step_savings"}
    assert by_name["safe_savings"].estimate == pytest.approx(0.3)
    assert by_name["measured_step_savings"].estimate == pytest.approx(24 / 97)
    assert by_name["precision"].estimate == pytest.approx(2 / 3)
    for iv in one.intervals:
        assert iv.low <= iv.estimate <= iv.high


def test_sweep_reads_T_max_from_the_run_it_is_given(tmp_path):
    """A run collected with --T-max 8: its savings formulas use 8, not the paper's 30, whether
    sweep is given the run directory or a table in it; --T-max still overrides; elsewhere 30."""
    import json

    from srollout.config.analysis import SweepConfig, run_T_max
    from srollout.errors import SrolloutError

    run = tmp_path / "run"
    run.mkdir()
    (run / "manifest.json").write_text(json.dumps({"config": {"T_max": 8}}))
    assert SweepConfig(input=run, K=(5,)).T_max == 8
    assert SweepConfig(input=run / "steps.parquet", K=(5,)).T_max == 8
    assert SweepConfig(input=run, K=(5,), T_max=12).T_max == 12
    assert SweepConfig(input=tmp_path, K=(5,)).T_max == 30
    with pytest.raises(SrolloutError, match="^K=10 is larger than T_max=8$"):
        SweepConfig(input=run, K=(10,))
    (run / "manifest.json").write_text("{not json")
    assert run_T_max(run) is None
