"""Deterministic ALFWorld game generation from the files the ``alfworld`` wheel ships.

A game is a PDDL problem for the wheel's ``alfred.pddl`` domain, written as ALFWorld's own
generator writes them, in a real FloorPlan room, with the goal library's templates; the format
and the difficulty presets: docs/environments.md. Everything here is pure and deterministic given
``(task_type, seed, difficulty)``; the planner only checks solvability (``srollout.envs.tasks``)."""

from __future__ import annotations

import functools
import json
import os
import random
from dataclasses import dataclass
from pathlib import Path

from srollout.envs.base import TASK_TYPES
from srollout.errors import SrolloutError

# Which appliance a task type needs, and the receptacle type it must not be placed in at start.
_APPLIANCE = {
    "pick_clean_then_place_in_recep": "SinkBasin",
    "pick_heat_then_place_in_recep": "Microwave",
    "pick_cool_then_place_in_recep": "Fridge",
}
_ABILITY = {
    "pick_clean_then_place_in_recep": "Cleanable",
    "pick_heat_then_place_in_recep": "Heatable",
    "pick_cool_then_place_in_recep": "Coolable",
}
_LAMPS = ("DeskLamp", "FloorLamp")
# Receptacles a lamp may stand on (lamps are in no canContain set, so ALFWorld's own list).
_LAMP_STANDS = ("Desk", "SideTable", "Dresser", "Shelf", "CoffeeTable", "DiningTable", "TVStand")
# The domain's actions name these types as constants; declaring them always keeps every
# problem valid whether or not the room has a sink, microwave, fridge or knife.
_DOMAIN_RTYPES = ("SinkBasin", "Microwave", "Fridge")
_DOMAIN_OTYPES = ("Knife", "ButterKnife")
_OPENABLE = ("Fridge", "Cabinet", "Microwave", "Drawer", "Safe", "Box")
_START = "loc|99|99|0|30"  # the agent starts away from every receptacle: "middle of a room"


@dataclass(frozen=True)
class Difficulty:
    """How hard a generated room is: receptacle instances kept (the task's own always; ``0``: the
    whole FloorPlan layout) and objects placed besides the task's own (and lamp)."""

    max_receptacles: int = 6
    n_distractors: int = 3

    @property
    def tag(self) -> str:
        """Short stable name used in cache paths, e.g. ``r6-d3`` (``rall-d12`` for full rooms)."""
        r = "all" if self.max_receptacles <= 0 else str(self.max_receptacles)
        return f"r{r}-d{self.n_distractors}"


# Named presets. "small" is the default: the probe found a small policy needs small rooms.
# The planner's cost grows steeply with receptacles x movable objects (a full kitchen with 5
# distractors can take ~30 s to plan), so the big presets keep few distractors.
DIFFICULTIES: dict[str, Difficulty] = {
    "small": Difficulty(max_receptacles=6, n_distractors=3),
    "medium": Difficulty(max_receptacles=10, n_distractors=6),
    "large": Difficulty(max_receptacles=16, n_distractors=6),
    "full": Difficulty(max_receptacles=0, n_distractors=3),
}


def resolve_difficulty(difficulty: str | Difficulty) -> Difficulty:
    """A preset name (``small|medium|large|full``) or a Difficulty -> Difficulty."""
    if isinstance(difficulty, Difficulty):
        if difficulty.n_distractors < 0:
            raise SrolloutError("difficulty n_distractors must be >= 0")
        return difficulty
    if difficulty not in DIFFICULTIES:
        raise SrolloutError(
            f"unknown difficulty {difficulty!r}; choose one of {', '.join(DIFFICULTIES)}"
        )
    return DIFFICULTIES[difficulty]


@dataclass(frozen=True)
class GameSpec:
    """One generated game before the planner has seen it: the goal (task_text without the final
    period, which the grammar adds), the ALFRED scene number, the goal's object, receptacle and lamp
    types ("" when none) and the PDDL problem text."""

    task_type: str
    task_text: str
    floorplan: int
    obj: str
    recep: str
    toggle: str
    pddl_problem: str


# --- the wheel's data -------------------------------------------------------------------------


@functools.lru_cache(maxsize=1)
def _alfworld_root() -> Path:
    """The installed ``alfworld`` package directory (found without importing it)."""
    import importlib.util

    spec = importlib.util.find_spec("alfworld")
    if spec is None or not spec.submodule_search_locations:
        raise SrolloutError(
            "the ALFWorld engine is not installed; run `pip install alfworld==0.4.2` "
            "(or `make setup`)"
        )
    return Path(next(iter(spec.submodule_search_locations)))


@functools.lru_cache(maxsize=1)
def domain_text() -> str:
    """The wheel's PDDL domain (``alfworld/data/alfred.pddl``)."""
    return (_alfworld_root() / "data" / "alfred.pddl").read_text()


@functools.lru_cache(maxsize=1)
def grammar_text() -> str:
    """The wheel's TextWorld grammar (``alfworld/data/alfred.twl2``), with "UNKNOWN GOAL"."""
    return (_alfworld_root() / "data" / "alfred.twl2").read_text()


def grammar_for(task_text: str) -> str:
    """The grammar with its placeholder goal replaced by ``task_text`` (no final period)."""
    return grammar_text().replace("UNKNOWN GOAL", task_text)


def prepare_alfworld_import() -> None:
    """Set ``$ALFWORLD_DATA`` before alfworld is imported (``alfworld.info`` creates it at
    import): alfworld's default ``~/.cache/alfworld`` if it exists, else a folder under
    ``$SROLLOUT_HOME``, so importing the engine never writes outside our cache."""
    if not os.environ.get("ALFWORLD_DATA"):
        from srollout.home import srollout_home

        home_default = Path("~/.cache/alfworld").expanduser()
        os.environ["ALFWORLD_DATA"] = str(
            home_default if home_default.is_dir() else srollout_home() / "alfworld-data"
        )


@functools.lru_cache(maxsize=1)
def _constants():
    prepare_alfworld_import()
    from alfworld.gen import constants

    return constants


@functools.lru_cache(maxsize=1)
def _goals() -> dict:
    prepare_alfworld_import()
    from alfworld.gen import goal_library

    return goal_library.gdict


@dataclass(frozen=True)
class Layout:
    """A FloorPlan: its receptacle instances (id -> (x, z, rotation, horizon)) and object types."""

    floorplan: int
    receptacles: dict[str, tuple[int, int, int, int]]
    object_types: tuple[str, ...]


@functools.cache
def load_layout(floorplan: int) -> Layout:
    """Read ``FloorPlan<n>-openable.json`` / ``-objects.json`` from the wheel."""
    root = _alfworld_root() / "gen" / "layouts"
    recs = json.loads((root / f"FloorPlan{floorplan}-openable.json").read_text())
    objs = json.loads((root / f"FloorPlan{floorplan}-objects.json").read_text())
    # Poses are metres / degrees; ALFWorld's locations are grid cells of 0.25 m.
    receptacles = {
        rid: (int(round(p[0] / 0.25)), int(round(p[1] / 0.25)), int(p[2]) // 90, int(p[3]))
        for rid, p in sorted(recs.items())
    }
    return Layout(floorplan, receptacles, tuple(sorted(objs)))


def floorplans(scene_type: str) -> tuple[int, ...]:
    """FloorPlan numbers of a scene type (Kitchen, LivingRoom, Bedroom, Bathroom) in the wheel."""
    root = _alfworld_root() / "gen" / "layouts"
    nums = _constants().SCENE_TYPE[scene_type]
    return tuple(n for n in nums if (root / f"FloorPlan{n}-openable.json").exists())


def seen_floorplans(task_type: str) -> tuple[int, ...]:
    """Floorplans for train/eval games: ALFRED's train scenes valid for the task type."""
    train = set(_constants().TRAIN_SCENE_NUMBERS)
    return tuple(n for n in _valid_floorplans(task_type) if n in train)


def unseen_floorplans(task_type: str) -> tuple[int, ...]:
    """Floorplans for held-out games: ALFRED's test scenes, never used by train/eval."""
    test = set(_constants().TEST_SCENE_NUMBERS)
    return tuple(n for n in _valid_floorplans(task_type) if n in test)


def _valid_floorplans(task_type: str) -> tuple[int, ...]:
    scene_types = sorted(_constants().GOALS_VALID[task_type])
    return tuple(sorted(n for st in scene_types for n in floorplans(st)))


def receptacle_type(rid: str) -> str:
    """``Sink|-01.90|+00.97|-01.50|SinkBasin`` -> ``SinkBasin``; ``Cabinet|...`` -> ``Cabinet``."""
    parts = rid.split("|")
    return parts[-1] if len(parts) > 4 else parts[0]


def mangle(name: str) -> str:
    """ALFWorld's PDDL-safe id (``planned_game_state.fix_pddl_str_chars``)."""
    for a, b in (
        ("-", "_minus_"),
        ("|", "_bar_"),
        ("+", "_plus_"),
        (".", "_dot_"),
        (",", "_comma_"),
    ):
        name = name.replace(a, b)
    return name


def _placeable(otype: str) -> list[str]:
    """Receptacle types that can hold an object type (canContain)."""
    vro = _constants().VAL_RECEPTACLE_OBJECTS
    return sorted(rt for rt, objs in vro.items() if otype in objs)


def _pickupable_types(layout: Layout) -> list[str]:
    """Object types of the scene that can be picked up and put somewhere (no slices, no lamps)."""
    c = _constants()
    static = set(c.RECEPTACLES) - set(c.MOVABLE_RECEPTACLES)
    return [
        t
        for t in layout.object_types
        if t not in static and "Sliced" not in t and t not in _LAMPS and _placeable(t)
    ]


# --- generation -------------------------------------------------------------------------------


def generate_game(
    task_type: str,
    seed: int,
    difficulty: Difficulty,
    *,
    unseen: bool = False,
    floorplans: tuple[int, ...] | None = None,
    max_tries: int = 200,
) -> GameSpec:
    """One game of ``task_type`` from ``seed`` (same inputs -> same game, on every machine).

    unseen: draw the room from ALFRED's test scenes; floorplans: restrict the room to these. A
    SrolloutError if no valid game is found in ``max_tries`` draws (never for the wheel's layouts).
    """
    if task_type not in TASK_TYPES:
        raise SrolloutError(
            f"unknown task type {task_type!r}; choose one of {', '.join(TASK_TYPES)}"
        )
    # random.Random(str) hashes the string with SHA-512: stable across runs and machines.
    rng = random.Random(f"srollout-game:{task_type}:{seed}:{difficulty.tag}:{int(unseen)}")
    plans = unseen_floorplans(task_type) if unseen else seen_floorplans(task_type)
    if floorplans is not None:
        plans = tuple(n for n in _valid_floorplans(task_type) if n in set(floorplans))
        if not plans:
            raise SrolloutError(f"none of FloorPlans {list(floorplans)} can host {task_type}")
    for _ in range(max_tries):
        spec = _try_generate(task_type, rng.choice(plans), rng, difficulty)
        if spec is not None:
            return spec
    raise SrolloutError(f"could not generate a {task_type} game from seed {seed}")


def _try_generate(
    task_type: str, floorplan: int, rng: random.Random, difficulty: Difficulty
) -> GameSpec | None:
    """One draw; None when the room cannot host the drawn task (the caller redraws)."""
    c = _constants()
    layout = load_layout(floorplan)
    recs = list(layout.receptacles)
    by_type: dict[str, list[str]] = {}
    for r in recs:
        by_type.setdefault(receptacle_type(r), []).append(r)
    pickable = _pickupable_types(layout)
    if not pickable:
        return None

    # 1. the goal: object type, receptacle type, appliance / lamp.
    appliance = _APPLIANCE.get(task_type, "")
    if appliance and appliance not in by_type:
        return None
    candidates = pickable
    if task_type in _ABILITY:
        candidates = [t for t in pickable if t in c.VAL_ACTION_OBJECTS[_ABILITY[task_type]]]
    if not candidates:
        return None
    obj = rng.choice(candidates)
    toggle, recep = "", ""
    required: list[str] = []
    if appliance:
        required.append(rng.choice(by_type[appliance]))
    if task_type == "look_at_obj_in_light":
        lamps = [t for t in _LAMPS if t in layout.object_types]
        stands = [r for r in recs if receptacle_type(r) in _LAMP_STANDS]
        if not lamps or not stands:
            return None
        toggle = rng.choice(lamps)
        lamp_stand = rng.choice(stands)
        required.append(lamp_stand)
    else:
        # the goal receptacle: a type in the room that can hold obj, not the task's appliance
        goal_types = [t for t in sorted(by_type) if t in _placeable(obj) and t != appliance]
        if not goal_types:
            return None
        recep = rng.choice(goal_types)
        required.append(rng.choice(by_type[recep]))

    # 2. the room: required receptacles, plus random others up to max_receptacles.
    others = [r for r in recs if r not in required]
    rng.shuffle(others)
    n_room = len(recs) if difficulty.max_receptacles <= 0 else difficulty.max_receptacles
    room = list(dict.fromkeys(required + others[: max(0, n_room - len(required))]))

    # 3. where the task's objects start: a receptacle that can hold them, not the goal type
    # (else the task is half done) and not the fridge for a cool task (that would cool it).
    def spots(otype: str, avoid: set[str]) -> list[str]:
        ok = set(_placeable(otype))
        return [r for r in room if receptacle_type(r) in ok and receptacle_type(r) not in avoid]

    avoid = {recep} if recep else set()
    if task_type == "pick_cool_then_place_in_recep":
        avoid.add("Fridge")
    if task_type == "look_at_obj_in_light":
        avoid.add(receptacle_type(required[-1]))  # object not already next to the lamp
    start_spots = spots(obj, avoid)
    if not start_spots:
        # add one receptacle from the layout that can host it (the room grows by one)
        extra = [
            r
            for r in others[max(0, n_room - len(required)) :]
            if receptacle_type(r) in set(_placeable(obj)) - avoid
        ]
        if not extra:
            return None
        room.append(rng.choice(extra))
        start_spots = spots(obj, avoid)

    n_obj = 2 if task_type == "pick_two_obj_and_place" else 1
    placements: list[tuple[str, str]] = []  # (object id, receptacle id)
    counts: dict[str, int] = {}

    def place(otype: str, where: str) -> None:
        counts[otype] = counts.get(otype, 0) + 1
        placements.append((f"{otype}|{counts[otype]:02d}|{floorplan}", where))

    for _ in range(n_obj):
        place(obj, rng.choice(start_spots))
    if toggle:
        place(toggle, required[-1])

    # 4. distractors: other object types of the scene, anywhere they fit.
    distractor_types = [t for t in pickable if t != obj]
    for _ in range(difficulty.n_distractors):
        if not distractor_types:
            break
        t = rng.choice(distractor_types)
        where = spots(t, set())
        if where:
            place(t, rng.choice(where))

    templates = _goals()[task_type]["templates"]
    text = rng.choice(templates).format(
        obj=obj.lower(), recep=recep.lower(), toggle=toggle.lower(), mrecep=""
    )
    problem = _write_problem(task_type, layout, sorted(room), placements, obj, recep, toggle)
    return GameSpec(task_type, text, floorplan, obj, recep, toggle, problem)


def _write_problem(
    task_type: str,
    layout: Layout,
    room: list[str],
    placements: list[tuple[str, str]],
    obj: str,
    recep: str,
    toggle: str,
) -> str:
    """The PDDL problem text (ids mangled as ALFWorld does; ``#`` in goals becomes ``-``)."""
    c = _constants()
    # One location per receptacle: ALFRED poses can coincide (two cabinets seen from one
    # spot), and then "go to cabinet 2" from cabinet 1 is not an action, which only confuses.
    locs: dict[str, str] = {}
    used: set[tuple[int, int, int, int]] = set()
    for rid in sorted(room):
        x, z, rot, hor = layout.receptacles[rid]
        while (x, z, rot, hor) in used:
            hor += 1
        used.add((x, z, rot, hor))
        locs[rid] = f"loc|{x}|{z}|{rot}|{hor}"

    otypes = sorted({o.split("|")[0] for o, _ in placements} | set(_DOMAIN_OTYPES))
    rtypes = sorted({receptacle_type(r) for r in room} | set(_DOMAIN_RTYPES))
    # Bowl, Cup, ... are both movable receptacles and objects: declare them once, as otype.
    rtypes = [t for t in rtypes if t not in otypes]
    locations = sorted({locs[r] for r in room}) + [_START]
    objs = [o for o, _ in placements]
    lines = [
        "(define (problem plan_srollout)",
        "    (:domain alfred)",
        "    (:objects",
        "        agent1 - agent",
    ]
    lines += [f"        {o} - object" for o in objs]
    lines += [f"        {r} - receptacle" for r in room]
    lines += [f"        {t}Type - otype" for t in otypes]
    lines += [f"        {t}Type - rtype" for t in rtypes]
    lines += [f"        {x} - location" for x in locations]
    lines += ["    )", "    (:init", f"        (atLocation agent1 {_START})"]
    for r in room:
        rt = receptacle_type(r)
        lines.append(f"        (receptacleType {r} {rt}Type)")
        lines.append(f"        (receptacleAtLocation {r} {locs[r]})")
        if rt in _OPENABLE:
            lines.append(f"        (openable {r})")
    abilities = (("Cleanable", "cleanable"), ("Heatable", "heatable"), ("Coolable", "coolable"))
    for o, r in placements:
        ot = o.split("|")[0]
        lines.append(f"        (objectType {o} {ot}Type)")
        lines.append(f"        (inReceptacle {o} {r})")
        lines.append(f"        (objectAtLocation {o} {locs[r]})")
        if ot in _LAMPS:
            lines.append(f"        (toggleable {o})")
            continue
        lines.append(f"        (pickupable {o})")
        for key, pred in abilities:
            if ot in c.VAL_ACTION_OBJECTS[key]:
                lines.append(f"        ({pred} {o})")
        if receptacle_type(r) == "Fridge" and ot in c.VAL_ACTION_OBJECTS["Coolable"]:
            lines.append(f"        (isCool {o})")  # ALFWorld: what starts in the fridge is cool
    for rt in sorted({receptacle_type(r) for r in room}):
        for ot in otypes:
            if ot in c.VAL_RECEPTACLE_OBJECTS.get(rt, ()):
                lines.append(f"        (canContain {rt}Type {ot}Type)")
    lines.append("    )")
    goal = _goals()[task_type]["pddl"].format(obj=obj, recep=recep, toggle=toggle, mrecep="")
    text = "\n".join(lines) + "\n" + goal.replace("#", "-")
    # mangle ids but not the PDDL syntax: only ids contain | + . , and '-' inside ids
    return _mangle_problem(text)


def _mangle_problem(text: str) -> str:
    """Mangle ids token by token (a bare '-' is PDDL's type separator and stays)."""
    out = []
    for line in text.split("\n"):
        toks = line.split(" ")
        out.append(" ".join(_mangle_token(t) for t in toks))
    return "\n".join(out)


def _mangle_token(tok: str) -> str:
    if "|" not in tok:
        return tok
    # a token may carry parentheses, e.g. "loc|1|2|0|30)"
    core = tok.rstrip(")")
    return mangle(core) + tok[len(core) :]
