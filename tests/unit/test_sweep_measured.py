"""`sweep --objective measured` and `--features all` (issue 35), on hand-worked buffers.

The tiny buffer (T_max = 12, G = 2, rule r1 with the single d_L 0.3, K = 2 and 4):

- A, 5 groups, all succeed, both trajectories identical and 3 steps long: d_2 = d_4 = 0;
- B, 1 group, all fail, 12 steps, the two trajectories differ at step 2 only: d_2 = 1/2,
  d_4 = 1/4;
- M, 4 mixed groups (rewards 1, 0), 12 steps, different at every step: d_K = 1.

N = 10, 6 zero-variance. At K = 2 the gate cuts A (5 TP), at K = 4 A and B (6 TP); both have
precision 1. Safe savings: K 2 5·10/(10·12) = 0.4167 > K 4 6·8/120 = 0.4, so the paper's formula
chooses K 2. Real steps: total 5·2·3 + 2·12 + 4·2·12 = 150; after K 2 the A groups spend 5·2·1 = 10
(measured 1/15), after K 4 nothing, B 2·8 = 16 (measured 16/150): the measured objective chooses
K 4. A random cut of 5 groups at K 2 saves 5/10 · 110/150 = 11/30 (all steps after K 2: A 10, B
20, M 80), so the gate saves 2/11 of it; of 6 at K 4, 6/10 · 80/150 = 0.32, the gate 1/3 of it.
Generated tokens: n_gen_tokens = t at step t, so a 3-step trajectory has 6, a 12-step one 78:
total 5·2·6 + 2·78 + 8·78 = 840; after K 4 B's trajectories spend 78 − 10 = 68 each: the gate at
K 4 saves 136/840, a random cut of 6 (A 0, B 136, M 8·68) 6/10 · 680/840.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from srollout import schemas
from srollout.config import GateFitConfig, SweepConfig
from srollout.core.learned_gate import (
    FEATURE_NAMES,
    FEATURE_SETS,
    LearnedGate,
    LogisticModel,
    choose_threshold,
    fit_learned_gate,
)
from srollout.core.signals import GroupSignals
from srollout.core.sweep import choose_operating_point, measured_share, random_measured_share
from srollout.errors import SrolloutError
from srollout.stages.buffer import load_buffer
from srollout.stages.sweep import run_sweep
from srollout.stages.sweep_gates import group_data
from tests.conftest import build_steps

T = 12


def _groups() -> dict:
    groups = {}
    for i in range(5):
        groups[f"a{i}"] = ("pick", [([f"a{i}-{t}" for t in range(1, 4)], 1.0)] * 2)
    b = [f"b-{t}" for t in range(1, T + 1)]
    groups["b0"] = ("pick", [(b, 0.0), ([b[0], "b-other", *b[2:]], 0.0)])
    for i in range(4):
        groups[f"m{i}"] = (
            "pick",
            [([f"m{i}-{j}-{t}" for t in range(1, T + 1)], float(j == 0)) for j in range(2)],
        )
    return groups


@pytest.fixture
def tiny(tmp_path: Path) -> Path:
    steps = build_steps(_groups()).with_columns(n_gen_tokens=pl.col("step").cast(pl.Int64))
    run = tmp_path / "tiny"
    schemas.write(steps, run / "steps.parquet", schemas.STEPS)
    return run


def _config(path: Path, tmp_path: Path, objective: str, name: str) -> SweepConfig:
    return SweepConfig(
        input=path,
        K=(2, 4),
        d_L_grid=(0.3,),
        T_max=T,
        n_boot=50,
        out=tmp_path / name,
        objective=objective,
    )


# --- core: hand numbers -----------------------------------------------------------------------


def test_the_objective_picks_the_row_by_its_own_column() -> None:
    rows = [
        {"precision": 1.0, "safe_savings": 0.5, "measured_step_savings": 0.1, "d_L": 0.1},
        {"precision": 0.9, "safe_savings": 0.4, "measured_step_savings": 0.3, "d_L": 0.2},
        {"precision": 0.5, "safe_savings": 0.9, "measured_step_savings": 0.9, "d_L": 0.3},
    ]
    assert choose_operating_point(rows, 0.8) == 0
    assert choose_operating_point(rows, 0.8, "safe") == 0
    assert choose_operating_point(rows, 0.8, "measured") == 1
    # a row without step data (nan) never qualifies under the measured objective
    rows[1]["measured_step_savings"] = math.nan
    assert choose_operating_point(rows, 0.8, "measured") == 0
    with pytest.raises(SrolloutError, match="objective must be one of safe, measured"):
        choose_operating_point(rows, 0.8, "tokens")


def test_measured_and_random_measured_shares_by_hand() -> None:
    remaining, total = [2.0, 0.0, 6.0, 2.0], [4.0, 3.0, 8.0, 5.0]  # Σ total 20, Σ remaining 10
    cut = np.array([[True, True, False, False], [False, False, True, True]])
    assert measured_share(cut, remaining, total).tolist() == [2 / 20, 8 / 20]
    assert random_measured_share(2, remaining, total) == pytest.approx(2 / 4 * 10 / 20)
    assert random_measured_share(0, remaining, total) == 0.0
    with pytest.raises(SrolloutError):
        measured_share(cut, [5.0, 0.0, 0.0, 0.0], total)  # more remaining than spent


def test_count_fp_makes_every_cut_groups_gain_count() -> None:
    scores, zv, gain = [0.9, 0.8, 0.7], [True, True, False], [1.0, 1.0, 50.0]
    # TP gain only: 0.8 and 0.7 tie at 2; the tie goes to the higher precision (0.8: 2/2)
    tp_only = choose_threshold(scores, zv, 0.6, gain)
    assert (tp_only.threshold, tp_only.n_cut, tp_only.value) == (0.8, 2, 2.0)
    # every cut group's gain: 0.7 (precision 2/3 >= 0.6) saves 52
    every = choose_threshold(scores, zv, 0.6, gain, count_fp=True)
    assert (every.threshold, every.n_cut, every.tp, every.value) == (0.7, 3, 2, 52.0)


# --- the sweep stage on the tiny buffer -------------------------------------------------------


def test_safe_and_measured_objectives_choose_different_rows(tiny: Path, tmp_path: Path) -> None:
    safe = run_sweep(_config(tiny, tmp_path, "safe", "safe"), progress=False)
    measured = run_sweep(_config(tiny, tmp_path, "measured", "measured"), progress=False)
    assert (safe.chosen.K, measured.chosen.K) == (2, 4)
    s, m = (r.sweep.filter(pl.col("chosen")).row(0, named=True) for r in (safe, measured))
    assert s["safe_savings"] == pytest.approx(50 / 120)
    assert s["measured_step_savings"] == pytest.approx(10 / 150)
    assert m["safe_savings"] == pytest.approx(48 / 120)
    assert m["measured_step_savings"] == pytest.approx(16 / 150)
    assert m["random_measured_step_savings"] == pytest.approx(0.32)
    assert m["measured_vs_random"] == pytest.approx(1 / 3)
    assert m["measured_token_savings"] == pytest.approx(136 / 840)
    assert m["random_measured_token_savings"] == pytest.approx(0.6 * 680 / 840)
    at_2 = measured.sweep.filter(pl.col("K") == 2).row(0, named=True)
    assert at_2["measured_vs_random"] == pytest.approx(2 / 11)
    # opt-in: the default sweep's table has none of the new columns
    added = {"measured_vs_random", "measured_token_savings", "random_measured_token_savings"}
    assert not added & set(safe.sweep.columns)
    assert "Measured saving against a random cut" not in (safe.run_dir / "report.md").read_text()
    report = (measured.run_dir / "report.md").read_text()
    assert "Measured saving against a random cut" in report and "generated tokens" in report
    assert json.loads((measured.run_dir / "gate.json").read_text())["K"] == 4


def test_measured_objective_without_step_counts_is_one_line(tiny: Path, tmp_path: Path) -> None:
    buffer = load_buffer(tiny, (2, 4), default_K=(2, 4))
    signals_only = tmp_path / "signals.parquet"
    buffer.signals.drop("zero_var").write_parquet(signals_only)
    with pytest.raises(SrolloutError, match="--objective measured needs real step counts"):
        run_sweep(_config(signals_only, tmp_path, "measured", "x"), progress=False)
    assert not (tmp_path / "x").exists()


def test_gate_comparison_chooses_by_the_objective_and_shows_the_random_cut(
    tiny: Path, tmp_path: Path
) -> None:
    gates = GateFitConfig(learned=True, adaptive=True, check_K=(2, 4), n_folds=2)
    tables = {}
    for objective in ("safe", "measured"):
        config = _config(tiny, tmp_path, objective, objective)
        run_dir = run_sweep(config, gates=gates, progress=False).run_dir
        tables[objective] = pl.read_parquet(run_dir / "gates.parquet")
    safe_r1 = tables["safe"].filter(pl.col("selection") == "in-sample").row(0, named=True)
    meas_r1 = tables["measured"].filter(pl.col("selection") == "in-sample").row(0, named=True)
    assert (safe_r1["K"], meas_r1["K"]) == (2, 4)
    assert meas_r1["random_measured_step_savings"] == pytest.approx(0.32)
    assert meas_r1["measured_vs_random"] == pytest.approx(1 / 3)
    assert "measured_vs_random" not in tables["safe"].columns


# --- --features all ---------------------------------------------------------------------------


def _informative_step_signal(n: int = 80, seed: int = 3):
    """Classic signals pure noise; invalid_action_rate 0.7–0.9 in zero-variance groups and 0.1–0.3
    in the others, so only the step signal tells them apart."""
    rng = np.random.default_rng(seed)
    zv = np.arange(n) % 2 == 0
    by_K = {}
    for K in (5, 10):
        classic = rng.random((n, 7))
        logprob = -rng.random(n)
        invalid = np.where(zv, 0.7, 0.1) + 0.2 * rng.random(n)
        by_K[K] = np.column_stack([classic, logprob, invalid])
    return by_K, zv


def test_the_learned_gate_with_all_features_finds_what_only_a_step_signal_says() -> None:
    by_K, zv = _informative_step_signal()
    every = fit_learned_gate(by_K, zv, (10,), (5, 10), T, 0.9).gate
    classic = fit_learned_gate({K: s[:, :7] for K, s in by_K.items()}, zv, (10,), (5, 10), T, 0.9)
    assert every.model.feature_set == "all" and classic.gate.model.feature_set == "classic"
    assert every.model.feature_names == (*FEATURE_SETS["all"], "K")
    # held out, the step signal separates the classes exactly: every zero-variance group, no FP
    assert (every.meta["heldout_tp"], every.meta["heldout_n_cut"]) == (40, 40)
    assert classic.gate.meta["heldout_tp"] < 10  # noise does not reach precision 0.9
    coef = dict(zip(every.model.feature_names, every.model.coef, strict=True))
    assert max(coef, key=lambda f: abs(coef[f])) == "invalid_action_rate"
    assert every.decide_matrix(by_K[10]).tolist() == zv.tolist()


def test_an_all_features_gate_round_trips_and_old_files_load_as_classic(tmp_path: Path) -> None:
    names = (*FEATURE_SETS["all"], "K")
    coef = [0.0] * len(names)
    coef[names.index("invalid_action_rate")] = 10.0
    model = LogisticModel((0.0,) * 7 + (0.0, 0.5, 0.0), (1.0,) * 10, tuple(coef), 0.0, 1.0, names)
    gate = LearnedGate(model, K=10, threshold=0.5)
    loaded = LearnedGate.load(gate.save(tmp_path / "gate.json"))
    assert loaded == gate and loaded.model.feature_set == "all"
    assert json.loads((tmp_path / "gate.json").read_text())["model"]["features"] == list(names)
    base = dict.fromkeys(FEATURE_SETS["classic"], 0.5)
    high = GroupSignals(**base, steps=(("invalid_action_rate", 0.9),))
    low = GroupSignals(**base, steps=(("invalid_action_rate", 0.1),))
    assert loaded.decide(high) and not loaded.decide(low)
    # a group whose step signals were not computed: imputed at the mean, P = sigmoid(0) = 0.5
    assert loaded.proba(GroupSignals(**base)) == pytest.approx(0.5)
    # a gate.json written before the step signals: the eight classic features
    old = gate.to_dict()
    old["model"] = LogisticModel((0.0,) * 8, (1.0,) * 8, (0.0,) * 8, 0.0).to_dict()
    assert old["model"]["features"] == list(FEATURE_NAMES)
    assert LearnedGate.from_dict(old).model.feature_set == "classic"
    shuffled = gate.to_dict()
    shuffled["model"]["features"] = list(reversed(names))
    with pytest.raises(SrolloutError, match="features must be"):
        LearnedGate.from_dict(shuffled)


def test_all_features_on_a_buffer_without_step_signals_is_refused(tiny: Path) -> None:
    buffer = load_buffer(tiny, (2, 4), default_K=(2, 4))  # build_steps has no logprob_mean
    with pytest.raises(SrolloutError, match="needs the step signal action_logprob_mean"):
        group_data(buffer, (2, 4), "all")
    assert group_data(buffer, (2, 4)).signals_by_K[2].shape == (10, 7)


def test_all_features_read_the_step_signals_of_the_buffer(tiny: Path, tmp_path: Path) -> None:
    steps = pl.read_parquet(tiny / "steps.parquet").with_columns(
        logprob_mean=-pl.col("step").cast(pl.Float64) / 10,
        valid=pl.col("group_id").str.starts_with("m") | (pl.col("step") > 1),
    )
    run = tmp_path / "with-steps"
    schemas.write(steps, run / "steps.parquet", schemas.STEPS)
    data = group_data(load_buffer(run, (2, 4), default_K=(2, 4)), (2, 4), "all")
    s = data.signals_by_K[2]
    assert s.shape == (10, 9)
    # groups in group_id order: a0..a4, b0, m0..m3; step 1 of a and b invalid: 2 of 4 steps
    assert s[:, 8].tolist() == [0.5] * 6 + [0.0] * 4
    assert s[:, 7].tolist() == pytest.approx([-0.15] * 10)  # mean of -0.1, -0.2


def test_cli_refuses_features_all_without_step_signals_and_bad_choices(
    tiny: Path, tmp_path: Path, run_cli
) -> None:
    common = ("--K", "2,4", "--T-max", str(T), "--check-K", "2,4", "--n-folds", "2")
    out = tmp_path / "cli"
    result = run_cli("sweep", tiny, *common, "--learned", "--features", "all", "--out", out)
    assert result.exit_code == 2
    assert "needs the step signal action_logprob_mean" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and not out.exists()
    for bad in (("--features", "all"), ("--objective", "tokens"), ("--features", "some")):
        result = run_cli("sweep", tiny, *common, *bad, "--out", out)
        assert result.exit_code == 2 and not out.exists(), bad
