"""End to end: `srollout ab-rollout` on the real ALFWorld engine — the noisy expert through the CLI
(fast, no LM), and the tiny Qwen2 policy in-process with a wrapper that counts every row the engine
asks it to generate.

Invariants (issue 6, item 5): a gate that never fires gives two arms with identical trajectories
and tokens; with an always-firing gate every group stops at K; a cut group's post-K steps are
never generated; precision is judged from the baseline arm (a run where it differs from the
gated arm's own truncated rewards).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest

from srollout.config import AbRolloutConfig
from srollout.core.gate import FixedGate
from srollout.errors import SrolloutError
from srollout.schemas import AB, AB_ARMS, GROUPS, STEPS, read

ROOT = Path(__file__).resolve().parents[2]
TIMING = ["gen_s", "env_s", "reset_s", "wall_s", "started_tick", "finished_tick", "arm"]


def srollout(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "COLUMNS": "200"}
    env.pop("SROLLOUT_DEBUG", None)
    return subprocess.run(
        [sys.executable, "-m", "srollout.cli.app", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        cwd=ROOT,
    )


def test_always_cut_gate_is_judged_by_the_baseline_arm(tmp_path):
    gate = FixedGate(cut=True, K=3).save(tmp_path / "gate.json")
    out = tmp_path / "ab"
    proc = srollout(
        "ab-rollout",
        "--policy",
        "noisy-expert",
        "--groups",
        "4",
        "--G",
        "3",
        "--T-max",
        "15",
        "--gate",
        str(gate),
        "--repeats",
        "1",
        "--n-boot",
        "200",
        "--out",
        str(out),
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    ab = read(out / "ab.parquet", AB)
    assert ab.height == 4 * 2 and sorted(set(ab["arm"])) == ["baseline", "gated"]
    gated, base = (
        ab.filter(pl.col("arm") == "gated").sort("group_id"),
        ab.filter(pl.col("arm") == "baseline").sort("group_id"),
    )
    # every gated group stops at K=3: no trajectory takes a 4th step
    assert gated["cut"].all() and (gated["cut_step"] == 3).all() and not base["cut"].any()
    assert read(out / "gated" / "r0" / "steps.parquet", STEPS)["step"].max() <= 3
    assert (gated["n_steps"] <= 3 * 3).all() and (gated["n_traj_matched"] == 3).all()
    # TP/FP from the baseline arm's groups.parquet, never from the truncated rewards
    base_groups = read(out / "baseline" / "r0" / "groups.parquet", GROUPS).sort("group_id")
    zero = base_groups["zero_var"].to_list()
    assert gated["baseline_zero_var"].to_list() == zero and gated["tp"].to_list() == zero
    c = json.loads((out / "manifest.json").read_text())["comparisons"][0]["confusion"]
    tp = sum(zero)
    assert (c["cut"], c["tp"], c["fp"]) == (4, tp, 4 - tp)
    assert c["precision"] == pytest.approx(tp / 4)
    # seed 0 gives a mixed baseline group that the truncated rewards (all 0 at step 3) call
    # zero-variance: the two precisions differ, and the report uses the baseline's
    assert 0 < tp < 4 and c["own_precision"] == 1.0 != c["precision"]
    # the paper's step-based savings: TP (T-K) / (N T) and cut (T-K) / (N T), T=15, K=3, N=4
    assert c["safe"] == pytest.approx(tp * 12 / 60) and c["raw"] == pytest.approx(48 / 60)
    # the timed runs alternate A B | B A and the attributed times sum to each run's clock
    blocks = pl.read_parquet(out / "blocks.parquet").sort("order")
    assert blocks["arm"].to_list() == ["baseline", "gated", "gated", "baseline"]
    per_block = (
        ab.group_by("arm", "block")
        .agg(pl.col("wall_s").sum())
        .join(blocks.select("arm", "block", pl.col("wall_s").alias("clock")), on=["arm", "block"])
    )
    assert (per_block["wall_s"] - per_block["clock"]).abs().max() < 1e-9
    report = (out / "report.md").read_text()
    assert "judged by the baseline arm" in report and "ab_task_time.png" in report
    assert "the same 4 tasks of `eval` (small rooms)" in report
    assert (out / "figures" / "ab_saving_decomposition.png").stat().st_size > 0
    assert "gated vs baseline" in proc.stdout and "seed match" in proc.stdout


@pytest.mark.parametrize(
    "args, message",
    [
        (["--K", "20", "--T-max", "15"], "larger than --T-max"),
        (["--d-L", "1.5"], "--d-L"),
        (["--G", "1"], "--G must be >= 2"),
        (["--repeats", "0"], "--repeats"),
        (["--gate", "/no/such/gate.json"], "/no/such/gate.json"),
        (["--tasks", "no-such-set"], "no-such-set"),
        (["--difficulty", "huge"], "--difficulty: expected one of small, medium"),
        (["--rule", "r3"], "--t-high"),
        (["--arms", "gated,dapo"], "--arms must include baseline"),
        (["--arms", "baseline,dapo2"], "unknown arm 'dapo2'"),
        (
            ["--arms", "baseline,greso", "--greso-history", "/no/such/groups.parquet"],
            "/no/such/groups.parquet",
        ),
        (
            ["--policy", "lm", "--backend", "vllm-server", "--base-url", "http://127.0.0.1:9"],
            "no vLLM server answers",
        ),
    ],
)
def test_bad_input_is_one_line_exit_2_and_writes_nothing(
    run_cli, monkeypatch, tmp_path, args, message
):
    monkeypatch.delenv("SROLLOUT_DEBUG", raising=False)
    out = tmp_path / "r"
    proc = run_cli("ab-rollout", "--policy", "noisy-expert", "--quick", "--out", out, *args)
    assert proc.exit_code == 2, proc.stderr
    assert message in proc.stderr
    assert "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    assert not out.exists()


def test_resume_reruns_only_the_missing_block(tmp_path):
    from srollout.stages.ab_rollout import run_ab_rollout

    cfg = AbRolloutConfig(
        policy="noisy-expert",
        groups=3,
        G=2,
        T_max=5,
        K=2,
        d_L=0.6,
        repeats=1,
        n_boot=50,
        figures=False,
        warmup=False,
        out=tmp_path / "ab",
    )
    first = run_ab_rollout(cfg, progress=False)
    before = pl.read_parquet(first.paths["ab"]).drop(
        "wall_s", "gen_s", "env_s", "reset_s", "overhead_s", "group_wall_s"
    )
    (tmp_path / "ab" / "gated" / "r0" / "block-1.json").unlink()
    again = run_ab_rollout(AbRolloutConfig(**{**cfg.__dict__, "resume": True}), progress=False)
    after = pl.read_parquet(again.paths["ab"]).drop(
        "wall_s", "gen_s", "env_s", "reset_s", "overhead_s", "group_wall_s"
    )
    assert after.equals(before)
    assert json.loads((tmp_path / "ab" / "manifest.json").read_text())["resumed_blocks"] == 3
    with pytest.raises(SrolloutError, match="T_max"):
        run_ab_rollout(
            AbRolloutConfig(**{**cfg.__dict__, "resume": True, "T_max": 6}), progress=False
        )


def test_dapo_arm_through_the_cli(tmp_path):
    # seed 2: the baseline has zero-variance groups among its 3 tasks, so DAPO rolls extra tasks
    out = tmp_path / "ab"
    proc = srollout(
        "ab-rollout",
        "--policy",
        "noisy-expert",
        "--groups",
        "3",
        "--G",
        "3",
        "--T-max",
        "12",
        "--blocks",
        "1",
        "--repeats",
        "1",
        "--seed",
        "2",
        "--arms",
        "baseline,dapo",
        "--dapo-max-rounds",
        "2",
        "--no-warmup",
        "--n-boot",
        "50",
        "--no-figures",
        "--out",
        str(out),
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    ab = read(out / "ab.parquet", AB)
    base, dapo = (
        ab.filter(pl.col("arm") == "baseline").sort("group_index"),
        ab.filter(pl.col("arm") == "dapo").sort("group_index"),
    )
    # round 0 plays the baseline's tasks with the baseline's seeds: the same outcomes
    cols = ["group_id", "task_id", "n_steps", "reward_mean", "zero_var", "label"]
    assert dapo.filter(pl.col("dapo_round") == 0).select(cols).equals(base.select(cols))
    assert (dapo.filter(pl.col("dapo_round") == 0)["n_traj_matched"] == 3).all()
    # extra groups: the next tasks (group indices 3 .. 3 + 2*3 - 1), no baseline twin
    extra = dapo.filter(pl.col("dapo_round") > 0)
    assert (
        extra.height > 0
        and extra["group_index"].is_between(3, 8).all()
        and extra["baseline_zero_var"].is_null().all()
    )
    block = (
        pl.read_parquet(out / "blocks.parquet").filter(pl.col("arm") == "dapo").row(0, named=True)
    )
    assert (
        base["zero_var"].any() and block["extra_rounds"] >= 1 and block["n_extra"] == extra.height
    )
    # full (as many useful groups as tasks) unless the cap was hit after 2 extra rounds
    assert (
        block["n_useful"] == (int(dapo["useful"].sum()))
        and (block["n_useful"] == 3) != block["hit_cap"]
    )
    assert not block["hit_cap"] or block["extra_rounds"] == 2
    arms = {r["arm"]: r for r in read(out / "arms.parquet", AB_ARMS).iter_rows(named=True)}
    assert arms["dapo"]["useful_groups"] == block["n_useful"] and arms["baseline"][
        "useful_groups"
    ] == int((~base["zero_var"]).sum())
    assert arms["dapo"]["groups"] == 3 + extra.height and arms["dapo"][
        "useful_per_s"
    ] == pytest.approx(block["n_useful"] / block["wall_s"])
    assert "ab-rollout: arms" in proc.stdout and "dapo" in proc.stdout
    assert "## Arms" in (out / "report.md").read_text()


# ~1-2 min on 2 loaded cores: a local Ray, 2 workers started for each of 4 timed runs
@pytest.mark.slow
def test_two_workers_write_the_ab_one_worker_writes(tmp_path):
    pytest.importorskip("ray", reason="the `dist` extra (ray) is not installed")
    args = [
        "ab-rollout",
        "--policy",
        "noisy-expert",
        "--groups",
        "4",
        "--G",
        "3",
        "--T-max",
        "10",
        "--K",
        "3",
        "--d-L",
        "0.99",
        "--repeats",
        "1",
        "--concurrency",
        "3",
        "--arms",
        "baseline,gated,dapo",
        "--no-warmup",
        "--n-boot",
        "50",
        "--no-figures",
    ]
    one, two = tmp_path / "one", tmp_path / "two"
    for out, workers in ((one, "1"), (two, "2")):
        proc = srollout(*args, "--workers", workers, "--out", str(out), timeout=600)
        assert proc.returncode == 0, proc.stderr[-3000:]
    timing = ["wall_s", "gen_s", "env_s", "reset_s", "overhead_s", "group_wall_s"]
    a, b = read(one / "ab.parquet", AB).drop(timing), read(two / "ab.parquet", AB).drop(timing)
    assert a.height > 8 and a.equals(b)
    manifest = json.loads((two / "manifest.json").read_text())
    assert (
        manifest["workers"] == 2
        and "workers" not in manifest["config"]
        and "Ray" in manifest["dist"]["ray"]
    )
    blocks = pl.read_parquet(two / "blocks.parquet")
    assert (blocks["workers"] == 2).all()
    # a run's per-task charges are worker-seconds: they sum to 2 x its wall-clock
    charged = read(two / "ab.parquet", AB).group_by("arm", "block").agg(pl.col("wall_s").sum())
    both = charged.join(
        blocks.select("arm", "block", pl.col("wall_s").alias("clock")), on=["arm", "block"]
    )
    assert (both["wall_s"] - 2 * both["clock"]).abs().max() < 1e-9


# --- the tiny LM policy, in-process ---------------------------------------------------------------


class Counting:
    """Wraps a policy; records every (group_id, traj_idx, step) the engine asked it for."""

    def __init__(self, inner) -> None:
        self.inner, self.name = inner, inner.name
        self.rows: list[tuple[str, int, int]] = []

    def act(self, requests):
        self.rows += [(r.key.group_id, r.key.traj_idx, r.step) for r in requests]
        return self.inner.act(requests)

    def finish(self, key):
        return self.inner.finish(key)


def _lm_ab(model: Path, out: Path, **gate):
    torch = pytest.importorskip("torch")
    from srollout.policy import make_policy
    from srollout.stages.ab_rollout import run_ab_rollout

    torch.set_num_threads(1)
    cfg = AbRolloutConfig(
        model=model,
        groups=3,
        G=3,
        T_max=4,
        temperature=1.0,
        n_boot=50,
        blocks=1,
        repeats=1,
        figures=False,
        out=out,
        **gate,
    )
    policy = Counting(make_policy(model=model, temperature=1.0, max_new_tokens=12, seed=0))
    return run_ab_rollout(cfg, progress=False, policy=policy), policy


def _tables(out: Path, arm: str, name: str) -> pl.DataFrame:
    df = pl.read_parquet(out / arm / "r0" / f"{name}.parquet")
    return df.drop([c for c in TIMING if c in df.columns])


def test_a_gate_that_never_fires_gives_identical_arms(default_model, tmp_path):
    result, _ = _lm_ab(default_model, tmp_path / "never", K=2, d_L=0.0)
    out = result.run_dir
    for name in ("steps", "trajectories", "signals"):
        assert _tables(out, "baseline", name).equals(_tables(out, "gated", name)), name
    trajs = _tables(out, "gated", "trajectories")
    assert trajs["token_ids"].list.len().min() > 0  # the LM records its tokens: they were compared
    c = result.comparisons[0]
    assert c.confusion.cut == 0 and c.match.share == 1.0 and c.match.tokens_checked
    assert c.savings["n_gen_tokens"].saving == 0.0 and c.savings["n_steps"].saving == 0.0


def test_a_cut_groups_post_K_steps_are_never_generated(default_model, tmp_path):
    gate = FixedGate(cut=True, K=2).save(tmp_path / "gate.json")
    result, policy = _lm_ab(default_model, tmp_path / "always", gate=gate)
    out = result.run_dir
    gated = pl.read_parquet(out / "gated" / "r0" / "groups.parquet")
    assert gated["cut"].all() and (gated["cut_step"] == 2).all()
    base_steps = pl.read_parquet(out / "baseline" / "r0" / "steps.parquet")
    rows = pl.DataFrame(policy.rows, schema=["group_id", "traj_idx", "step"], orient="row").filter(
        pl.col("group_id").str.len_chars() == 6
    )
    # rows after K were asked for exactly as often as the baseline took them: never by the gated arm
    late_asked = rows.filter(pl.col("step") > 2).height
    assert late_asked == base_steps.filter(pl.col("step") > 2).height > 0
    # rows up to K: once per arm
    assert (
        rows.filter(pl.col("step") <= 2).height == 2 * base_steps.filter(pl.col("step") <= 2).height
    )
    c = result.comparisons[0]
    assert c.match.share == 1.0 and c.savings["n_gen_tokens"].saving > 0
    # the warm-up ran (other group ids, other seeds) and is not in any table
    assert any(len(g) > 6 for g, _, _ in policy.rows)
