"""`srollout train-onpolicy --seeds 7,13 --workers 2`: the seeds as Ray tasks, each in its own
run subdirectory, merged into the same metrics/eval tables as a sequential run (timing aside);
`--resume` retrains only the seed that was lost."""

from __future__ import annotations

import json
import shutil

import polars as pl
import pytest

pytest.importorskip("ray", reason="the `dist` extra (ray) is not installed")

from srollout import schemas  # noqa: E402


def _args(model) -> list[str]:
    return [
        "train-onpolicy",
        "--preset",
        "tiny",
        "--seeds",
        "7,13",
        "--model",
        str(model),
        "--iterations",
        "1",
        "--n-eval",
        "1",
        "--no-interleave",
    ]


def _untimed(df: pl.DataFrame) -> pl.DataFrame:
    timing = [c for c in df.columns if c.endswith("_s") or c in ("tok_per_s",)]
    return df.drop(timing).sort(
        *[c for c in ("seed", "arm", "iteration", "task_id") if c in df.columns]
    )


@pytest.mark.slow  # two seeds x two arms, three times over, plus a Ray start: minutes on 2 cores
def test_seeds_in_parallel_equal_seeds_in_sequence(run_cli, tiny_policy, tmp_path):
    seq, par = tmp_path / "seq", tmp_path / "par"
    res = run_cli(*_args(tiny_policy), "--out", seq)
    assert res.exit_code == 0, res.stderr[-2000:]
    res = run_cli(*_args(tiny_policy), "--workers", "2", "--out", par)
    assert res.exit_code == 0, res.stderr[-2000:]

    def same() -> None:
        for name, artifact in (
            ("metrics.parquet", schemas.METRICS),
            ("eval.parquet", schemas.EVAL),
        ):
            a, b = schemas.read(seq / name, artifact), schemas.read(par / name, artifact)
            assert a.height > 0 and _untimed(a).equals(_untimed(b)), name

    same()
    for seed in (7, 13):
        assert (
            json.loads((par / "seeds" / f"seed{seed}" / "manifest.json").read_text())["status"]
            == "complete"
        )
        for arm in ("baseline", "gated"):
            link = par / "checkpoints" / f"seed{seed}-{arm}"
            assert link.is_symlink() and (link / "state.pt").exists()
            assert (par / "adapters" / f"seed{seed}-{arm}" / "adapter_config.json").exists()
    manifest = json.loads((par / "manifest.json").read_text())
    assert manifest["status"] == "complete" and manifest["dist"]["workers"] == 2
    assert manifest["dist"]["seed_runs"] == ["seeds/seed7", "seeds/seed13"]

    # seed 13 lost entirely (and the merged tables): --resume retrains it, reloads seed 7
    shutil.rmtree(par / "seeds" / "seed13")
    (par / "metrics.parquet").unlink()
    res = run_cli(*_args(tiny_policy), "--workers", "2", "--out", par, "--resume")
    assert res.exit_code == 0, res.stderr[-2000:]
    same()

    # a sequential run cannot be resumed with --workers (its checkpoints are not per-seed runs)
    res = run_cli(*_args(tiny_policy), "--workers", "2", "--out", seq, "--resume")
    assert res.exit_code == 2 and "started without --workers" in res.stderr
