"""``collect --shadow``: what the gates would have done, scored by the outcomes they did not cut
(docs/gates.md, "Shadow mode"): a shadow cut is right iff its group's full rewards are
zero-variance, a shadow stop iff its trajectory failed; the saving is the environment steps and
generated tokens after the cut or stop; precision with its exact (Clopper-Pearson) 95 % interval.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import NamedTuple

import polars as pl


class ShadowScore(NamedTuple):
    """One gate's shadow decisions: ``n`` decisions (cuts or stops), ``right`` of them right,
    their precision and its two-sided 95 % interval (nan without decisions), and the share of
    all environment steps and generated tokens after them."""

    n: int
    right: int
    precision: float
    low: float
    high: float
    steps_saved: float
    tokens_saved: float


def _score(n: int, right: int, steps_after: int, tokens_after: int, steps: int, tokens: int):
    from srollout.core.audit import clopper_pearson_lower, clopper_pearson_upper

    nan = math.nan
    return ShadowScore(
        n,
        right,
        right / n if n else nan,
        clopper_pearson_lower(right, n, 0.975) if n else nan,
        clopper_pearson_upper(right, n, 0.975) if n else nan,
        steps_after / steps if steps else nan,
        tokens_after / tokens if tokens else nan,
    )


def shadow_scores(paths: Mapping[str, Path]) -> dict[str, ShadowScore]:
    """``{"group gate": ..., "trajectory gate": ...}`` for the gates the run shadowed (a gate
    whose column the tables lack is left out)."""
    groups = pl.read_parquet(paths["groups"])
    trajs = pl.read_parquet(paths["trajectories"])
    steps = pl.read_parquet(
        paths["steps"], columns=["group_id", "traj_idx", "step", "n_gen_tokens"]
    )
    n_steps, n_tokens = steps.height, int(steps["n_gen_tokens"].fill_null(0).sum())
    out: dict[str, ShadowScore] = {}
    if "shadow_cut_step" in groups.columns:
        cut = groups.filter(pl.col("shadow_cut_step").is_not_null())
        after = steps.join(cut.select("group_id", "shadow_cut_step"), on="group_id").filter(
            pl.col("step") > pl.col("shadow_cut_step")
        )
        out["group gate"] = _score(
            cut.height, int(cut["zero_var"].sum()), after.height,
            int(after["n_gen_tokens"].fill_null(0).sum()), n_steps, n_tokens,
        )  # fmt: skip
    if "shadow_stop_step" in trajs.columns:
        stop = trajs.filter(pl.col("shadow_stop_step").is_not_null())
        keys = ["group_id", "traj_idx"]
        after = steps.join(stop.select(*keys, "shadow_stop_step"), on=keys).filter(
            pl.col("step") > pl.col("shadow_stop_step")
        )
        out["trajectory gate"] = _score(
            stop.height, int((~stop["success"]).sum()), after.height,
            int(after["n_gen_tokens"].fill_null(0).sum()), n_steps, n_tokens,
        )  # fmt: skip
    return out


def shadow_frame(scores: Mapping[str, ShadowScore]) -> pl.DataFrame:
    """The report's table: one row per shadowed gate."""

    def pct(x: float) -> str:
        return "—" if x != x else f"{x:.1%}"

    rows = [
        {
            "gate": name,
            "would act on": f"{s.n} {'groups' if name == 'group gate' else 'trajectories'}",
            "right (by the full outcome)": f"{s.right} of {s.n}",
            "precision [95 % interval]": "—"
            if s.n == 0
            else f"{s.precision:.3f} [{s.low:.3f}, {s.high:.3f}]",
            "steps it would save": pct(s.steps_saved),
            "tokens it would save": pct(s.tokens_saved),
        }
        for name, s in scores.items()
    ]
    return pl.DataFrame(rows)


SHADOW_NOTE = (
    "Nothing was cut or stopped: every group played out, so each decision is scored by the full "
    "outcome. A cut is right iff its group's rewards are all equal (no GRPO gradient); a stop "
    "is right iff its trajectory failed. Savings are the environment steps and generated tokens "
    "after the decision, over all of the run's."
)
