"""The on-policy loop end to end on a tiny real Qwen2 + LoRA in a scripted corridor (no ALFWorld).

The corridor is won by two "forward" moves within T_max; the parser turns a response of even
length into "forward", so whether a trajectory wins depends on what the model samples: groups
are a real mix, advantages are non-zero and updates change the policy.
"""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest
import torch

from srollout.config import TrainOnpolicyConfig
from srollout.envs.base import StepResult, Task
from srollout.rollout.engine import ParsedTurn

torch.set_num_threads(1)

TIMING = [
    "time/rollout_s",
    "time/update_s",
    "time/sync_s",
    "time/iter_s",
    "time/cum_s",
    "time/eval_s",
    "time/warmup_s",
]


class Corridor:
    def __init__(self) -> None:
        self.pos, self.length = 0, 2

    def reset(self, task: Task, seed: int):
        self.task, self.pos = task, 0
        return "cell 0", StepResult("", 0.0, False, True, ("forward", "wait"))

    def step(self, action: str) -> StepResult:
        if action == "forward":
            self.pos += 1
        won = self.pos >= self.length
        return StepResult(
            f"cell {self.pos}", 1.0 if won else 0.0, won, action == "forward", ("forward", "wait")
        )

    def close(self) -> None:
        pass


class Prompter:
    def system(self, task):
        return "You walk a corridor."

    def user(self, observation, step, task, admissible=()):
        return observation

    def parse(self, text):
        action = "forward" if len(text.strip()) % 2 == 0 else "wait"
        return ParsedTurn("", action, action)


TRAIN = [Task(f"train/{i}", "pick_and_place_simple", "walk", "") for i in range(4)]
HELDOUT = [Task(f"heldout/{i}", "pick_and_place_simple", "walk", "") for i in range(3)]


@pytest.fixture(scope="module")
def tiny_model(tiny_policy) -> Path:
    return tiny_policy


def _config(model: Path, out: Path, **kw) -> TrainOnpolicyConfig:
    values = dict(
        seeds=(7,),
        model=model,
        iterations=3,
        prompts_per_iter=2,
        G=4,
        T_max=4,
        K=2,
        eval_every=2,
        n_eval=3,
        train_tasks=4,
        lr=2e-2,
        max_new_tokens=8,
        d_L=0.0,
        out=out,
    )
    values.update(kw)
    return TrainOnpolicyConfig.from_preset("tiny", **values)


def _run(config, **kw):
    from srollout.stages.train_onpolicy import run_train_onpolicy

    return run_train_onpolicy(
        config,
        progress=False,
        env_factory=Corridor,
        prompter=Prompter(),
        train_tasks=TRAIN,
        eval_tasks=HELDOUT,
        **kw,
    )


def _adapter(run_dir: Path, arm: str) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(run_dir / "adapters" / f"seed7-{arm}" / "adapter_model.safetensors")


@pytest.fixture(scope="module")
def never_gated(tiny_model, tmp_path_factory):
    """Both arms, gate R1 with d_L = 0 (d_K >= 0, so it never fires)."""
    return _run(_config(tiny_model, tmp_path_factory.mktemp("never") / "run"))


def test_a_gate_that_never_fires_gives_bit_identical_adapters(never_gated):
    res = never_gated
    m = res.metrics
    assert m.height == 6 and m["gate/cuts"].sum() == 0
    assert (m["train/grad_l2"] > 0).any(), "no learning signal: the test would pass trivially"
    base, gated = _adapter(res.run_dir, "baseline"), _adapter(res.run_dir, "gated")
    assert base.keys() == gated.keys()
    assert all(torch.equal(base[k], gated[k]) for k in base)
    assert any(
        float(v.abs().max()) > 0 for k, v in base.items() if "lora_B" in k
    )  # the adapter moved
    cols = [c for c in m.columns if c not in TIMING and c != "arm"]
    b = m.filter(pl.col("arm") == "baseline").select(cols)
    g = m.filter(pl.col("arm") == "gated").select(cols)
    assert b.equals(g)
    ev = res.evals
    assert sorted(set(ev["iteration"])) == [0, 2, 3] and ev.height == 2 * 3 * 3
    assert set(ev["task_id"]) == {t.task_id for t in HELDOUT}
    for name in (
        "metrics.parquet",
        "eval.parquet",
        "onpolicy.png",
        "mechanism.png",
        "report.md",
        "summary.json",
    ):
        assert (res.run_dir / name).exists(), name
    assert res.complete and res.tests.height == 3


def test_a_gate_that_fires_drops_groups_and_changes_the_update(tiny_model, tmp_path, never_gated):
    res = _run(_config(tiny_model, tmp_path / "run", d_L=1.0))  # R1: cut iff d_K < 1
    gated = res.metrics.filter(pl.col("arm") == "gated")
    assert gated["gate/cuts"].sum() > 0
    assert (gated["gate/kept"] + gated["gate/cuts"] == gated["rollout/groups"]).all()
    # cut groups are dropped entirely
    assert (gated["train/trajectories"] == 4 * gated["gate/kept"]).all()
    base_never = _adapter(never_gated.run_dir, "baseline")
    assert all(
        torch.equal(base_never[k], v) for k, v in _adapter(res.run_dir, "baseline").items()
    )  # same seed, same baseline
    other = _adapter(res.run_dir, "gated")
    assert any(not torch.equal(base_never[k], other[k]) for k in other)


def test_resume_after_a_stop_reproduces_the_uninterrupted_run(tiny_model, tmp_path, never_gated):
    out = tmp_path / "run"
    first = _run(_config(tiny_model, out), stop_after=1)
    assert (
        not first.complete and first.metrics.height == 2
    )  # both arms (interleaved) at iteration 1
    assert '"status": "partial"' in (out / "manifest.json").read_text()
    again = _run(_config(tiny_model, out, resume=True))
    assert again.complete
    cols = [c for c in never_gated.metrics.columns if c not in TIMING]
    assert again.metrics.select(cols).equals(never_gated.metrics.select(cols))
    assert again.evals.equals(never_gated.evals)
    for arm in ("baseline", "gated"):
        a, b = _adapter(out, arm), _adapter(never_gated.run_dir, arm)
        assert all(torch.equal(a[k], b[k]) for k in a)


def test_resume_refuses_a_different_config(tiny_model, never_gated):
    from srollout.errors import SrolloutError

    with pytest.raises(SrolloutError, match="lr"):
        _run(_config(tiny_model, never_gated.run_dir, resume=True, lr=1e-3))


# The keys of an on-policy metrics row before the namespacing, as the old loop wrote them
# (rollout_adapter_iteration only with a vLLM backend).
OLD_ROW_KEYS = [
    "arm",
    "seed",
    "step",
    "iteration",
    "loss",
    "grad_l2",
    "zero_adv_frac",
    "n_traj",
    "n_tokens",
    "stepped",
    "mean_logp",
    "denominator",
    "n_groups",
    "n_cut",
    "n_kept",
    "n_zero_var_kept",
    "train_reward",
    "train_reward_all",
    "n_env_steps",
    "n_gen_tokens",
    "rollout_s",
    "update_s",
    "sync_s",
    "iter_s",
    "cum_s",
    "warmup_s",
    "n_useful",
    "n_skipped",
    "n_rounds",
    "dapo_hit_cap",
    "rollout_adapter_iteration",
    "eval_s",
]


def test_metrics_columns_are_namespaced_and_the_mapping_covers_every_old_name(never_gated):
    from srollout import schemas
    from srollout.training.metrics import ONPOLICY_ADDED, ONPOLICY_RENAMES, onpolicy_columns

    m = never_gated.metrics
    assert m.columns == [c for c in onpolicy_columns() if c != "rollout/adapter_iteration"]
    assert m.columns[:3] == ["arm", "seed", "iteration"] and "step" not in m.columns
    namespaced = m.columns[3:]
    namespaces = ("rollout", "gate", "train", "time")
    assert all(c.split("/")[0] in namespaces for c in namespaced), namespaced
    # every old name but the identity columns is renamed, and every renamed column is written
    # (rollout/adapter_iteration only with vLLM)
    assert set(ONPOLICY_RENAMES) == set(OLD_ROW_KEYS) - {"arm", "seed", "step", "iteration"}
    added = set(ONPOLICY_ADDED)  # columns added since the renames: no old name
    assert set(ONPOLICY_RENAMES.values()) - {"rollout/adapter_iteration"} == set(namespaced) - added
    assert added <= set(namespaced)
    schemas.read(never_gated.run_dir / "metrics.parquet", schemas.METRICS)
    # step 1 of the baseline by hand: 2 groups of G=4 rolled out, none cut, all kept
    first = m.filter(pl.col("arm") == "baseline").row(0, named=True)
    assert (first["rollout/groups"], first["gate/cuts"], first["gate/kept"]) == (2, 0, 2)
    assert first["gate/useful"] == 2 - first["gate/zero_var_kept"]
    assert first["gate/dapo_rounds"] == 1
    assert first["train/trajectories"] == 8 and first["train/denominator"] == "seq_mean"
    assert first["time/iter_s"] == pytest.approx(
        first["time/rollout_s"] + first["time/update_s"] + first["time/sync_s"]
    )


def test_a_run_checkpointed_before_the_renames_resumes_to_the_same_tables(
    tiny_model, tmp_path, never_gated
):
    """A run directory written by the old loop (flat metric names, `step` beside `iteration`, in
    every state.pt) resumes: its rows are renamed on the way in and the run ends with the tables
    of an uninterrupted run."""
    from srollout.training.checkpoint import load_state, save_state
    from srollout.training.metrics import ONPOLICY_RENAMES

    out = tmp_path / "run"
    _run(_config(tiny_model, out), stop_after=1)
    old_name = {new: old for old, new in ONPOLICY_RENAMES.items()}
    for arm in ("baseline", "gated"):
        ckpt = out / "checkpoints" / f"seed7-{arm}"
        state = load_state(ckpt)
        assert state.iteration == 1 and len(state.metrics) == 1
        old_rows = [
            {"step": r["iteration"], **{old_name.get(k, k): v for k, v in r.items()}}
            for r in state.metrics
        ]
        # in the old loop's key order: the resumed table must still have the current column order
        state.metrics = [{k: r[k] for k in OLD_ROW_KEYS if k in r} for r in old_rows]
        assert list(state.metrics[0]) == [
            k for k in OLD_ROW_KEYS if k != "rollout_adapter_iteration"
        ]
        save_state(ckpt, state)
    again = _run(_config(tiny_model, out, resume=True))
    assert again.complete
    cols = [c for c in never_gated.metrics.columns if c not in TIMING]
    assert again.metrics.columns == never_gated.metrics.columns
    assert again.metrics.select(cols).equals(never_gated.metrics.select(cols))
    assert again.evals.equals(never_gated.evals)


# --- arms: DAPO dynamic sampling, GRESO skipping, composed with the gate -------------------------


class FarCorridor(Corridor):
    """Never won within T_max = 4: every group is all-fail (zero variance)."""

    def __init__(self) -> None:
        super().__init__()
        self.length = 99

    def reset(self, task: Task, seed: int):
        obs = super().reset(task, seed)
        self.length = 99
        return obs


def test_dapo_after_a_never_firing_gate_keeps_the_baseline_groups_that_have_variance(
    tiny_model, tmp_path, never_gated
):
    # no extra rounds: iteration 1 of gated+dapo rolls out exactly the baseline's groups (same
    # model, same seeds, a gate with d_L = 0 never fires) and keeps those with reward variance
    res = _run(
        _config(tiny_model, tmp_path / "run", arms=("baseline", "gated+dapo"), dapo_max_rounds=0)
    )
    m = res.metrics
    base = never_gated.metrics.filter(pl.col("arm") == "baseline").sort("iteration")
    dapo = m.filter(pl.col("arm") == "gated+dapo").sort("iteration")
    b1, d1 = base.row(0, named=True), dapo.row(0, named=True)
    rolled = ("rollout/groups", "rollout/gen_tokens", "rollout/env_steps")
    assert [d1[c] for c in rolled] == [b1[c] for c in rolled]
    assert d1["gate/kept"] == b1["gate/kept"] - b1["gate/zero_var_kept"] == b1["gate/useful"]
    assert (dapo["gate/zero_var_kept"] == 0).all()
    assert (dapo["gate/useful"] == dapo["gate/kept"]).all()
    assert (dapo["gate/dapo_rounds"] == 1).all() and (dapo["gate/cuts"] == 0).all()
    # a short batch at cap 0 is a cap hit
    assert (dapo["gate/dapo_hit_cap"] == (dapo["gate/kept"] < 2)).all()
    assert res.arms["arm"].to_list() == ["baseline", "gated+dapo"]
    assert (res.run_dir / "summary_arms.parquet").exists() and "useful groups / s" in (
        res.run_dir / "report.md"
    ).read_text()


def _far_config(model: Path, out: Path, **kw) -> TrainOnpolicyConfig:
    return _config(
        model,
        out,
        arms=("baseline", "dapo", "greso", "gated+greso", "cooldown"),
        dapo_max_rounds=1,
        greso_p_explore=0.0,
        d_L=1.0,
        n_eval=1,
        **kw,
    )


def _far_run(config, **kw):
    from srollout.stages.train_onpolicy import run_train_onpolicy

    return run_train_onpolicy(
        config,
        progress=False,
        env_factory=FarCorridor,
        prompter=Prompter(),
        train_tasks=TRAIN,
        eval_tasks=HELDOUT[:1],
        **kw,
    )


@pytest.fixture(scope="module")
def far(tiny_model, tmp_path_factory, cooldown_arm):
    return _far_run(_far_config(tiny_model, tmp_path_factory.mktemp("far") / "run"))


def test_dapo_cap_and_greso_skips_on_all_zero_variance_groups(far):
    """Every group fails. DAPO (cap 1): round 0 = the 2 drawn prompts, round 1 = the 2 others of the
    4-task pool, nothing useful: the cap is hit every iteration and no update happens, no crash.
    GRESO with p = 0: a prompt seen before (always zero-variance) is skipped, so iteration i skips
    exactly the drawn prompts that any earlier iteration drew; with the gate cutting every group
    (d_L = 1), gated+greso skips the same ones (a cut group counts as zero-variance)."""
    from srollout.training.onpolicy import iteration_tasks

    res = far
    m = res.metrics.sort("arm", "iteration")
    assert (m["rollout/reward"].fill_nan(0.0) == 0.0).all()
    dapo = m.filter(pl.col("arm") == "dapo")
    assert dapo["gate/dapo_rounds"].to_list() == [2, 2, 2] and dapo["gate/dapo_hit_cap"].all()
    assert dapo["rollout/groups"].to_list() == [4, 4, 4] and (dapo["gate/kept"] == 0).all()
    assert not dapo["train/stepped"].any()
    base = m.filter(pl.col("arm") == "baseline")
    # the extra round's tokens are counted
    assert (dapo["rollout/gen_tokens"] > base["rollout/gen_tokens"]).all()
    seen: set[int] = set()
    expected = []
    for it in (1, 2, 3):
        picked = set(iteration_tasks(TRAIN, it, 2, 7))
        expected.append(len(picked & seen))
        seen |= picked
    assert sum(expected) > 0, "no prompt repeats: the test would pass trivially"
    for arm in ("greso", "gated+greso"):
        g = m.filter(pl.col("arm") == arm)
        assert g["gate/skipped"].to_list() == expected, arm
        assert (g["rollout/groups"] + g["gate/skipped"] == 2).all()
    gg = m.filter(pl.col("arm") == "gated+greso")
    assert (gg["gate/cuts"] == gg["rollout/groups"]).all() and gg["gate/cuts"].sum() > 0
    greso = m.filter(pl.col("arm") == "greso")
    assert (greso["rollout/gen_tokens"] <= base["rollout/gen_tokens"]).all()
    a = res.arms.to_dicts()
    assert [r["arm"] for r in a] == ["baseline", "dapo", "greso", "gated+greso", "cooldown"]
    assert a[1]["extra_rounds"] == 3 and a[1]["cap_hits"] == 3 and a[1]["useful_groups"] == 0
    assert a[2]["skipped"] == sum(expected) and a[2]["token_saving"] > 0
    assert {t["what"].split(": ")[-1] for t in res.tests.to_dicts()} >= {
        "dapo - baseline",
        "greso - baseline",
    }
    # cooldown (examples/custom_arm, a skip part of another package) rests a prompt only the
    # iteration after it was rolled out (a rested prompt records nothing): iteration i skips the
    # drawn prompts rolled out at i - 1
    last_rolled: dict[int, int] = {}
    rested = []
    for it in (1, 2, 3):
        picked = set(iteration_tasks(TRAIN, it, 2, 7))
        rest = {p for p in picked if last_rolled.get(p) == it - 1}
        last_rolled |= {p: it for p in picked - rest}
        rested.append(len(rest))
    assert sum(rested) > 0, "no prompt rests: the test would pass trivially"
    cool = m.filter(pl.col("arm") == "cooldown")
    assert cool["gate/skipped"].to_list() == rested and a[4]["skipped"] == sum(rested)


def test_greso_history_survives_a_stop_and_resume(tiny_model, tmp_path, far):
    # iteration 3 skips both drawn prompts only if the history of iterations 1-2 (greso.json) is
    # restored
    out = tmp_path / "run"
    first = _far_run(_far_config(tiny_model, out), stop_after=2)
    assert not first.complete and (out / "checkpoints" / "seed7-greso" / "greso.json").exists()
    again = _far_run(_far_config(tiny_model, out, resume=True))
    cols = [c for c in far.metrics.columns if c not in TIMING]
    assert again.metrics.select(cols).equals(far.metrics.select(cols))
    assert again.metrics.filter(pl.col("arm") == "greso")["gate/skipped"].to_list()[-1] == 2


def test_judge_cuts_rolls_each_cut_group_on_and_leaves_the_training_unchanged(tiny_model, tmp_path):
    from srollout.training.metrics import JUDGE_COLUMNS

    plain = _run(_config(tiny_model, tmp_path / "plain", d_L=1.0))  # R1: cut iff d_K < 1
    judged = _run(_config(tiny_model, tmp_path / "judged", d_L=1.0, judge_cuts=True))
    m = judged.metrics
    assert m.columns[-6:] == list(JUDGE_COLUMNS)
    assert "gate/cut_tp" not in plain.metrics.columns
    gated = m.filter(pl.col("arm") == "gated")
    base = m.filter(pl.col("arm") == "baseline")
    assert gated["gate/cuts"].sum() > 0
    # every cut judged once, TP or FP; all G=4 trajectories of a cut group replay their prefix
    assert (gated["gate/cut_tp"] + gated["gate/cut_fp"] == gated["gate/cuts"]).all()
    assert (gated["gate/cut_prefix_matched"] == 4 * gated["gate/cuts"]).all()
    assert (base.select(JUDGE_COLUMNS[:3]).sum_horizontal() == 0).all()
    # no trajectory gate in either arm: no stop to judge
    assert (m.select("gate/stop_tp", "gate/stop_fp").sum_horizontal() == 0).all()
    # iteration 1: both arms hold the same weights and roll the same 2 groups with the same
    # seeds, so the judge's full rollouts are the baseline's groups: TP = its zero-variance ones
    first_g, first_b = gated.row(0, named=True), base.row(0, named=True)
    assert first_g["gate/cuts"] == 2 and first_b["gate/kept"] == 2
    assert first_g["gate/cut_tp"] == first_b["gate/zero_var_kept"]
    # judging is outside the run: the same adapters and the same metrics as without it
    for arm in ("baseline", "gated"):
        a, b = _adapter(plain.run_dir, arm), _adapter(judged.run_dir, arm)
        assert all(torch.equal(a[k], b[k]) for k in a)
    cols = [c for c in plain.metrics.columns if c not in TIMING]
    assert plain.metrics.select(cols).equals(m.select(cols))
    # the report counts them
    report = (judged.run_dir / "report.md").read_text()
    assert "cuts judged by full outcome: TP / FP" in report
    assert "Held-out success at each evaluation (%, greedy, 3 `heldout` tasks)" in report


def test_judge_cuts_calls_a_cut_of_an_unwinnable_group_a_true_positive(tiny_model, tmp_path):
    # FarCorridor cannot be won within T_max: every group is all-fail, so every cut is a TP
    res = _far_run(_config(tiny_model, tmp_path / "run", d_L=1.0, n_eval=1, judge_cuts=True))
    gated = res.metrics.filter(pl.col("arm") == "gated")
    assert gated["gate/cuts"].sum() == 6  # 3 iterations x 2 groups, all cut (d_K < 1)
    assert gated["gate/cut_tp"].to_list() == [2, 2, 2] and gated["gate/cut_fp"].sum() == 0
    assert (gated["time/judge_s"] > 0).all()
    assert res.per_seed["cut_precision"].to_list() == [1.0]
    assert res.per_seed["cut_tp_gated"].to_list() == [6]


def test_audit_of_every_cut_agrees_with_the_judge_and_is_counted_in_the_run(tiny_model, tmp_path):
    import json

    from srollout.training.metrics import AUDIT_COLUMNS, STOP_AUDIT_COLUMNS

    plain = _run(_config(tiny_model, tmp_path / "plain", d_L=1.0))  # R1: cut iff d_K < 1
    res = _run(_config(tiny_model, tmp_path / "audit", d_L=1.0, judge_cuts=True, audit=1.0))
    m = res.metrics
    tail = [*AUDIT_COLUMNS, *STOP_AUDIT_COLUMNS]
    assert m.columns[-len(tail) :] == tail
    # no trajectory gate in either arm: its audit's columns say so
    assert m["gate/stall_W"].to_list() == [0] * m.height
    assert m["gate/stop_audited"].sum() == 0 and m["gate/stop_precision_lb"].is_nan().all()
    gated = m.filter(pl.col("arm") == "gated")
    base = m.filter(pl.col("arm") == "baseline")
    # --audit 1.0 rolls every cut on, with the judge's seeds and weights: the same verdicts
    assert gated["gate/cuts"].sum() > 0
    assert gated["gate/audited"].to_list() == gated["gate/cuts"].to_list()
    assert gated["gate/audit_tp"].to_list() == gated["gate/cut_tp"].to_list()
    assert gated["gate/audit_fp"].to_list() == gated["gate/cut_fp"].to_list()
    # two audited cuts an iteration never reach the 19 the bound needs to certify the floor, but
    # they can refute it: every move is next_threshold's on the ledger as it stood, and the
    # first is a refutation (this run's first two cuts include a wrong one)
    from srollout.core.audit import AuditLedger, next_threshold

    thresholds = gated["gate/threshold"].to_list()
    saved_ledger = AuditLedger.from_dict(
        json.loads((res.run_dir / "checkpoints" / "seed7-gated" / "audit.json").read_text())
    )
    steps = [next_threshold(t, saved_ledger.recent(i)) for i, t in enumerate(thresholds, 1)]
    assert thresholds[0] == 1.0 and steps[0].move == "refute" and thresholds[1] < 1.0
    assert gated.row(0, named=True)["gate/audit_fp"] >= 1
    assert [s.threshold for s in steps[:-1]] == pytest.approx(thresholds[1:])
    assert (base["gate/audited"] == 0).all() and base["gate/threshold"].is_nan().all()
    # the audit is part of the run: at iteration 1 (same weights and groups in both arms) every
    # group is cut at K and audited, so it runs on to the end: the gated arm takes exactly the
    # baseline's steps, and the audit cost the steps after the cut
    first = {
        name: r.filter(pl.col("arm") == arm).row(0, named=True)
        for name, r, arm in (("plain", plain.metrics, "gated"), ("base", base, "baseline"))
    }
    g1 = gated.row(0, named=True)
    assert g1["gate/cuts"] == 2
    assert g1["rollout/env_steps"] == first["base"]["rollout/env_steps"]
    assert g1["gate/audit_steps"] == g1["rollout/env_steps"] - first["plain"]["rollout/env_steps"]
    assert g1["gate/audit_steps"] > 0
    ledger = json.loads((res.run_dir / "checkpoints" / "seed7-gated" / "audit.json").read_text())
    assert ledger["thresholds"] == {str(i): t for i, t in enumerate(thresholds, 1)}
    assert sum(r[3] == "audit" for r in ledger["rows"]) == gated["gate/audited"].sum()
    report = (res.run_dir / "report.md").read_text()
    assert "## Audited gate (--audit 1.0, floor 0.85" in report
    assert (res.run_dir / "audit.png").stat().st_size > 10_000
    # the calibrated gate, for the next run's --gate: d_L as it stands, with the evidence
    from srollout.core.audited_gate import AuditedGate
    from srollout.core.gate import load_gate

    saved = load_gate(res.run_dir / "checkpoints" / "seed7-gated" / "gate-audited.json")
    assert isinstance(saved, AuditedGate) and saved.base.K == 2
    assert saved.base.d_L == pytest.approx(steps[-1].threshold)  # the 4th iteration's d_L
    assert (saved.fraction, saved.floor) == (1.0, 0.85)
    assert len(saved.ledger.rows) == len(ledger["rows"])
    # a run started from it: the same d_L, the saved audits carried in as the oldest evidence
    again = _run(
        _config(
            tiny_model,
            tmp_path / "again",
            gate=saved.save(tmp_path / "g"),
            audit=1.0,
            arms=("gated",),
            iterations=1,
        )
    )
    assert again.metrics["gate/threshold"].to_list() == [pytest.approx(saved.base.d_L)]
    carried = json.loads(
        (again.run_dir / "checkpoints" / "seed7-gated" / "audit.json").read_text()
    )["rows"]
    old_rows = [r for r in carried if r[0] <= 0]
    assert len(old_rows) == len(ledger["rows"]) and len(carried) > len(old_rows)


def test_a_bad_audited_gate_json_is_one_line_and_writes_nothing(tiny_model, tmp_path):
    import json

    from srollout.errors import SrolloutError

    bad = tmp_path / "gate-audited.json"
    bad.write_text(
        json.dumps(
            {
                "kind": "audited",
                "base": {"kind": "threshold", "rule": "r1", "K": 2, "d_L": 0.1},
                "audit": 0.5,
                "precision_floor": float("nan"),
            }
        )
    )
    config = _config(tiny_model, tmp_path / "never", gate=bad, audit=0.5)
    with pytest.raises(SrolloutError) as err:
        _run(config)
    assert str(err.value) == f"{bad}: precision_floor must be a number in (0.0, 1.0], got nan"
    assert not (tmp_path / "never").exists()


def test_bad_audit_options_are_refused_before_anything_runs(tiny_model, tmp_path):
    from srollout.cli.app import cli_line
    from srollout.errors import SrolloutError

    for kw, msg in (
        ({"audit": 1.5}, "--audit must be a fraction in [0, 1], got 1.5"),
        ({"audit": 0.5, "audit_floor": 1.0}, "--audit-floor must lie in (0, 1), got 1.0"),
    ):
        with pytest.raises(SrolloutError) as err:
            _config(tiny_model, tmp_path / "never", **kw)
        assert cli_line(err.value) == msg  # the line the CLI shows: the flag named
    assert not (tmp_path / "never").exists()
