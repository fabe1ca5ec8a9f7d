"""The adapter build end to end on a tiny GGUF model (random 1-layer Llama): SFT, then a DAgger
round played on vLLM where installed, resumable, and an SFT phase taken from an earlier build of
the same SFT recipe (``--sft-from``), which a build of another SFT recipe refuses."""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

import pytest

from srollout.default_policy.adapter_build import AdapterRecipe, build_adapter
from srollout.default_policy.recipe import BuildConfig
from srollout.errors import SrolloutError

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from gguf_files import write_tiny_llama  # noqa: E402

SFT = BuildConfig(
    seed=0,
    n_demo_tasks=2,
    demos_per_task=1,
    epochs=1,
    lr=1e-3,
    obs_loss_weight=0.0,
    batch_tokens=8192,
    max_context=2048,
    bf16=False,
    correction_rounds=1,
    correction_tasks=2,
    correction_G=2,
    correction_relabel=True,
    correction_branches=3,
    correction_replay=1,
    correction_epochs=1,
    correction_lr=1e-3,
)


@pytest.fixture(scope="module")
def recipe(tmp_path_factory):
    tiny = write_tiny_llama(tmp_path_factory.mktemp("gguf") / "tiny.gguf", context=4096)
    return AdapterRecipe(
        base=str(tiny), sft=SFT, r=2, alpha=4, targets=("q_proj", "v_proj"), checkpoint_every=1
    )


def _weights(path):
    from safetensors.torch import load_file

    return load_file(str(path / "adapter_model.safetensors"))


@pytest.mark.slow
def test_sft_then_a_dagger_round_from_an_earlier_sft(recipe, tmp_path):
    sft_only = dataclasses.replace(recipe, sft=dataclasses.replace(SFT, correction_rounds=0))
    first = build_adapter(sft_only, tmp_path / "sft", quiet=True)
    info = json.loads((first.path / "build.json").read_text())
    assert info["dagger_rounds"] == [] and info["final_loss"] == info["sft_final_loss"]
    assert not (tmp_path / ".sft.work").exists()  # the work directory goes with a finished build

    second = build_adapter(recipe, tmp_path / "dagger", quiet=True, sft_from=first.path)
    info2 = json.loads((second.path / "build.json").read_text())
    (r,) = info2["dagger_rounds"]
    assert r["trajectories"] == 4  # 2 tasks x G 2
    assert r["model_steps"] + r["expert_steps"] + r["past_context"] > 0
    # off-label model steps become branches (before the cap), bar those of trajectories that
    # outgrew the context, which the expert plays out and the round drops
    assert 0 < r["relabelled"] <= r["model_off_label"]
    assert info2["sft_final_loss"] == pytest.approx(info["final_loss"], abs=0)
    assert info2["sft_from"].startswith("sft (srollout adapter")
    before, after = _weights(first.path), _weights(second.path)
    assert before.keys() == after.keys()
    moved = max(float((after[k] - before[k]).abs().max()) for k in before)
    assert moved > 1e-4  # the round fine-tuned the adapter (lr 1e-3, one step at least)

    # a second round goes on from the first build's: round 1 is kept, not played again
    two = dataclasses.replace(recipe, sft=dataclasses.replace(SFT, correction_rounds=2))
    third = build_adapter(two, tmp_path / "more", quiet=True, sft_from=second.path)
    info3 = json.loads((third.path / "build.json").read_text())
    assert len(info3["dagger_rounds"]) == 2 and info3["dagger_rounds"][0] == r
    assert _weights(third.path).keys() == after.keys()


def test_sft_from_a_build_of_another_sft_recipe_is_refused(recipe, tmp_path):
    done = tmp_path / "done"
    done.mkdir()
    other = dataclasses.replace(recipe, sft=dataclasses.replace(SFT, lr=2e-3, correction_rounds=0))
    record = {"recipe": json.loads(json.dumps(dataclasses.asdict(other)))}
    (done / "build.json").write_text(json.dumps(record))
    with pytest.raises(SrolloutError, match=r"its SFT recipe differs from this one \(lr\)"):
        build_adapter(recipe, tmp_path / "out", sft_from=done, quiet=True)
    with pytest.raises(SrolloutError, match="not a finished adapter build"):
        build_adapter(recipe, tmp_path / "out", sft_from=tmp_path, quiet=True)
    assert not (tmp_path / "out").exists() and not (tmp_path / ".out.work").exists()
    # a DAgger field is what the new build adds: it may differ
    fewer = dataclasses.replace(other, sft=dataclasses.replace(SFT, correction_rounds=0))
    record = {"recipe": json.loads(json.dumps(dataclasses.asdict(fewer)))}
    record["recipe"]["sft"]["lr"] = SFT.lr
    (done / "build.json").write_text(json.dumps(record))
    from srollout.default_policy.adapter_build import _check_sft_from

    _check_sft_from(done, recipe, SFT)
    # rounds of this recipe's settings on it: the build goes on from them; more rounds than the
    # recipe asks for, or rounds of other settings, are refused
    record["recipe"]["sft"]["correction_rounds"] = 1
    (done / "build.json").write_text(json.dumps(record))
    _check_sft_from(done, recipe, SFT)
    for field, value in (("correction_rounds", 2), ("correction_beta", 0.9)):
        bad = json.loads(json.dumps(record))
        bad["recipe"]["sft"][field] = value
        (done / "build.json").write_text(json.dumps(bad))
        with pytest.raises(SrolloutError, match=r"it has [12] DAgger round\(s\) on it; go on from"):
            _check_sft_from(done, recipe, SFT)


def test_a_beta_schedule_goes_on_from_rounds_it_would_have_played_the_same(recipe, tmp_path):
    # SFT's correction_beta is 0.5 here: round r plays with 0.5 x decay^r. A build of one round
    # (recorded before the decay existed) goes on under decay 0, whose round 1 is the same; a
    # build of two rounds at decay 1 does not (its round 2 had beta 0.5, not 0)
    from srollout.default_policy.adapter_build import _check_sft_from

    done = tmp_path / "done"
    done.mkdir()
    record = {"recipe": json.loads(json.dumps(dataclasses.asdict(recipe)))}
    del record["recipe"]["sft"]["correction_beta_decay"]
    decay0 = dataclasses.replace(SFT, correction_rounds=3, correction_beta_decay=0.0)
    for rounds, ok in ((1, True), (2, False)):
        record["recipe"]["sft"]["correction_rounds"] = rounds
        (done / "build.json").write_text(json.dumps(record))
        if ok:
            _check_sft_from(done, recipe, decay0)
        else:
            with pytest.raises(SrolloutError, match=r"it has 2 DAgger round\(s\) on it"):
                _check_sft_from(done, recipe, decay0)
    assert SFT.correction_beta == 0.5 and SFT.correction_beta_decay == 1.0


def test_replace_shipped_adapter_swaps_the_directory_whole_without_peft_readme(
    tmp_path, monkeypatch
):
    from srollout.default_policy.adapter_build import replace_shipped_adapter

    shipped = tmp_path / "pkg" / "smollm2_alfworld"
    shipped.mkdir(parents=True)
    (shipped / "old.txt").write_text("a1")
    monkeypatch.setattr("srollout.policy.named.SMOLLM2_ADAPTER_DIR", shipped)
    built = tmp_path / "built"
    built.mkdir()
    with pytest.raises(SrolloutError, match="not a finished build"):
        replace_shipped_adapter(built)
    assert (shipped / "old.txt").read_text() == "a1"
    for name, text in (("build.json", "{}"), ("adapter_model.safetensors", "w"), ("README.md", "")):
        (built / name).write_text(text)
    assert replace_shipped_adapter(built) == shipped
    assert sorted(p.name for p in shipped.iterdir()) == ["adapter_model.safetensors", "build.json"]
    assert sorted(p.name for p in shipped.parent.iterdir()) == ["smollm2_alfworld"]  # no temp left


class _Crash(Exception):
    pass


@pytest.mark.slow
def test_a_build_killed_in_a_rounds_fine_tuning_resumes_without_playing_again(
    recipe, tmp_path, monkeypatch
):
    from srollout.default_policy import build as build_mod
    from srollout.default_policy import dagger

    small = dataclasses.replace(SFT, batch_tokens=256)  # a round's fine-tuning of several steps
    recipe = dataclasses.replace(recipe, sft=small)
    sft_only = dataclasses.replace(recipe, sft=dataclasses.replace(small, correction_rounds=0))
    first = build_adapter(sft_only, tmp_path / "sft", quiet=True)
    whole = build_adapter(recipe, tmp_path / "whole", quiet=True, sft_from=first.path)

    real_sft, real_play, plays = build_mod.sft, dagger.play_round, []

    def killed(*args, checkpoint, **kw):  # the process dies right after the round's 2nd save
        def save_then_die(step, opt):
            checkpoint(step, opt)
            if step == 2:
                raise _Crash

        return real_sft(*args, checkpoint=save_then_die, **kw)

    monkeypatch.setattr(dagger, "play_round", lambda *a, **k: plays.append(1) or real_play(*a, **k))
    monkeypatch.setattr(build_mod, "sft", killed)
    with pytest.raises(_Crash):
        build_adapter(recipe, tmp_path / "again", quiet=True, sft_from=first.path)
    assert plays == [1] and (tmp_path / ".again.work" / "round-1.played.pkl").is_file()
    monkeypatch.setattr(build_mod, "sft", real_sft)
    again = build_adapter(recipe, tmp_path / "again", quiet=True, sft_from=first.path, resume=True)
    assert plays == [1]  # the play was read back, not played again
    info, info_whole = (json.loads((b.path / "build.json").read_text()) for b in (again, whole))
    assert info["dagger_rounds"][0]["seconds"] and len(info["dagger_rounds"]) == 1
    # the same adapter and seeds play the same round, and the resumed fine-tuning ends where
    # the whole one did
    counts = [
        {k: v for k, v in i["dagger_rounds"][0].items() if k != "seconds"}
        for i in (info, info_whole)
    ]
    assert counts[0] == counts[1]
    a, b = _weights(again.path), _weights(whole.path)
    assert max(float((a[k] - b[k]).abs().max()) for k in a) < 1e-5
