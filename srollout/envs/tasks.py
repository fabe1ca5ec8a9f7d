"""Named task sets: generated games (``train``, ``eval``, ``heldout``) and the official ALFWorld
splits (``valid_seen``, ``valid_unseen``, ``valid_train``, ``alfworld_train``) from
``$ALFWORLD_DATA``.

Generated sets are deterministic and disjoint (docs/environments.md, "Task sets"); every game is
checked with the planner, whose plan is stored as the walkthrough, and cached under
``$SROLLOUT_HOME/games/<GEN_VERSION>/<difficulty tag>/<set>/<task_type>.jsonl``."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from srollout.atomic import atomic_write_text
from srollout.envs.base import TASK_TYPES, Task
from srollout.envs.gen import Difficulty, GameSpec, generate_game, resolve_difficulty
from srollout.errors import SrolloutError

GEN_VERSION = "v1"  # bump when the generator changes: old caches are then ignored

# The paper's valid_seen task-type mix (24/20/18/11/19/8 %).
TASK_MIX: dict[str, float] = {
    "pick_and_place_simple": 0.24,
    "pick_two_obj_and_place": 0.20,
    "pick_clean_then_place_in_recep": 0.18,
    "pick_heat_then_place_in_recep": 0.11,
    "pick_cool_then_place_in_recep": 0.19,
    "look_at_obj_in_light": 0.08,
}


@dataclass(frozen=True)
class TaskSetSpec:
    """A generated task set: default size, and whether rooms come from unseen scenes."""

    name: str
    size: int
    unseen: bool


TASK_SETS: dict[str, TaskSetSpec] = {
    "train": TaskSetSpec("train", 1000, unseen=False),
    "eval": TaskSetSpec("eval", 100, unseen=False),
    "heldout": TaskSetSpec("heldout", 100, unseen=True),
}
OFFICIAL_SPLITS: dict[str, str] = {
    "valid_seen": "valid_seen",
    "valid_unseen": "valid_unseen",
    "valid_train": "valid_train",
    "alfworld_train": "train",
}
_EVAL_BUCKETS = 10  # a seen-scene game is eval's iff hash % 10 == 0


def task_set_names() -> tuple[str, ...]:
    """Every name ``load_task_set`` accepts."""
    return tuple(TASK_SETS) + tuple(OFFICIAL_SPLITS)


def type_counts(n: int, mix: dict[str, float] = TASK_MIX) -> dict[str, int]:
    """Per-type counts for n tasks by largest remainder (n=100 -> exactly 24/20/18/11/19/8)."""
    raw = {t: n * w / sum(mix.values()) for t, w in mix.items()}
    counts = {t: int(v) for t, v in raw.items()}
    rest = n - sum(counts.values())
    for t in sorted(raw, key=lambda t: (counts[t] - raw[t], list(mix).index(t)))[:rest]:
        counts[t] += 1
    return counts


def schedule(name: str, n: int) -> list[tuple[str, int]]:
    """The ordered (task_type, k) list of the first n tasks of a set: type counts from
    :func:`type_counts`, interleaved by a fixed shuffle so any prefix is mixed."""
    order = [(t, k) for t, c in type_counts(n).items() for k in range(c)]
    random.Random(f"srollout-schedule:{name}").shuffle(order)
    return order


def _text_hash(game: GameSpec | GameRecord) -> int:
    return int(
        hashlib.sha1((game.task_text + "\n" + game.pddl_problem).encode()).hexdigest()[:12], 16
    )


def _belongs(name: str, spec: GameSpec) -> bool:
    if TASK_SETS[name].unseen:
        return True
    bucket = _text_hash(spec) % _EVAL_BUCKETS
    return (bucket == 0) == (name == "eval")


def games_dir(difficulty: Difficulty) -> Path:
    """Where a difficulty's generated sets are cached."""
    from srollout.home import srollout_home

    return srollout_home() / "games" / GEN_VERSION / difficulty.tag


@dataclass(frozen=True)
class GameRecord:
    """One cached, planner-checked game (a line of the cache)."""

    k: int
    task_type: str
    task_text: str
    floorplan: int
    seed: int
    pddl_problem: str
    walkthrough: tuple[str, ...]


def _read_cache(path: Path) -> list[GameRecord]:
    if not path.exists():
        return []
    with open(path) as f:
        rows = [json.loads(line) for line in f]
    return [GameRecord(**{**d, "walkthrough": tuple(d["walkthrough"])}) for d in rows]


def _write_cache(path: Path, records: list[GameRecord]) -> None:
    atomic_write_text("".join(json.dumps(dataclasses.asdict(r)) + "\n" for r in records), path)


def solve_check(spec: GameSpec, env=None) -> tuple[str, ...] | None:
    """Play the planner's plan on the real engine; the walkthrough if it reaches ``won``."""
    from srollout.envs.alfworld_env import AlfworldEnv

    own = env is None
    env = env or AlfworldEnv()
    try:
        task = _task_from(spec.task_type, spec.task_text, spec.pddl_problem, (), "check", "")
        _, info = env.reset(task, 0)
        plan = info.expert_plan
        if not plan:
            return None
        for a in plan:
            r = env.step(a)
            if not r.valid:
                return None
        return plan if r.done else None
    finally:
        if own:
            env.close()


def _task_from(
    task_type: str,
    task_text: str,
    problem: str,
    walkthrough: tuple[str, ...],
    task_id: str,
    source: str,
    **meta,
) -> Task:
    return Task(
        task_id=task_id,
        task_type=task_type,
        task_text=task_text + ".",
        source=source,
        meta={"pddl_problem": problem, "walkthrough": tuple(walkthrough), **meta},
    )


def _generate_one(
    name: str,
    task_type: str,
    k: int,
    difficulty: Difficulty,
    seen: set[int],
    env,
    set_seed: int = 0,
) -> GameRecord:
    """Task k of a type in a set: the first candidate that is the set's, new, and solvable."""
    spec_set = TASK_SETS[name]
    prefix = f"{name}:{task_type}:{k}" if set_seed == 0 else f"{name}:{set_seed}:{task_type}:{k}"
    for attempt in range(1000):
        seed = int(hashlib.sha1(f"{prefix}:{attempt}".encode()).hexdigest()[:12], 16)
        spec = generate_game(task_type, seed, difficulty, unseen=spec_set.unseen)
        h = _text_hash(spec)
        if h in seen or not _belongs(name, spec):
            continue
        walkthrough = solve_check(spec, env)
        if walkthrough is None:
            continue
        seen.add(h)
        return GameRecord(
            k, task_type, spec.task_text, spec.floorplan, seed, spec.pddl_problem, walkthrough
        )
    raise SrolloutError(f"could not generate {name} task {task_type} #{k}")


def _set_dir(name: str, difficulty: Difficulty, set_seed: int) -> Path:
    return games_dir(difficulty) / (name if set_seed == 0 else f"{name}-s{set_seed}")


def ensure_generated(
    name: str,
    difficulty: Difficulty,
    counts: dict[str, int],
    progress: bool | Callable[[int, int], None] = True,
    set_seed: int = 0,
) -> dict[str, list[GameRecord]]:
    """Generate (once) and return the first ``counts[t]`` games of each type of a set.

    progress: True shows the stages' progress bar (off a terminal a line every 30 s, so a log is
    not silent while a fresh machine generates); a callable gets ``(done, total)`` instead."""
    root = _set_dir(name, difficulty, set_seed)
    have = {t: _read_cache(root / f"{t}.jsonl") for t in counts}
    missing = sum(max(0, c - len(have[t])) for t, c in counts.items())
    if missing:
        from srollout.console import make_console
        from srollout.envs.alfworld_env import AlfworldEnv
        from srollout.progress import StageBar

        env = AlfworldEnv()
        report = progress if callable(progress) else None
        try:
            with StageBar(
                make_console(),
                f"generating {name} games ({difficulty.tag})",
                missing,
                enabled=progress is True,
                unit="games",
            ) as bar:
                done = 0
                if report is not None:
                    report(0, missing)
                for t, c in counts.items():
                    if len(have[t]) >= c:
                        continue
                    seen = {_text_hash(r) for r in have[t]}
                    for k in range(len(have[t]), c):
                        have[t].append(_generate_one(name, t, k, difficulty, seen, env, set_seed))
                        done += 1
                        bar.update(
                            completed=done,
                            info=f"{done / (time.perf_counter() - bar.t0):.1f} games/s",
                        )
                        if report is not None:
                            report(done, missing)
                        if (k + 1) % 50 == 0:  # an interrupted run keeps what it made
                            _write_cache(root / f"{t}.jsonl", have[t])
                    _write_cache(root / f"{t}.jsonl", have[t])
        finally:
            env.close()
    return {t: have[t][:c] for t, c in counts.items()}


def rooms_note(name: str, difficulty: str) -> str:
    """`` (small rooms)`` for a generated set, for reports; nothing for an official split."""
    return "" if name in OFFICIAL_SPLITS else f" ({difficulty} rooms)"


def load_task_set(
    name: str,
    difficulty: str | Difficulty = "small",
    n: int | None = None,
    *,
    seed: int = 0,
    progress: bool | Callable[[int, int], None] = True,
) -> list[Task]:
    """The tasks of a named set (docs/environments.md), generating (once, cached) what is missing;
    in a fixed interleaved order, ``task_id`` ``<set>/<task_type>/<k>``.

    difficulty: a preset name or a Difficulty (ignored for the official splits); n: number of tasks
    (default: the set's size); seed: 0 gives the standard sets, another seed another draw of the
    same kind (still disjoint from the other sets' draws)."""
    if name in OFFICIAL_SPLITS:
        return load_official(name, n)
    if name not in TASK_SETS:
        raise SrolloutError(
            f"unknown task set {name!r}; choose one of {', '.join(task_set_names())}"
        )
    if n is not None and n < 1:
        raise SrolloutError(f"number of tasks must be >= 1, got {n}")
    diff = resolve_difficulty(difficulty)
    size = n if n is not None else TASK_SETS[name].size
    order = schedule(name if seed == 0 else f"{name}:{seed}", size)
    counts = type_counts(size)
    records = ensure_generated(name, diff, counts, progress=progress, set_seed=seed)
    root = _set_dir(name, diff, seed)
    tasks = []
    for t, k in order:
        r = records[t][k]
        tasks.append(
            _task_from(
                t,
                r.task_text,
                r.pddl_problem,
                r.walkthrough,
                f"{name}/{t}/{k:04d}",
                str(root / f"{t}.jsonl"),
                floorplan=r.floorplan,
                difficulty=diff.tag,
                k=k,
            )
        )
    return tasks


def write_game_file(task: Task, path: str | Path) -> Path:
    """Write a task as a standard ``game.tw-pddl`` file (loadable by ALFWorld/TextWorld)."""
    from srollout.envs.alfworld_env import game_dict

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(game_dict(task)))
    return path


# --- official data ----------------------------------------------------------------------------

_HOW_TO_GET = (
    "get them with `pip install alfworld==0.4.2 && alfworld-download` (needs internet) "
    "and `export ALFWORLD_DATA=<that folder>` (default ~/.cache/alfworld)"
)


def official_data_dir() -> Path:
    """``$ALFWORLD_DATA/json_2.1.1``, or a SrolloutError saying how to get it."""
    root = os.environ.get("ALFWORLD_DATA") or "~/.cache/alfworld"
    path = Path(root).expanduser() / "json_2.1.1"
    if not path.is_dir():
        raise SrolloutError(f"no official ALFWorld games under {path}; {_HOW_TO_GET}")
    return path


def load_official(name: str, n: int | None = None) -> list[Task]:
    """Official games of a split (as ALFWorld's AlfredTWEnv selects them: solvable, no
    movable-receptacle or sliced tasks), sorted by path; the first n if given."""
    if name not in OFFICIAL_SPLITS:
        raise SrolloutError(
            f"unknown official split {name!r}; choose one of {', '.join(OFFICIAL_SPLITS)}"
        )
    split_dir = official_data_dir() / OFFICIAL_SPLITS[name]
    if not split_dir.is_dir():
        raise SrolloutError(f"no official split {name} under {split_dir}; {_HOW_TO_GET}")
    tasks: list[Task] = []
    for game_file in sorted(split_dir.rglob("game.tw-pddl")):
        rel = game_file.parent.relative_to(split_dir)
        traj_file = game_file.parent / "traj_data.json"
        if "movable" in str(rel) or "Sliced" in str(rel) or not traj_file.exists():
            continue
        traj = json.loads(traj_file.read_text())
        if traj.get("task_type") not in TASK_TYPES:
            continue
        data = json.loads(game_file.read_text())
        if not data.get("solvable", False):
            continue
        tasks.append(
            Task(
                task_id=f"{name}/{rel}",
                task_type=traj["task_type"],
                task_text=_official_task_text(data, traj, str(rel)),
                source=str(game_file),
                meta={"official": True},
            )
        )
        if n is not None and len(tasks) >= n:
            break
    if not tasks:
        raise SrolloutError(f"no playable games found under {split_dir}; {_HOW_TO_GET}")
    return tasks


def _official_task_text(game: dict, traj: dict, rel: str) -> str:
    """The goal sentence: from the game's grammar, else ALFWorld's template for the trajectory
    (seeded by the game's path so it is stable)."""
    from srollout.envs.alfworld_env import _TASK_RULE

    m = _TASK_RULE.search(game.get("grammar", ""))
    if m and "UNKNOWN GOAL" not in m.group(2):
        text = json.loads('"' + m.group(2) + '"')
        return text[len("Your task is to: ") :].strip()
    from srollout.envs.gen import _goals

    p = traj["pddl_params"]
    template = random.Random(rel).choice(_goals()[traj["task_type"]]["templates"])
    return (
        template.format(
            obj=p["object_target"].lower(),
            recep=p["parent_target"].lower(),
            toggle=p["toggle_target"].lower(),
            mrecep=p["mrecep_target"].lower(),
        )
        + "."
    )
