"""End to end: the audited gate in `collect --audit F` and `ab-rollout --audit F` (issue 35, items
3-4), on the real ALFWorld engine with the noisy expert (fast, no LM).

The numbers are checkable by hand. Seed 7, G=3, T_max=8, the gate r1 at K=3 with d_L=1 (cut iff
d_K < 1) and --audit-floor 0.95: groups 0-3 have d_K at K=3 of 7/9 (mixed), 7/9 (all fail),
8/9 (mixed) and 1 (not cut). Three audited cuts, one right: their one-sided 95 % Clopper-Pearson
upper bound is 1 - 0.05^(1/3) = 0.632 < 0.95, the floor is refuted; the prefix at 7/9 (1 of 2:
upper bound 0.975) is not, so d_L falls to (7/9 + 8/9) / 2 = 5/6. Four audits at 7/9, two right
(upper bound 0.865), refute even that: d_L falls to 7/9 itself.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest
from conftest import linked_docs
from frozen_run import signal_when_frozen

from srollout.core.audit import DEFAULT_FLOOR, Labelled, next_threshold
from srollout.core.gate import FixedGate
from srollout.rollout.records import TIMING_COLUMNS
from srollout.schemas import AB, AB_ARMS, AUDIT, GROUPS, STEPS, TRAJECTORIES, read

ROOT = Path(__file__).resolve().parents[2]
TINY = ["--policy", "noisy-expert", "--G", "3", "--T-max", "8", "--seed", "7"]
GATE = ["--K", "3", "--d-L", "1.0", "--audit", "1.0", "--audit-floor", "0.95"]
COLLECT = ["collect", *TINY, "--groups", "12", "--concurrency", "6", "--signal-K", "3,5", *GATE]
TABLES = ("steps", "trajectories", "groups", "signals", "audit")


def _table(run: Path, name: str) -> pl.DataFrame:
    df = pl.read_parquet(run / f"{name}.parquet")
    return df.drop([c for c in df.columns if c in TIMING_COLUMNS])


def _same_run(a: Path, b: Path) -> None:
    for name in TABLES:
        assert _table(a, name).equals(_table(b, name)), name
    ledger = [json.loads((run / "audit.json").read_text()) for run in (a, b)]
    assert ledger[0] == ledger[1]


def test_collect_audits_every_cut_and_moves_d_L_between_chunks(run_cli, tmp_path):
    out = tmp_path / "run"
    proc = run_cli(*COLLECT, "--workers", "2", "--out", out)
    assert proc.exit_code == 0, proc.stderr[-2000:]
    # an audited collect runs in one process, and its first line says so (no Ray needed)
    assert proc.stdout.splitlines()[0].startswith("--workers 2: one process: --audit moves")
    groups = read(out / "groups.parquet", GROUPS)
    cut = groups.filter(pl.col("cut"))
    # --audit 1.0: every cut is audited, and an audited cut is counted as cut
    assert cut.height > 0 and (groups["audited"] == groups["cut"]).all()
    # chunks of 2 x (concurrency // G) = 4 groups; chunk 1 ran at the start's d_L = 1
    audit = read(out / "audit.parquet", AUDIT)
    assert audit["chunk"].to_list() == [1, 2, 3] and audit["groups"].to_list() == [4, 4, 4]
    assert audit["first_group"].to_list() == [0, 4, 8]
    per_chunk = groups.group_by((pl.col("group_index") // 4 + 1).alias("chunk")).agg(
        pl.col("cut").sum().alias("cuts"), (pl.col("cut") & pl.col("zero_var")).sum().alias("tp")
    )
    joined = audit.join(per_chunk, on="chunk")
    assert (joined["gate/audited"] == joined["cuts"]).all()
    assert (joined["gate/cuts"] == joined["cuts"]).all()
    assert (joined["gate/audit_tp"] == joined["tp"]).all()
    # TP + FP = the cuts; TP = the cut groups whose full outcome (groups.parquet) is zero-variance
    tp, fp = int(audit["gate/audit_tp"].sum()), int(audit["gate/audit_fp"].sum())
    assert tp + fp == cut.height and tp == int(cut["zero_var"].sum()) and 0 < tp < cut.height
    # audited groups ran on to T_max: no trajectory stopped by the gate, each ran 8 steps or won
    trajs = read(out / "trajectories.parquet", TRAJECTORIES).filter(
        pl.col("group_id").is_in(cut["group_id"].to_list())
    )
    assert (trajs["ended_by"] != "gate").all()
    assert ((trajs["n_steps"] == 8) | trajs["success"]).all()
    steps = read(out / "steps.parquet", STEPS).filter(
        pl.col("group_id").is_in(cut["group_id"].to_list())
    )
    assert steps.height == trajs["n_steps"].sum() and steps["step"].max() == 8
    assert audit["gate/audit_steps"].sum() == int((trajs["n_steps"] - 3).clip(0).sum())
    # chunk 1 by hand (module docstring): cuts at 7/9 (mixed), 7/9 (all fail), 8/9 (mixed)
    first = cut.filter(pl.col("group_index") < 4).sort("group_index")
    assert first["gate_d_K"].to_list() == pytest.approx([7 / 9, 7 / 9, 8 / 9])
    assert first["zero_var"].to_list() == [False, True, False]
    assert audit["gate/threshold"].to_list()[:2] == pytest.approx([1.0, 5 / 6])
    # and every chunk's d_L is next_threshold over the chunks before it, as groups.parquet has them
    labelled: list[Labelled] = []
    theta = 1.0
    for chunk, ran_with in zip(audit["chunk"], audit["gate/threshold"], strict=True):
        assert ran_with == pytest.approx(theta)
        part = groups.filter((pl.col("group_index") // 4 + 1) == chunk)
        labelled += [
            Labelled(chunk, d, z, "audit" if c else "through")
            for d, z, c in part.select("gate_d_K", "zero_var", "cut").iter_rows()
            if d is not None
        ]
        theta = next_threshold(theta, labelled, floor=0.95).threshold
    # each chunk ran at its d_L: a group is cut iff its d_K lies below it; so group 8 (8/9, all
    # fail) of chunk 3, at d_L 5/6, was let through though d_L = 1 would have cut it
    ran_at = dict(zip(audit["chunk"], audit["gate/threshold"], strict=True))
    for index, d, was_cut in groups.select("group_index", "gate_d_K", "cut").iter_rows():
        assert d is None or was_cut == (d < ran_at[index // 4 + 1]), index
    g8 = groups.row(8, named=True)
    assert g8["gate_d_K"] == pytest.approx(8 / 9) and not g8["cut"] and ran_at[3] < 8 / 9
    ledger = json.loads((out / "audit.json").read_text())
    assert sum(r[3] == "audit" for r in ledger["rows"]) == cut.height
    assert sorted(ledger["thresholds"]) == ["1", "2", "3"]
    # the summary line, the report, the manifest
    assert f"audit: {cut.height} of {cut.height} cuts audited (TP {tp}, FP {fp};" in proc.stdout
    assert f"threshold 1 -> {theta:.3g} over 3 chunk(s) of 4 groups" in proc.stdout
    assert "## Audited gate (--audit 1, floor 0.95)" in (out / "report.md").read_text()
    manifest = json.loads((out / "manifest.json").read_text())
    assert {"audit.parquet", "audit.json", "audit_chunks.json", "gate-audited.json"} <= set(
        manifest["outputs"]
    )
    assert manifest["audit"]["audited"] == cut.height and manifest["workers"] == 1
    # the calibrated gate: named on the console, at the d_L the next chunk would have run with
    assert f"the gate as calibrated: {out / 'gate-audited.json'}" in proc.stdout
    from srollout.core.gate import load_gate

    assert load_gate(out / "gate-audited.json").base.d_L == pytest.approx(theta)


def test_collect_resume_with_the_ledger_a_chunk_ahead_equals_one_run(run_cli, tmp_path):
    ref, cut = tmp_path / "ref", tmp_path / "cut"
    for run in (ref, cut):
        assert run_cli(*COLLECT, "--out", run).exit_code == 0
    # as if killed after chunk 2's audit.json but before its audit_chunks.json, with a part of
    # chunk 2 and every part of chunk 3 lost: chunks 2-3 run again whole, the ledger cut back to 1
    chunks = json.loads((cut / "audit_chunks.json").read_text())
    chunks["chunks"] = chunks["chunks"][:1]
    (cut / "audit_chunks.json").write_text(json.dumps(chunks))
    for gid in ("g00005", "g00008", "g00009", "g00010", "g00011"):
        shutil.rmtree(cut / "parts" / gid)
    for name in TABLES:
        (cut / f"{name}.parquet").unlink()
    assert len(json.loads((cut / "audit.json").read_text())["thresholds"]) == 3
    resumed = run_cli(*COLLECT, "--out", cut, "--resume")
    assert resumed.exit_code == 0, resumed.stderr[-2000:]
    assert json.loads((cut / "manifest.json").read_text())["resumed_groups"] == 4
    _same_run(ref, cut)
    # the audit is part of the resume key
    other = run_cli(*[a if a != "0.95" else "0.9" for a in COLLECT], "--out", cut, "--resume")
    assert other.exit_code == 2 and "audit_floor" in other.stderr


def test_a_collect_made_before_audit_existed_still_resumes(run_cli, tmp_path):
    out = tmp_path / "old"
    args = ["collect", *TINY, "--groups", "2", "--T-max", "3", "--signal-K", "2", "--out", out]
    assert run_cli(*args).exit_code == 0
    assert "audited" not in pl.read_parquet(out / "groups.parquet").columns  # only with --audit
    manifest = json.loads((out / "manifest.json").read_text())
    for key in ("audit", "audit_floor"):
        del manifest["config"][key]
    (out / "manifest.json").write_text(json.dumps(manifest))
    assert run_cli(*args, "--resume").exit_code == 0


def test_the_floor_under_its_old_name_still_works_says_so_and_old_runs_resume(run_cli, tmp_path):
    """--precision-floor, the audit floor's old name: the same run as --audit-floor, with one
    note line; a run whose manifest says precision_floor resumes under the new name."""
    out = tmp_path / "old-name"
    gate = ["--K", "3", "--d-L", "1.0", "--audit", "1.0", "--precision-floor", "0.95"]
    args = ["collect", *TINY, "--groups", "2", "--signal-K", "3", *gate, "--out", out]
    proc = run_cli(*args)
    assert proc.exit_code == 0, proc.stderr[-2000:]
    assert "note: --precision-floor is now --audit-floor; the old name still works" in proc.stderr
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["config"]["audit_floor"] == 0.95
    manifest["config"]["precision_floor"] = manifest["config"].pop("audit_floor")
    (out / "manifest.json").write_text(json.dumps(manifest))
    new = [a if a != "--precision-floor" else "--audit-floor" for a in args]
    assert run_cli(*new, "--resume").exit_code == 0
    other = run_cli(*[a if a != "0.95" else "0.9" for a in new], "--resume")
    assert other.exit_code == 2 and "audit_floor=0.95" in other.stderr


@pytest.mark.slow  # ~15 s: three collects in real processes
def test_kill_9_during_an_audited_collect_then_resume_equals_one_run(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    env.pop("SROLLOUT_DEBUG", None)
    args = [a if a != "12" else "16" for a in COLLECT]  # 4 chunks of 4 groups
    command = [sys.executable, "-m", "srollout.cli.app", *args]

    def run(*more: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [*command, *more], capture_output=True, text=True, timeout=300, env=env, cwd=ROOT
        )

    ref, cut = tmp_path / "ref", tmp_path / "cut"
    assert run("--out", str(ref)).returncode == 0
    # frozen right after the first chunk's rows were saved (the start saves the empty list
    # first), then killed: exactly one of the four chunks is in the file
    after_one_chunk = ("srollout.stages.collect_audit", "CollectAudit._save_rows", 2)
    rc = signal_when_frozen([*args, "--out", str(cut)], after_one_chunk, env, ROOT)
    chunks = json.loads((cut / "audit_chunks.json").read_text())["chunks"]
    assert rc == -signal.SIGKILL and len(chunks) == 1, (rc, chunks)
    assert not (cut / "groups.parquet").exists()
    resumed = run("--out", str(cut), "--resume")
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    _same_run(ref, cut)


def test_ab_rollout_audit_of_every_cut_equals_the_baseline_judgement(run_cli, tmp_path):
    out = tmp_path / "ab"
    args = [
        "ab-rollout",
        *TINY,
        *GATE,
        "--groups",
        "4",
        "--repeats",
        "2",
        "--arms",
        "baseline,gated,gated+dapo",
        "--no-warmup",
        "--n-boot",
        "50",
        "--no-figures",
        "--out",
        out,
    ]
    proc = run_cli(*args)
    assert proc.exit_code == 0, proc.stderr[-2000:]
    ab = read(out / "ab.parquet", AB)
    assert ab.columns[-1] == "audited"
    gated = ab.filter(pl.col("arm").str.starts_with("gated"))
    # --audit 1.0: every cut of every gated arm ran on; the baseline's rows are never audited
    assert (gated["audited"] == gated["cut"]).all() and gated["cut"].sum() > 0
    assert not ab.filter(pl.col("arm") == "baseline")["audited"].any()
    # an audited cut's own outcome is full, and with the same seeds it is the baseline twin's
    twins = gated.filter(pl.col("audited") & pl.col("baseline_zero_var").is_not_null())
    assert (twins["zero_var"] == twins["baseline_zero_var"]).all()
    arms = {r["arm"]: r for r in read(out / "arms.parquet", AB_ARMS).iter_rows(named=True)}
    g = arms["gated"]
    assert (g["audited"], g["audit_tp"], g["audit_fp"]) == (g["cuts"], g["cut_tp"], g["cut_fp"])
    assert arms["baseline"]["audited"] is None and arms["baseline"]["audit_threshold"] is None
    # gated+dapo: its extra rounds' cuts have no baseline twin; its twins' verdicts agree
    d = arms["gated+dapo"]
    mine = gated.filter(pl.col("arm") == "gated+dapo")
    assert d["audited"] == d["cuts"] == mine["cut"].sum()
    assert d["audit_tp"] == int((mine["audited"] & mine["zero_var"]).sum())
    assert int((twins.filter(pl.col("arm") == "gated+dapo")["zero_var"]).sum()) == d["cut_tp"]
    # the gated arm's four timed runs by hand (module docstring): groups 0-1 (two cuts at 7/9,
    # one right) hold d_L = 1; group 2 (8/9, mixed) refutes it: 5/6; groups 0-1 again (7/9)
    # refute 5/6: 7/9, and no group of 2-3 lies below 7/9
    blocks = pl.read_parquet(out / "blocks.parquet").filter(pl.col("arm") == "gated").sort("order")
    assert blocks["audit_threshold"].to_list() == pytest.approx([1.0, 1.0, 5 / 6, 7 / 9])
    assert blocks["audited"].to_list() == [2, 1, 2, 0]
    assert blocks["audit_tp"].to_list() == [1, 0, 1, 0]
    assert blocks["audit_next_threshold"].to_list() == pytest.approx([1.0, 5 / 6, 7 / 9, 7 / 9])
    assert blocks["audited"].sum() == g["audited"]
    assert g["audit_next_threshold"] == pytest.approx(7 / 9)
    assert math.isnan(g["audit_precision_lb"])  # nothing audited below 7/9 in the last run
    ledger = json.loads((out / "gated" / "audit.json").read_text())
    assert list(ledger["thresholds"].values()) == pytest.approx([1.0, 1.0, 5 / 6, 7 / 9])
    report = (out / "report.md").read_text()
    assert "**Audited gate** (`--audit 1 --audit-floor 0.95`)" in report
    assert "The audit's TP / FP are its own; the cuts' TP / FP beside them" in linked_docs(report)
    assert "| 5 (2 / 3), bound —, threshold 0.778 → 0.778 |" in report
    # --resume after a kill during repeat 1 (its timed runs' files lost): the same A/B
    before = _ab(out)
    for arm in ("baseline", "gated", "gated+dapo"):
        for f in (out / arm / "r1").glob("block-*.json"):
            f.unlink()
    again = run_cli(*args, "--resume")
    assert again.exit_code == 0, again.stderr[-2000:]
    assert _ab(out).equals(before)
    assert json.loads((out / "gated" / "audit.json").read_text()) == ledger


def _ab(out: Path) -> pl.DataFrame:
    timing = ("wall_s", "gen_s", "env_s", "reset_s", "overhead_s", "group_wall_s")
    return pl.read_parquet(out / "ab.parquet").drop(timing)


@pytest.mark.parametrize(
    "command, args, message",
    [
        (
            "collect",
            ["--K", "3", "--audit", "1.5"],
            "--audit must be a fraction in [0, 1], got 1.5",
        ),
        (
            "collect",
            ["--K", "3", "--audit", "0.5", "--audit-floor", "1.0"],
            "--audit-floor must lie in (0, 1), got 1.0",
        ),
        (
            "collect",
            ["--K", "3", "--audit", "0.5", "--audit-floor", "0"],
            "--audit-floor must lie in (0, 1), got 0.0",
        ),
        (
            "collect",
            ["--audit", "0.5"],
            "--audit audits a gate's cuts and stops: turn one on (--gate, --K, --d-L or --stall)",
        ),
        ("collect", ["--gate", "FIXED", "--audit", "0.5"], "--audit moves a rule gate's d_L"),
        ("ab-rollout", ["--audit", "-0.1"], "--audit must be a fraction in [0, 1], got -0.1"),
        (
            "ab-rollout",
            ["--audit", "0.5", "--audit-floor", "1"],
            "--audit-floor must lie in (0, 1), got 1.0",
        ),
        (
            "ab-rollout",
            ["--audit", "0.5", "--arms", "baseline,dapo"],
            "--audit audits a gated arm's cuts and a stall arm's stops: --arms has neither",
        ),
        ("ab-rollout", ["--gate", "FIXED", "--audit", "0.5"], "--audit moves a rule gate's d_L"),
    ],
)
def test_bad_audit_input_is_one_line_exit_2_and_writes_nothing(
    run_cli, monkeypatch, tmp_path, command, args, message
):
    monkeypatch.delenv("SROLLOUT_DEBUG", raising=False)
    fixed = FixedGate(cut=True, K=3).save(tmp_path / "gate.json")
    args = [str(fixed) if a == "FIXED" else a for a in args]
    out = tmp_path / "r"
    proc = run_cli(command, "--policy", "noisy-expert", "--quick", "--out", out, *args)
    assert proc.exit_code == 2, proc.stderr
    assert message in proc.stderr
    assert "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    assert not out.exists()


def test_the_audit_options_are_declared_once_with_the_floor_of_core_audit():
    from srollout.config import (
        AUDIT_PRECISION_FLOOR,
        AbRolloutConfig,
        CollectConfig,
        TrainOnpolicyConfig,
        help_for,
    )
    from srollout.rundir import ADDED_OPTIONS

    assert AUDIT_PRECISION_FLOOR == DEFAULT_FLOOR == ADDED_OPTIONS["audit_floor"]
    assert CollectConfig().audit_floor == AbRolloutConfig().audit_floor == DEFAULT_FLOOR
    assert TrainOnpolicyConfig.__dataclass_fields__["audit_floor"].default == DEFAULT_FLOOR
    assert "between chunks of groups" in help_for(CollectConfig, "audit")
    assert "between an arm's timed runs" in help_for(AbRolloutConfig, "audit")
    for config in (CollectConfig, AbRolloutConfig, TrainOnpolicyConfig):
        assert "trajectory gate's stops (--stall, the stall arms) plays on" in help_for(
            config, "audit"
        )
    assert "between iterations" in help_for(TrainOnpolicyConfig, "audit")
