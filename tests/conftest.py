"""Shared fixtures: hand-built artifact tables and an in-process CLI runner.

Kept generic on purpose; add fixtures for other stages below.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import NamedTuple

import polars as pl
import pytest

from srollout import schemas


class Traj(NamedTuple):
    """One trajectory of a hand-built group: its actions in step order and its final reward."""

    actions: Sequence[str]
    reward: float


class GroupSpec(NamedTuple):
    """A hand-built group: task type and its trajectories."""

    task_type: str
    trajectories: Sequence[Traj]


def build_steps(groups: Mapping[str, GroupSpec]) -> pl.DataFrame:
    """A valid steps table (every column of schemas.STEPS) from hand-written groups.

    The reward of a trajectory sits on its last step (0 before), done is True on the last step,
    observation = "obs:<action>" (the environment's answer to it), n_gen_tokens = 5 per step.
    """
    rows = []
    for group_id, spec in groups.items():
        task_type, trajectories = spec
        for traj_idx, (actions, reward) in enumerate(trajectories):
            n = len(actions)
            for t, action in enumerate(actions, start=1):
                rows.append(
                    {
                        "group_id": group_id,
                        "traj_idx": traj_idx,
                        "task_id": f"task-{group_id}",
                        "task_type": task_type,
                        "step": t,
                        "thought": "",
                        "action": action,
                        "response": f"Action: {action}",
                        "observation": f"obs:{action}",
                        "valid": True,
                        "reward": float(reward) if t == n else 0.0,
                        "done": t == n,
                        "n_prompt_tokens": 10,
                        "n_gen_tokens": 5,
                        "gen_s": 0.01,
                        "env_s": 0.001,
                    }
                )
    return pl.DataFrame(rows, schema=schemas.STEPS.columns)


@pytest.fixture
def steps_table() -> Callable[[Mapping[str, GroupSpec]], pl.DataFrame]:
    """``steps_table({group_id: (task_type, [(actions, reward), ...])})`` -> a valid steps
    DataFrame (plain tuples work: GroupSpec and Traj are NamedTuples)."""
    return build_steps


def _disjoint(i: int, n: int) -> list[str]:
    return [f"t{i}-action{t}" for t in range(1, n + 1)]


# A buffer small enough to work by hand (G=4, evaluated at K=4, T_max=10). Numbers at K=4:
#   group  task type   final rewards  label        σ_r²    d_4    τ_4   steps (remaining after 4)
#   a      simple      1 1 1 1        all_succeed  0       0      1.0   3 3 3 3   = 12 (0)
#   b      simple      1 0 0 0        mixed        0.1875  0      0     8 8 8 8   = 32 (16)
#   c      clean       0 0 0 0        all_fail     0       0.125  0     6 6 6 6   = 24 (8)
#   d      clean       1 0 1 0        mixed        0.25    1      0     10 10 5 4 = 29 (13)
# a ends (all four trajectories) at step 3, before K: its prefixes are END-padded and identical.
# c: trajectory 1 differs from the other three at step 4 only -> 3 pairs at 1/4 of 6 -> 0.125.
# d: every trajectory uses its own actions -> every pair at distance 1.
HAND_BUFFER = {
    "a": GroupSpec(
        "pick_and_place_simple",
        [Traj(["go to shelf 1", "take mug 1 from shelf 1", "put mug 1 in/on desk 1"], 1.0)] * 4,
    ),
    "b": GroupSpec(
        "pick_and_place_simple",
        [
            Traj(
                [
                    "open drawer 1",
                    "close drawer 1",
                    "open drawer 2",
                    "close drawer 2",
                    *_disjoint(i, 4),
                ],
                r,
            )
            for i, r in enumerate((1, 0, 0, 0))
        ],
    ),
    "c": GroupSpec(
        "pick_clean_then_place",
        [
            Traj(
                [
                    "look",
                    "inventory",
                    "go to sink 1",
                    "look" if i != 1 else "examine sink 1",
                    "look",
                    "look",
                ],
                0.0,
            )
            for i in range(4)
        ],
    ),
    "d": GroupSpec(
        "pick_clean_then_place",
        [Traj(_disjoint(i, n), r) for i, (n, r) in enumerate(((10, 1), (10, 0), (5, 1), (4, 0)))],
    ),
}


@pytest.fixture
def hand_buffer(tmp_path: Path) -> Path:
    """A run directory holding the steps.parquet of HAND_BUFFER (numbers in the comment above)."""
    run = tmp_path / "buffer"
    schemas.write(build_steps(HAND_BUFFER), run / "steps.parquet", schemas.STEPS)
    return run


class CliResult(NamedTuple):
    exit_code: int
    stdout: str
    stderr: str


@pytest.fixture
def run_cli(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> Callable[..., CliResult]:
    """Run ``srollout ARGS...`` in-process through the real entry point (``srollout.cli.app.main``,
    so known errors become exit code 2 and one red line); returns exit code, stdout, stderr."""
    from srollout.cli.app import main

    def run(*args: str | Path) -> CliResult:
        capsys.readouterr()
        monkeypatch.setattr(sys, "argv", ["srollout", *map(str, args)])
        monkeypatch.setenv("COLUMNS", "200")
        code = 0
        try:
            main()
        except SystemExit as done:
            code = done.code if isinstance(done.code, int) else (0 if done.code is None else 1)
        captured = capsys.readouterr()
        return CliResult(code, captured.out, captured.err)

    return run


@pytest.fixture(scope="session")
def tiny_policy(tmp_path_factory) -> Path:
    """A ~30k-parameter Qwen2 + BPE tokenizer (real HF directory), built once per test session."""
    from tiny_policy import build_tiny_policy

    return build_tiny_policy(tmp_path_factory.mktemp("tiny-policy") / "model", seed=0, n_demos=60)


@pytest.fixture(scope="session")
def default_model() -> Path:
    """The default policy the package ships (v5, 3.3M parameters): the real model the end-to-end
    tests of collect, ab-rollout and training roll out. Tests that need weights they control use
    ``tiny_policy``."""
    from srollout.default_policy import default_policy

    return default_policy()


@pytest.fixture(scope="session")
def cooldown_arm() -> str:
    """examples/custom_arm/cooldown_arm.py imported, so ``@skip_part("cooldown")`` registers the
    skip part of that example package in this process; the part's name."""
    import importlib
    import sys

    folder = str(Path(__file__).resolve().parents[1] / "examples" / "custom_arm")
    if folder not in sys.path:
        sys.path.insert(0, folder)
    importlib.import_module("cooldown_arm")
    return "cooldown"


def linked_docs(text: str) -> str:
    """The sections of docs/ that ``text`` (a report's prose) links to, joined: a report gives a
    run's numbers and links to the doc that explains them. Fails when ``text`` links nowhere or a
    link names no heading of its page (anchors as GitHub makes them, worked out here on their own:
    lower case, punctuation but hyphens dropped, spaces to hyphens)."""
    import re

    links = re.findall(r"\]\(docs/([\w-]+\.md)#([^)]+)\)", text)
    assert links, f"no link to docs/ in {text!r}"
    docs = Path(__file__).resolve().parents[1] / "docs"
    found = []
    for page, anchor in links:
        sections = re.split(r"^(?=#+ )", (docs / page).read_text(), flags=re.M)
        by_anchor = {
            re.sub(r"[^\w\- ]", "", s.splitlines()[0].lstrip("#").strip().lower()).replace(
                " ", "-"
            ): s
            for s in sections
            if s.startswith("#")
        }
        assert anchor in by_anchor, f"docs/{page} has no heading #{anchor}"
        found.append(by_anchor[anchor])
    return "\n".join(found)


# A pytest-xdist worker's environment holds COLUMNS=80, which a serial run's has not: the stages
# the tests start would print 80 columns wide instead of srollout's 160 off a terminal
# (srollout.console), and wrap the table rows the tests read. Every run sees one width.
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.pop("COLUMNS", None)

# `make test` runs the suite on two workers (pytest-xdist, `--dist loadfile`: a file's tests and
# its module fixtures, a vLLM server say, stay on one worker). A worker takes the next file in
# collection order when it finishes one, so the slowest files go first and the many short unit
# files fill the end: the two workers then finish close together.
_TIER_ORDER = {"golden": 0, "component": 1, "integration": 2, "unit": 3}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    def tier(item: pytest.Item) -> int:
        return _TIER_ORDER.get(item.path.parent.name, len(_TIER_ORDER))

    items.sort(key=tier)  # stable: a file's tests keep their order
