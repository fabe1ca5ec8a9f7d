"""The layering of srollout, read from the source: a package imports only the layers below it, and
no module imports itself round a loop of other modules.

Every ``import`` statement counts, the ones inside functions included: an import put in a function
to dodge a cycle is still a dependency. An import names one module: ``from srollout.envs import
gen`` is an edge to ``srollout.envs.gen``, ``from srollout.policy import make_policy`` one to the
package ``srollout.policy`` itself (its ``__init__``). The layers and what lives in each are in
docs/architecture.md; a new package or top-level module must be given a layer here.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import NamedTuple

import pytest

ROOT = Path(__file__).resolve().parents[2] / "srollout"

# Lowest first. A module may import its own layer and every layer before it, never one after.
# Keys are a package (every module under it) or a top-level module of srollout.
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    (
        "base",
        (
            "srollout",
            "srollout.errors",
            "srollout.atomic",
            "srollout.home",
            "srollout.schemas",
            "srollout.signal_names",
            "srollout.rundir",
            "srollout.console",
            "srollout.progress",
        ),
    ),
    ("core", ("srollout.core",)),
    ("envs", ("srollout.envs",)),
    ("policy", ("srollout.policy",)),
    ("rollout", ("srollout.rollout",)),
    ("training", ("srollout.training",)),
    ("config", ("srollout.config",)),
    ("default-policy build", ("srollout.default_policy",)),
    ("report", ("srollout.report",)),
    ("stages", ("srollout.stages",)),
    ("integrations / cli", ("srollout.integrations", "srollout.cli")),
]

# Known exceptions: none. A module that must break the layering is listed here, one entry each,
# with the reason.
EXEMPT_MODULES: set[str] = set()
ALLOWED_CYCLES: set[frozenset[str]] = set()


class Import(NamedTuple):
    """One import statement's edge: the importing module, its file (from the tree's parent) and
    line, the imported module."""

    source: str
    path: str
    line: int
    target: str


def module_name(path: Path, root: Path) -> str:
    """``root/core/gate.py`` -> ``<root name>.core.gate``; an ``__init__.py``, its package."""
    parts = [root.name, *path.relative_to(root).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def read_imports(root: Path) -> tuple[set[str], list[Import]]:
    """Every module under ``root`` and every import of a module under ``root``, from the source."""
    files = sorted(root.rglob("*.py"))
    modules = {module_name(f, root) for f in files}
    edges: list[Import] = []
    for f in files:
        source = module_name(f, root)
        package = source if f.name == "__init__.py" else source.rpartition(".")[0]
        for node in ast.walk(ast.parse(f.read_text(), filename=str(f))):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:  # relative: from . import x / from ..core import y
                    up = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*up, base] if base else up)
                subs = [f"{base}.{a.name}" for a in node.names]
                targets = [sub if sub in modules else base for sub in subs]
            else:
                continue
            for target in targets:
                if target == root.name or target.startswith(root.name + "."):
                    edge = Import(
                        source,
                        f.relative_to(root.parent).as_posix(),
                        node.lineno,
                        _known(target, modules),
                    )
                    if edge not in edges[-len(targets) :]:  # one edge per statement and module
                        edges.append(edge)
    return modules, edges


def _known(target: str, modules: set[str]) -> str:
    """``import srollout.a.b.c`` where c is a name, not a module: the longest module prefix."""
    while target not in modules and "." in target:
        target = target.rpartition(".")[0]
    return target


def layer_of(module: str, layers: list[tuple[str, tuple[str, ...]]]) -> int | None:
    """Index of the layer whose key is the module or a package above it (the longest key wins)."""
    best: tuple[int, int] | None = None
    for rank, (_, keys) in enumerate(layers):
        for key in keys:
            inside = module == key or module.startswith(key + ".")
            if inside and (best is None or len(key) > best[1]):
                best = (rank, len(key))
    return None if best is None else best[0]


def layering_errors(
    modules: set[str],
    edges: list[Import],
    layers: list[tuple[str, tuple[str, ...]]],
    exempt: set[str] = frozenset(),
) -> list[str]:
    """One line per module in no layer and per import of a layer above the importer's."""
    errors = [
        f"{m}: in no layer; add it to LAYERS in {Path(__file__).name}"
        for m in sorted(modules)
        if layer_of(m, layers) is None
    ]
    for e in edges:
        if e.source in exempt:
            continue
        src, dst = layer_of(e.source, layers), layer_of(e.target, layers)
        if src is not None and dst is not None and dst > src:
            below = ", ".join(name for name, _ in layers[: src + 1])
            errors.append(
                f"{e.path}:{e.line}: {e.source} imports {e.target}: layer "
                f"'{layers[src][0]}' may import only {below}, not '{layers[dst][0]}'"
            )
    return errors


def import_cycles(edges: list[Import], exempt: set[str] = frozenset()) -> list[list[Import]]:
    """The import cycles, one per strongly connected set of modules, each as the imports that close
    a loop through it (Tarjan's algorithm; an edge from a module to itself is no cycle)."""
    graph: dict[str, dict[str, Import]] = {}
    for e in edges:
        if e.source != e.target and e.source not in exempt:
            graph.setdefault(e.source, {}).setdefault(e.target, e)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[set[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, {}):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.add(w)
                if w == v:
                    break
            if len(component) > 1:
                components.append(component)

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return [_loop(graph, c) for c in components]


def _loop(graph: dict[str, dict[str, Import]], component: set[str]) -> list[Import]:
    """A loop through the component's first module (breadth-first, so the shortest one)."""
    start = min(component)
    came: dict[str, Import] = {}
    frontier = [start]
    while frontier:
        nxt = []
        for v in frontier:
            for w, e in sorted(graph.get(v, {}).items()):
                if w == start:
                    loop = [e]
                    while loop[0].source != start:
                        loop.insert(0, came[loop[0].source])
                    return loop
                if w in component and w not in came:
                    came[w] = e
                    nxt.append(w)
        frontier = nxt
    raise AssertionError(f"no loop through {start}")  # a strongly connected set always has one


def _describe(loop: list[Import]) -> str:
    return " -> ".join(f"{e.source} (line {e.line})" for e in loop) + f" -> {loop[0].source}"


# --- the checks on srollout -----------------------------------------------------------------


def test_every_package_imports_only_the_layers_below_it():
    modules, edges = read_imports(ROOT)
    assert len(modules) > 50 and len(edges) > 300  # the whole tree was read
    errors = layering_errors(modules, edges, LAYERS, EXEMPT_MODULES)
    assert not errors, "imports against the layering (docs/architecture.md):\n" + "\n".join(errors)


def test_no_module_imports_itself_round_a_loop():
    _, edges = read_imports(ROOT)
    cycles = import_cycles(edges, EXEMPT_MODULES)
    unexpected = [c for c in cycles if frozenset(e.source for e in c) not in ALLOWED_CYCLES]
    assert not unexpected, "import cycles (a lower module must not need a higher one):\n" + (
        "\n".join(_describe(c) for c in unexpected)
    )
    stale = ALLOWED_CYCLES - {frozenset(e.source for e in c) for c in cycles}
    assert not stale, f"cycles gone: remove them from ALLOWED_CYCLES: {sorted(map(sorted, stale))}"


def test_exempt_modules_exist():
    modules, _ = read_imports(ROOT)
    gone = sorted(EXEMPT_MODULES - modules)
    assert not gone, f"exempt modules that no longer exist: remove them from EXEMPT_MODULES: {gone}"


# --- the checker itself, on a small tree whose faults are known ------------------------------


@pytest.fixture
def toy(tmp_path: Path) -> Path:
    """pkg/low/a.py imports pkg.high.b inside a function (against the layering); pkg/high/b.py and
    pkg/high/c.py import each other; pkg/low/d.py imports pkg.low.a (allowed, same layer)."""
    files = {
        "__init__.py": "",
        "low/__init__.py": "",
        "low/a.py": "def f():\n    from pkg.high import b\n    return b\n",
        "low/d.py": "from pkg.low.a import f\nfrom . import a\n",
        "high/__init__.py": "",
        "high/b.py": "import os\nfrom pkg.high.c import g, h  # one edge\n",
        "high/c.py": "def g():\n    from ..high import b  # relative, two levels\n    return b\n",
    }
    root = tmp_path / "pkg"
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


TOY_LAYERS = [("base", ("pkg",)), ("low", ("pkg.low",)), ("high", ("pkg.high",))]


def test_checker_reads_imports_inside_functions_and_relative_ones(toy):
    modules, edges = read_imports(toy)
    assert modules == {
        "pkg",
        "pkg.low",
        "pkg.low.a",
        "pkg.low.d",
        "pkg.high",
        "pkg.high.b",
        "pkg.high.c",
    }
    assert sorted((e.source, e.line, e.target) for e in edges) == [
        ("pkg.high.b", 2, "pkg.high.c"),
        ("pkg.high.c", 2, "pkg.high.b"),
        ("pkg.low.a", 2, "pkg.high.b"),
        ("pkg.low.d", 1, "pkg.low.a"),
        ("pkg.low.d", 2, "pkg.low.a"),
    ]


def test_checker_names_the_upward_import_and_the_rule(toy):
    modules, edges = read_imports(toy)
    errors = layering_errors(modules, edges, TOY_LAYERS)
    assert errors == [
        "pkg/low/a.py:2: pkg.low.a imports pkg.high.b: layer 'low' may import only "
        "base, low, not 'high'"
    ]
    assert layering_errors(modules, edges, TOY_LAYERS, {"pkg.low.a"}) == []
    unplaced = layering_errors(modules, edges, [("low", ("pkg.low",))])
    assert unplaced[:2] == [
        "pkg: in no layer; add it to LAYERS in test_layering.py",
        "pkg.high: in no layer; add it to LAYERS in test_layering.py",
    ]


def test_checker_finds_the_cycle_and_closes_its_loop(toy):
    _, edges = read_imports(toy)
    (loop,) = import_cycles(edges)
    assert [(e.source, e.target) for e in loop] == [
        ("pkg.high.b", "pkg.high.c"),
        ("pkg.high.c", "pkg.high.b"),
    ]
    assert _describe(loop) == "pkg.high.b (line 2) -> pkg.high.c (line 2) -> pkg.high.b"
    assert import_cycles(edges, {"pkg.high.c"}) == []


def test_srollout_core_needs_only_numpy_and_levenshtein_as_the_readme_says():
    """README: srollout.core is numpy + Levenshtein, no torch, no polars (but its A/B scoring)."""
    import subprocess
    import sys

    core = sorted(
        p.stem for p in (ROOT / "core").glob("*.py") if p.stem not in ("__init__", "ab_scoring")
    )
    code = (
        "import importlib, sys\n"
        f"for m in {core!r}: importlib.import_module('srollout.core.' + m)\n"
        "heavy = {'torch', 'polars', 'transformers'}\n"
        "print(sorted({k.split('.')[0] for k in sys.modules} & heavy))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


MAX_MODULE_LINES = 700
MAX_PACKAGE_LINES = 30_000  # issue 59's bound: `find srollout -name '*.py' | xargs cat | wc -l`


def test_no_module_is_over_700_lines_and_the_package_stays_within_its_size():
    sizes = {str(p.relative_to(ROOT.parent)): p.read_text().count("\n") for p in ROOT.rglob("*.py")}
    big = {path: n for path, n in sizes.items() if n > MAX_MODULE_LINES}
    assert not big, f"modules over {MAX_MODULE_LINES} lines (split them by concept): {big}"
    total = sum(sizes.values())
    assert 20_000 < total <= MAX_PACKAGE_LINES, (
        f"srollout/ is {total} lines, over {MAX_PACKAGE_LINES}: merge before adding"
    )
