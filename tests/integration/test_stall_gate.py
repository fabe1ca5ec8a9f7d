"""The trajectory gate end to end on the real ALFWorld engine (the noisy expert: fast, no LM):
`collect --stall W --stall-from K0` stops exactly the trajectories, at exactly the steps, that the
offline evaluator (`sweep --stall`) finds in the ungated run with the same seed; a stopped
trajectory is its ungated twin's prefix; `sweep --stall` chooses a rule and its gate-stall.json
drives `collect --gate`; bad input is one line and exit 2, nothing written."""

from __future__ import annotations

import json

import numpy as np
import polars as pl
import pytest
from test_cli_collect import srollout

from srollout.core.stall_sweep import stall_stops
from srollout.schemas import STEPS, TRAJECTORIES, read
from srollout.stages.sweep_stall import load_trajectories

RUN = ["--policy", "noisy-expert", "--eps", "0.6", "--groups", "12", "--G", "4", "--T-max", "20"]
RUN += ["--seed", "5", "--signal-K", "5,10"]


@pytest.fixture(scope="module")
def ungated(tmp_path_factory):
    out = tmp_path_factory.mktemp("stall") / "ungated"
    proc = srollout("collect", *RUN, "--out", str(out))
    assert proc.returncode == 0, proc.stderr[-2000:]
    return out


def test_the_offline_loader_reads_each_step_in_place(ungated):
    trajs = load_trajectories(ungated)
    table = read(ungated / "trajectories.parquet", TRAJECTORIES).sort("group_id", "traj_idx")
    steps = read(ungated / "steps.parquet", STEPS).sort("group_id", "traj_idx", "step")
    assert np.array_equal(trajs.n_steps, table["n_steps"].to_numpy())
    assert np.allclose(trajs.step_reward.sum(axis=1), table["reward"].to_numpy())
    # one reward per won trajectory, on its last step: not the final reward on every step
    assert trajs.step_reward.sum() == table["success"].sum()
    assert trajs.step_tokens.sum() == steps["n_gen_tokens"].sum()
    first = steps.filter((pl.col("group_id") == "g00003") & (pl.col("traj_idx") == 2))
    assert trajs.since_new[3 * 4 + 2, : first.height].tolist() == first["steps_since_new"].to_list()
    assert (trajs.since_new[3 * 4 + 2, first.height :] == -1).all()


def test_the_engine_stops_what_the_offline_rule_finds_and_keeps_the_prefix(ungated, tmp_path):
    W, k0 = 3, 6
    out = tmp_path / "stalled"
    proc = srollout("collect", *RUN, "--stall", str(W), "--stall-from", str(k0), "--out", str(out))
    assert proc.returncode == 0, proc.stderr[-2000:]
    full = read(ungated / "trajectories.parquet", TRAJECTORIES).sort("group_id", "traj_idx")
    cut = read(out / "trajectories.parquet", TRAJECTORIES).sort("group_id", "traj_idx")
    expected = stall_stops(load_trajectories(ungated), W, k0)
    assert expected.sum() > 0 and (expected > 0).sum() < full.height  # some stop, not all
    stalled = (cut["ended_by"] == "stalled").to_numpy()
    assert np.array_equal(stalled, expected > 0)
    assert np.array_equal(
        cut["n_steps"].to_numpy(), np.where(expected > 0, expected, full["n_steps"])
    )
    # a stopped trajectory keeps the reward it earned so far (0 here: none of them had won)
    assert (cut.filter(pl.col("ended_by") == "stalled")["reward"] == 0).all()
    # its steps are its ungated twin's first steps, actions, observations and signals included
    keys = ["group_id", "traj_idx", "step"]
    cols = keys + ["action", "observation", "valid", "steps_since_new", "rejected_run"]
    a = read(out / "steps.parquet", STEPS).select(cols).sort(keys)
    b = read(ungated / "steps.parquet", STEPS).select(cols).sort(keys)
    assert a.equals(b.join(a.select(keys), on=keys, how="semi").sort(keys))
    # the stall rule in the recorded signal: at the stop, W steps without news, from step k0
    last = a.join(cut.filter(pl.col("ended_by") == "stalled").select(
        "group_id", "traj_idx", pl.col("n_steps").alias("step")), on=keys)  # fmt: skip
    assert (last["steps_since_new"] >= W).all() and (last["step"] >= k0).all()
    groups = pl.read_parquet(out / "groups.parquet")
    assert groups["n_stalled"].sum() == stalled.sum()
    assert json.loads((out / "manifest.json").read_text())["traj_gate"] == {
        "kind": "stall", "version": 1, "W": W, "k0": k0
    }  # fmt: skip


def test_sweep_stall_chooses_a_rule_whose_gate_file_collect_runs(ungated, tmp_path):
    sweep = tmp_path / "sweep"
    proc = srollout("sweep", str(ungated), "--K", "5", "--T-max", "20", "--n-boot", "50",
                    "--stall", "--stall-W-grid", "2,3,4", "--stall-from-grid", "3,6",
                    "--precision-floor", "0.5", "--n-folds", "3", "--out", str(sweep))  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    table = pl.read_parquet(sweep / "stall.parquet")
    # the 6 stall rules, and the loop detector beside them at each k0 (never chosen)
    assert table["rule"].to_list() == ["stall"] * 6 + ["loop"] * 2
    assert table.filter(pl.col("rule") == "loop")["k0"].to_list() == [3, 6]
    assert table["chosen"].sum() == 1
    chosen = table.filter("chosen").row(0, named=True)
    assert chosen["rule"] == "stall"
    ok = table.filter((pl.col("rule") == "stall") & (pl.col("precision") >= 0.5))
    assert chosen["step_savings"] == ok["step_savings"].max()
    gate = json.loads((sweep / "gate-stall.json").read_text())
    assert (gate["W"], gate["k0"]) == (chosen["W"], chosen["k0"])
    assert "held out (3 folds over 12 groups" in " ".join(proc.stdout.split())
    assert "Trajectory gate" in (sweep / "report.md").read_text()
    out = tmp_path / "from-file"
    proc = srollout("collect", *RUN, "--gate", str(sweep / "gate-stall.json"), "--out", str(out))
    assert proc.returncode == 0, proc.stderr[-2000:]
    stalled = (pl.read_parquet(out / "trajectories.parquet")["ended_by"] == "stalled").sum()
    assert stalled == chosen["n_stops"]
    assert not pl.read_parquet(out / "groups.parquet")["cut"].any()  # no group gate with it


@pytest.mark.parametrize(
    "args,message",
    [
        (["--stall", "-1"], "--stall W must be >= 1 (0 turns it off)"),
        (["--stall", "3", "--stall-from", "0"], "--stall-from must be >= 1, got 0"),
        (["--stall", "3", "--stall-from", "21"], "--stall-from 21 is larger than --T-max 20"),
    ],
)
def test_bad_stall_options_are_one_line(tmp_path, args, message):
    out = tmp_path / "run"
    proc = srollout("collect", *RUN, *args, "--out", str(out))
    assert proc.returncode == 2 and message in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and not out.exists()


@pytest.mark.parametrize(
    "gate,message",
    [
        ({"kind": "stall", "version": 1, "W": 8}, "gate is missing 'k0'"),
        ({"kind": "stall", "version": 1, "W": float("nan"), "k0": 10}, "stall W is NaN"),
        ({"kind": "stall", "version": 1, "W": 0, "k0": 10}, "stall W must be an integer >= 1"),
        ({"kind": "stall", "version": 1, "W": 8, "k0": 25}, "larger than --T-max 20"),
    ],
)
def test_a_bad_stall_gate_file_is_one_line(tmp_path, gate, message):
    path = tmp_path / "gate-stall.json"
    path.write_text(json.dumps(gate))
    out = tmp_path / "run"
    proc = srollout("collect", *RUN, "--gate", str(path), "--out", str(out))
    assert proc.returncode == 2 and message in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and not out.exists()


def test_sweep_stall_refuses_a_gated_run_and_a_table_without_its_columns(ungated, tmp_path):
    gated = tmp_path / "stalled"
    assert srollout("collect", *RUN, "--stall", "3", "--out", str(gated)).returncode == 0
    proc = srollout("sweep", str(gated), "--K", "5", "--T-max", "20", "--stall",
                    "--out", str(tmp_path / "s1"))  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    assert "not an ungated run: a gate stopped or cut" in proc.stderr, proc.stderr
    assert "(ended_by 'stalled': " in proc.stderr, proc.stderr
    assert not (tmp_path / "s1").exists()
    bare = tmp_path / "bare"
    bare.mkdir()
    steps = pl.read_parquet(ungated / "steps.parquet").drop("steps_since_new")
    steps.write_parquet(bare / "steps.parquet")
    trajs = pl.read_parquet(ungated / "trajectories.parquet").drop("initial_observation")
    trajs.write_parquet(bare / "trajectories.parquet")
    proc = srollout("sweep", str(bare), "--K", "5", "--T-max", "20", "--stall",
                    "--out", str(tmp_path / "s2"))  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    assert "neither steps' steps_since_new nor" in proc.stderr
    assert "no column(s) initial_observation" in proc.stderr
    # a table written before the column existed: computed from the observations, same stops
    old = tmp_path / "old"
    old.mkdir()
    steps.write_parquet(old / "steps.parquet")
    (ungated / "trajectories.parquet").link_to(old / "trajectories.parquet")
    a, b = load_trajectories(old), load_trajectories(ungated)
    assert np.array_equal(a.since_new, b.since_new) and np.array_equal(a.group, b.group)


def test_ab_rollout_judges_each_stop_by_its_baseline_twin(tmp_path):
    W, k0 = 3, 6
    out = tmp_path / "ab"
    proc = srollout("ab-rollout", "--policy", "noisy-expert", "--eps", "0.6", "--groups", "8",
                    "--G", "4", "--T-max", "20", "--stall", str(W), "--stall-from", str(k0),
                    "--arms", "baseline,stall",
                    "--repeats", "1", "--blocks", "2", "--no-warmup",
                    "--n-boot", "100", "--out", str(out))  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    arms = pl.read_parquet(out / "arms.parquet")
    base, gated = arms.row(0, named=True), arms.row(1, named=True)
    assert (base["arm"], gated["arm"], gated["stall"], gated["gate"]) == (
        "baseline", "stall", True, False
    )  # fmt: skip
    # the stops are the ones the offline rule finds in the baseline arm (same seeds, same
    # prefixes), judged by whether that baseline trajectory failed
    baseline = load_trajectories(out / "baseline" / "r0")
    expected = stall_stops(baseline, W, k0)
    assert gated["stalls"] == (expected > 0).sum() > 0 and base["stalls"] == 0
    assert gated["stall_tp"] == ((expected > 0) & ~baseline.success).sum()
    assert gated["stall_fp"] == ((expected > 0) & baseline.success).sum()
    # every trajectory matches its twin up to its stop; no group gate ran
    assert gated["traj_matched"] == gated["traj_compared"] == 32 and gated["cuts"] == 0
    saved = 1 - gated["n_steps"] / base["n_steps"]
    assert saved > 0 and "trajectories stopped" in proc.stdout
    assert (out / "figures" / "ab_stops.png").stat().st_size > 0
    assert "Trajectories stopped by the trajectory gate" in (out / "report.md").read_text()


def test_ab_rollout_refuses_a_stall_rule_no_arm_applies(tmp_path):
    out = tmp_path / "ab"
    proc = srollout("ab-rollout", "--policy", "noisy-expert", "--groups", "4", "--G", "4",
                    "--T-max", "12", "--stall", "3", "--out", str(out))  # fmt: skip
    assert proc.returncode == 2 and "add stall, gated+stall" in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and not out.exists()


@pytest.fixture(scope="module")
def stall_training(tmp_path_factory):
    """train-onpolicy's stall arm from a gate-stall.json (W 1 from step 3), audited and judged."""
    tmp_path = tmp_path_factory.mktemp("stall-train")
    path = tmp_path / "gate-stall.json"
    path.write_text(json.dumps({"kind": "stall", "version": 1, "W": 1, "k0": 3}))
    out = tmp_path / "train"
    base = ["train-onpolicy", "--preset", "tiny", "--seeds", "7", "--T-max", "12"]
    # audited and judged too: the tests of both read this one run
    audit = ["--audit", "0.5", "--audit-floor", "0.9", "--judge-cuts"]
    proc = srollout(
        *base, "--arms", "baseline,stall", "--gate", str(path), *audit, "--out", str(out)
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return out


def test_train_onpolicy_stall_arm_from_a_gate_file(stall_training, tmp_path):
    out, path = stall_training, stall_training.parent / "gate-stall.json"
    base = ["train-onpolicy", "--preset", "tiny", "--seeds", "7", "--T-max", "12"]
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["traj_gate"] == {"kind": "stall", "version": 1, "W": 1, "k0": 3}
    m = pl.read_parquet(out / "metrics.parquet")
    per_arm = {a: m.filter(pl.col("arm") == a) for a in ("baseline", "stall")}
    assert per_arm["baseline"]["gate/stalled"].sum() == 0
    assert per_arm["stall"]["gate/stalled"].sum() > 0
    # stopped trajectories stay in the batch: as many trajectories trained on in both arms
    assert per_arm["stall"]["train/trajectories"].to_list() == (
        per_arm["baseline"]["train/trajectories"].to_list()
    )
    assert (
        per_arm["stall"]["rollout/env_steps"].sum() < per_arm["baseline"]["rollout/env_steps"].sum()
    )
    # no gated arm: the baseline-against-gated summary is left out (it read "saving 100 %"); the
    # arms table compares the stall arm with the baseline
    report = (out / "report.md").read_text()
    assert "## Summary (mean" not in report and "saving 100.0" not in report
    assert "| stall |" in report
    bad = srollout(
        *base, "--arms", "baseline,gated", "--gate", str(path), "--out", str(tmp_path / "x")
    )
    assert bad.returncode == 2 and "it is the rule of the stall arms" in bad.stderr, bad.stderr
    assert len(bad.stderr.strip().splitlines()) == 1 and not (tmp_path / "x").exists()


def test_train_onpolicy_audits_the_stall_arms_stops_and_judges_every_stop(stall_training):
    from srollout.core.audit import AuditLedger, next_threshold
    from srollout.rollout.stop_audit import STOP_AUDIT_FILE, W_of, evidence

    out = stall_training  # W 1 from step 3 (gate-stall.json), audited at F 0.5, floor 0.9
    m = pl.read_parquet(out / "metrics.parquet")
    stall, base = (m.filter(pl.col("arm") == a) for a in ("stall", "baseline"))
    # the judge rolls every stop's group on: each stop is judged once by its twin
    assert (stall["gate/stop_tp"] + stall["gate/stop_fp"] == stall["gate/stalled"]).all()
    assert stall["gate/stalled"].sum() > 0 and stall["gate/stop_audited"].sum() > 0
    assert (stall["gate/stop_audit_tp"] + stall["gate/stop_audit_fp"]).to_list() == (
        stall["gate/stop_audited"].to_list()
    )
    assert base["gate/stall_W"].to_list() == [0, 0, 0] and base["gate/stalled"].sum() == 0
    # an audited trajectory plays on but is not stopped: the batch keeps every trajectory
    assert stall["train/trajectories"].to_list() == base["train/trajectories"].to_list()
    # every W the arm ran with is the ledger's move after the iteration before, from W 1
    ledger = AuditLedger.from_dict(
        json.loads((out / "checkpoints" / "seed7-stall" / STOP_AUDIT_FILE).read_text())
    )
    Ws = stall["gate/stall_W"].to_list()
    assert Ws[0] == 1 and Ws != [1, 1, 1]  # this run's wrong stops move W
    for i, W in enumerate(Ws, start=1):
        assert W_of(ledger.thresholds[i]) == W
        if i < len(Ws):
            theta = ledger.thresholds[i]
            step = next_threshold(theta, evidence(ledger.recent(i), theta), floor=0.9)
            assert W_of(step.threshold) == Ws[i]
    assert sum(r.source == "audit" for r in ledger.rows) == stall["gate/stop_audited"].sum()


def test_collect_in_shadow_plays_everything_out_and_records_what_each_gate_would_do(
    ungated, tmp_path
):
    """`collect --shadow` with the group gate (R1, K 5, d_L 0.9) and the stall rule (W 2 from
    step 5): the tables are the ungated run's (nothing was cut or stopped); each trajectory's
    shadow stop is where the offline evaluator stops it, each group's shadow cut where a real
    gated run cuts it; the report scores both by the full outcomes."""
    from srollout.stages.collect_shadow import shadow_scores

    gates = ["--K", "5", "--d-L", "0.9", "--stall", "2", "--stall-from", "5"]
    shadow, gated = tmp_path / "shadow", tmp_path / "gated"
    proc = srollout("collect", *RUN, *gates, "--shadow", "--out", str(shadow))
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "what the gates would have done" in proc.stdout
    same = ["group_id", "traj_idx", "reward", "n_steps", "ended_by", "success"]
    mine = read(shadow / "trajectories.parquet", TRAJECTORIES).sort("group_id", "traj_idx")
    base = read(ungated / "trajectories.parquet", TRAJECTORIES).sort("group_id", "traj_idx")
    assert mine.select(same).equals(base.select(same))
    steps = ["group_id", "traj_idx", "step", "action", "observation"]
    assert (
        read(shadow / "steps.parquet", STEPS).sort(steps[:3]).select(steps)
        .equals(read(ungated / "steps.parquet", STEPS).sort(steps[:3]).select(steps))
    )  # fmt: skip
    offline = stall_stops(load_trajectories(ungated), 2, 5)
    assert mine["shadow_stop_step"].fill_null(0).to_list() == offline.tolist()
    assert (offline > 0).sum() > 0
    proc = srollout("collect", *RUN, "--K", "5", "--d-L", "0.9", "--out", str(gated))
    assert proc.returncode == 0, proc.stderr[-2000:]
    cuts = pl.read_parquet(gated / "groups.parquet").sort("group_id")["cut_step"]
    groups = pl.read_parquet(shadow / "groups.parquet").sort("group_id")
    assert groups["shadow_cut_step"].to_list() == cuts.to_list() and cuts.is_not_null().any()
    assert not groups["cut"].any() and set(groups["arm"]) == {"collect"}
    scores = shadow_scores(
        {k: shadow / f"{k}.parquet" for k in ("groups", "trajectories", "steps")}
    )
    stops = mine.filter(pl.col("shadow_stop_step").is_not_null())
    assert scores["trajectory gate"].n == stops.height == (offline > 0).sum()
    assert scores["trajectory gate"].right == (~stops["success"]).sum()
    cut = groups.filter(pl.col("shadow_cut_step").is_not_null())
    assert (scores["group gate"].n, scores["group gate"].right) == (
        cut.height,
        cut["zero_var"].sum(),
    )
    report = (shadow / "report.md").read_text()
    assert "## What the gates would have done (shadow)" in report
    bad = srollout("collect", *RUN, "--shadow", "--out", str(tmp_path / "x"))
    assert bad.returncode == 2 and "--shadow records what a gate would do" in bad.stderr


def test_what_if_sets_every_method_side_by_side_on_the_runs_own_groups(ungated, tmp_path):
    from srollout.core.arms import GresoSkipper
    from srollout.core.stall_sweep import crossfit, score_stops

    out = tmp_path / "what-if"
    proc = srollout("what-if", str(ungated), "--K", "5", "--precision-floor", "0.5",
                    "--n-folds", "3", "--n-boot", "50", "--out", str(out))  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    table = {r["method"]: r for r in pl.read_parquet(out / "what-if.parquet").iter_rows(named=True)}
    assert list(table) == ["group gate", "trajectory gate", "loop detector", "DAPO", "GRESO"]
    # the trajectory gate: the stall grid W 2..12 x k0 5..15 (T_max 20 read from the manifest),
    # cross-fitted over 3 folds at floor 0.5, exactly as the offline evaluator does it
    trajs = load_trajectories(ungated)
    grid = [(W, k0) for W in range(2, 13) for k0 in (5, 8, 10, 12, 15)]
    held = score_stops(trajs, crossfit(trajs, grid, 0.5, n_folds=3, seed=0).stop)
    row = table["trajectory gate"]
    assert row["decisions"] == held.n_stops and row["right"] == held.n_stops - held.n_false
    assert row["steps_saved"] == pytest.approx(held.step_savings)
    assert row["precision_low"] <= row["precision"] <= row["precision_high"]
    # DAPO discards every zero-variance group, and is never wrong
    groups = pl.read_parquet(ungated / "groups.parquet").sort("group_index")
    assert table["DAPO"]["decisions"] == table["DAPO"]["right"] == groups["zero_var"].sum()
    # GRESO, replayed in play order with its own draws
    skipper, skips = GresoSkipper(0.5, 0), 0
    for i, g in enumerate(groups.iter_rows(named=True)):
        if skipper.should_skip(g["task_id"], i + 1):
            skips += 1
        else:
            skipper.record(g["task_id"], i + 1, g["zero_var"])
    assert table["GRESO"]["decisions"] == skips
    report = (out / "report.md").read_text()
    assert "GatedRollout.from_env" in report and "stall_from:" in report
    assert (out / "what-if.png").stat().st_size > 0 and (out / "gate-stall.json").exists()
    # a run whose trajectories were stopped has no full outcomes to judge by: one line, nothing
    gated = tmp_path / "stalled"
    assert srollout("collect", *RUN, "--stall", "3", "--out", str(gated)).returncode == 0
    proc = srollout("what-if", str(gated), "--out", str(tmp_path / "w2"))
    assert proc.returncode == 2, proc.stderr
    assert "not an ungated run: a gate stopped or cut" in proc.stderr, proc.stderr
    assert "(ended_by 'stalled': " in proc.stderr, proc.stderr
    assert not (tmp_path / "w2").exists()
    # a table without the columns a method needs: they are named
    bare = tmp_path / "bare"
    bare.mkdir()
    (ungated / "steps.parquet").link_to(bare / "steps.parquet")
    pl.read_parquet(ungated / "trajectories.parquet").drop("task_id", "n_gen_tokens").write_parquet(
        bare / "trajectories.parquet"
    )
    proc = srollout("what-if", str(bare), "--T-max", "20", "--out", str(tmp_path / "w3"))
    assert proc.returncode == 2 and "no column(s) task_id, n_gen_tokens" in proc.stderr
    assert not (tmp_path / "w3").exists()


def test_collect_audits_the_trajectory_gate_and_moves_W_between_chunks(ungated, tmp_path):
    """`collect --stall 3 --stall-from 6 --audit 0.5 --audit-floor 0.25`, in chunks of 4 groups:
    each chunk runs at the W the audits of the chunks before it chose (a floor this low lets W
    move, down to 1, in a run this short). In chunk c, a trajectory
    the rule (W_c, 6) stops in the ungated run (the offline evaluator) is either stopped there or,
    when the seeded draw picks it, audited: it plays on to its ungated end, recording the stop in
    ``audited_stop``; every other trajectory is its ungated twin. audit.parquet's counts are
    these trajectories' counts, and each chunk's W is the ledger's move after the chunk before."""
    from srollout.core.audit import AuditLedger, audit_pick_stop, next_threshold
    from srollout.rollout.stop_audit import STOP_AUDIT_FILE, W_of, evidence
    from srollout.schemas import AUDIT, GROUPS

    out = tmp_path / "audited"
    gates = ["--stall", "3", "--stall-from", "6", "--audit", "0.5", "--audit-floor", "0.25"]
    proc = srollout("collect", *RUN, *gates, "--concurrency", "8", "--out", str(out))
    assert proc.returncode == 0, proc.stderr[-2000:]
    audit = read(out / "audit.parquet", AUDIT).sort("chunk")
    assert audit["chunk"].to_list() == [1, 2, 3] and audit["gate/stall_W"][0] == 3
    assert audit["gate/threshold"].is_nan().all() and audit["gate/audited"].sum() == 0
    full = read(ungated / "trajectories.parquet", TRAJECTORIES).sort("group_id", "traj_idx")
    mine = read(out / "trajectories.parquet", TRAJECTORIES).sort("group_id", "traj_idx")
    index = dict(read(out / "groups.parquet", GROUPS).select("group_id", "group_index").iter_rows())
    offline = load_trajectories(ungated)
    ran_W = dict(zip(audit["chunk"], audit["gate/stall_W"], strict=True))
    assert len(set(ran_W.values())) > 1, ran_W  # W moved
    stops = {W: stall_stops(offline, W, 6) for W in set(ran_W.values())}
    rows = []
    pairs = zip(mine.iter_rows(named=True), full.iter_rows(named=True), strict=True)
    for i, (me, twin) in enumerate(pairs):
        g = index[me["group_id"]]
        chunk = g // 4 + 1
        stop = int(stops[ran_W[chunk]][i])
        picked = stop > 0 and audit_pick_stop(5, g, me["traj_idx"], 0.5)
        if stop and not picked:
            assert (me["ended_by"], me["n_steps"]) == ("stalled", stop), me
            assert me["audited_stop"] is None
        else:  # never stopped, or audited: the ungated trajectory, whole
            assert (me["n_steps"], me["success"]) == (twin["n_steps"], twin["success"])
            assert me["audited_stop"] == (stop if picked else None)
        rows.append((chunk, stop > 0 and not picked, picked, picked and not me["success"],
                     me["n_steps"] - stop if picked else 0))  # fmt: skip
    assert sum(r[2] for r in rows) > 0 and sum(r[1] for r in rows) > 0  # some audited, some not
    for c in (1, 2, 3):
        mine_c = [r for r in rows if r[0] == c]
        row = audit.row(c - 1, named=True)
        assert row["gate/stalled"] == sum(r[1] for r in mine_c)
        assert row["gate/stop_audited"] == sum(r[2] for r in mine_c)
        assert row["gate/stop_audit_tp"] == sum(r[3] for r in mine_c)
        assert row["gate/stop_audit_fp"] == row["gate/stop_audited"] - row["gate/stop_audit_tp"]
        assert row["gate/stop_audit_steps"] == sum(r[4] for r in mine_c)
    # every chunk's W is the ledger's move after the chunk before; the calibrated rule is the next
    ledger = AuditLedger.from_dict(json.loads((out / STOP_AUDIT_FILE).read_text()))
    for c in (1, 2, 3):
        theta = ledger.thresholds[c]
        assert W_of(theta) == ran_W[c]
        step = next_threshold(theta, evidence(ledger.recent(c), theta), floor=0.25)
        if c < 3:
            assert W_of(step.threshold) == ran_W[c + 1]
    calibrated = json.loads((out / "gate-stall-audited.json").read_text())
    assert calibrated == {"kind": "stall", "version": 1, "W": W_of(step.threshold), "k0": 6}
    audited = int(audit["gate/stop_audited"].sum())
    assert f"stop audit: {audited} of {audited + int(audit['gate/stalled'].sum())} stops" in (
        proc.stdout
    )
    assert "`audited_stop`" in (out / "report.md").read_text()


def test_an_audited_stall_collect_resumes_from_its_ledger_a_chunk_ahead(tmp_path):
    """Killed after chunk 2's audit-stall.json but before audit_chunks.json, parts of chunks 2-3
    lost: --resume cuts the ledger back to chunk 1 and rolls chunks 2-3 again, at the same W,
    into the same tables as one run."""
    import shutil

    from srollout.rollout.records import TIMING_COLUMNS

    run = ["collect", *RUN, "--stall", "3", "--stall-from", "6", "--audit", "0.5"]
    run += ["--audit-floor", "0.25", "--concurrency", "8"]
    ref, cut = tmp_path / "ref", tmp_path / "cut"
    for out in (ref, cut):
        proc = srollout(*run, "--out", str(out))
        assert proc.returncode == 0, proc.stderr[-2000:]
    chunks = json.loads((cut / "audit_chunks.json").read_text())
    chunks["chunks"] = chunks["chunks"][:1]
    (cut / "audit_chunks.json").write_text(json.dumps(chunks))
    for gid in ("g00005", "g00008", "g00009", "g00010", "g00011"):
        shutil.rmtree(cut / "parts" / gid)
    tables = ("steps", "trajectories", "groups", "signals", "audit")
    for name in tables:
        (cut / f"{name}.parquet").unlink()
    proc = srollout(*run, "--out", str(cut), "--resume")
    assert proc.returncode == 0, proc.stderr[-2000:]
    for name in tables:
        a, b = (pl.read_parquet(r / f"{name}.parquet") for r in (ref, cut))
        drop = [c for c in a.columns if c in TIMING_COLUMNS]
        assert a.drop(drop).equals(b.drop(drop)), name
    for name in ("audit-stall.json", "gate-stall-audited.json"):
        assert json.loads((ref / name).read_text()) == json.loads((cut / name).read_text())
    assert pl.read_parquet(cut / "audit.parquet")["gate/stall_W"].n_unique() > 1


def test_ab_rollout_audits_every_stall_arms_stops_and_moves_its_W(tmp_path):
    """`ab-rollout --audit 1.0` with the stall arms: every stop plays on to the trajectory's end,
    so the stall arm's trajectories are the baseline's (same seeds), every audited stop is
    labelled by the twin's outcome, no stop stands; W moves from one of the arm's timed runs to
    the next; gated+stall audits its cuts and its stops, each in its own ledger."""
    from srollout.schemas import AB, AB_ARMS

    out = tmp_path / "ab"
    gates = ["--K", "5", "--d-L", "0.9", "--stall", "3", "--stall-from", "6"]
    audit = ["--audit", "1.0", "--audit-floor", "0.25", "--no-warmup", "--no-figures"]
    proc = srollout(
        "ab-rollout", *RUN, *gates, *audit, "--arms", "baseline,stall,gated+stall",
        "--repeats", "2", "--blocks", "2", "--n-boot", "50", "--out", str(out),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    ab = read(out / "ab.parquet", AB)
    per = {
        a: ab.filter(pl.col("arm") == a).sort("repeat", "group_id") for a in ("baseline", "stall")
    }
    assert per["stall"]["n_steps"].to_list() == per["baseline"]["n_steps"].to_list()
    trajs = pl.concat(
        [read(out / "stall" / f"r{r}" / "trajectories.parquet", TRAJECTORIES) for r in (0, 1)]
    )
    audited = trajs.filter(pl.col("audited_stop").is_not_null())
    assert audited.height > 0 and (trajs["ended_by"] != "stalled").all()
    arms = {r["arm"]: r for r in read(out / "arms.parquet", AB_ARMS).iter_rows(named=True)}
    s = arms["stall"]
    assert s["stop_audited"] == audited.height and s["stalls"] == 0
    assert s["stop_audit_tp"] == int((~audited["success"]).sum())
    assert s["stop_audit_fp"] == int(audited["success"].sum())
    assert s["stop_audit_steps"] == int((audited["n_steps"] - audited["audited_stop"]).sum())
    assert s["audited"] is None and arms["baseline"]["stop_audited"] is None
    blocks = pl.read_parquet(out / "blocks.parquet").filter(pl.col("arm") == "stall").sort("order")
    Ws, nexts = blocks["stall_W"].to_list(), blocks["next_stall_W"].to_list()
    assert Ws[0] == 3 and Ws[1:] == nexts[:-1] and len(set(Ws + nexts)) > 1, (Ws, nexts)
    assert s["next_stall_W"] == nexts[-1]
    ledger = json.loads((out / "stall" / "audit-stall.json").read_text())
    assert len(ledger["thresholds"]) == 4  # 2 repeats x 2 blocks
    both = arms["gated+stall"]
    assert both["audited"] == both["cuts"] and both["stop_audited"] > 0
    assert (out / "gated+stall" / "audit.json").exists()
    assert (out / "gated+stall" / "audit-stall.json").exists()
    report = (out / "report.md").read_text()
    assert f"stops {s['stop_audited']} ({s['stop_audit_tp']} / {s['stop_audit_fp']})" in report
