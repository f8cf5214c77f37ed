"""The package's layering, held by a test so it cannot erode quietly (CONVENTIONS.md 18).

Two contracts. No cycle among the package's parts (``runtime``, ``workflows``, ``store``,
``server``, ``events``, ...): each can be read, tested and replaced from the bottom up. And
the runtime, the workflow engine and the views import neither the server, the web framework,
the ORM nor the store: they depend on persistence through the protocols of
``agentstream.runtime.ports``, so they run (and are tested) without a database or HTTP.

Imports are read with ``ast`` rather than a tool such as import-linter: the two contracts
take a few lines each, the second is checked on a real interpreter (what matters is what
gets loaded), and a failure names the import that breaks it.
"""

from __future__ import annotations

import ast
import graphlib
import itertools
import json
import subprocess
import sys
from collections import defaultdict, deque
from collections.abc import Iterator
from pathlib import Path

import pytest

import agentstream

SOURCE = Path(agentstream.__file__).parent

LAYERS = ["agentstream.runtime", "agentstream.workflows", "agentstream.views"]
"""Packages that know nothing of HTTP, the database or Redis (the runtime reaches the other
processes of a cluster through ``runtime.ports.Peers``)."""

FORBIDDEN = [
    "agentstream.server",
    "agentstream.store",
    "agentstream.cluster",
    "fastapi",
    "starlette",
    "sqlalchemy",
    "redis",
]
"""What none of ``LAYERS`` may load, even indirectly."""


def module_name(path: Path) -> str:
    parts = path.relative_to(SOURCE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported(tree: ast.AST) -> Iterator[str]:
    """The absolute modules a module imports, wherever the import is (lazy ones too), except
    under ``if TYPE_CHECKING:``, which is for the type checker only."""
    for node in ast.iter_child_nodes(tree):
        match node:
            case ast.If(test=ast.Name(id="TYPE_CHECKING")):
                yield from (name for child in node.orelse for name in imported(child))
                continue
            case ast.Import(names=names):
                yield from (alias.name for alias in names)
            case ast.ImportFrom(module=str(module), level=0, names=names):
                yield module
                yield from (f"{module}.{alias.name}" for alias in names)
        yield from imported(node)


def import_graph() -> dict[str, set[str]]:
    """Each module of the package and what it imports: the package's modules (importing
    ``a.b.c`` runs ``a`` and ``a.b`` too) and other distributions by top-level name."""
    modules = {module_name(path): path for path in SOURCE.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        targets = graph[name] = set()
        for target in imported(ast.parse(path.read_text(), str(path))):
            parts = target.split(".")
            if parts[0] != SOURCE.name:
                targets.add(parts[0])
                continue
            targets.update(
                prefix
                for i in range(1, len(parts) + 1)
                if (prefix := ".".join(parts[:i])) in modules and prefix != name
            )
    return graph


def part(module: str) -> str | None:
    """The part of the package a module belongs to: ``agentstream.runtime.runs`` is in
    ``runtime``, ``agentstream.events`` is ``events``; the package's own lazy facade is in
    none."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else None


def test_the_parts_of_the_package_import_each_other_without_a_cycle() -> None:
    edges: dict[tuple[str, str], list[str]] = defaultdict(list)
    for source, targets in import_graph().items():
        for target in targets:
            a, b = part(source), part(target)
            if a is not None and b is not None and a != b:
                edges[a, b].append(f"{source} imports {target}")
    parts: dict[str, set[str]] = defaultdict(set)
    for a, b in edges:
        parts[a].add(b)
    try:
        graphlib.TopologicalSorter(parts).prepare()
    except graphlib.CycleError as cycle:
        path = cycle.args[1]  # [a, b, ..., a], each importing the one before it
        evidence = [line for b, a in itertools.pairwise(path) for line in edges[a, b]]
        pytest.fail(f"Import cycle {' -> '.join(reversed(path))}:\n" + "\n".join(evidence))


def chain(graph: dict[str, set[str]], start: str, goal: str) -> list[str] | None:
    """The shortest import chain from ``start`` to ``goal`` or a module of it, for a failure
    message."""
    came_from: dict[str, str | None] = {start: None}
    queue = deque([start])
    while queue:
        module = queue.popleft()
        if module == goal or module.startswith(goal + "."):
            path: list[str] = []
            step: str | None = module
            while step is not None:
                path.append(step)
                step = came_from[step]
            return path[::-1]
        for target in sorted(graph.get(module, ())):
            if target not in came_from:
                came_from[target] = module
                queue.append(target)
    return None


@pytest.mark.parametrize("layer", LAYERS)
def test_the_layer_loads_no_server_framework_orm_or_store(layer: str) -> None:
    """Every module of the layer imported in a fresh interpreter: what it loaded."""
    probe = (
        "import importlib, json, pkgutil, sys\n"
        f"package = importlib.import_module({layer!r})\n"
        "for each in pkgutil.walk_packages(package.__path__, package.__name__ + '.'):\n"
        "    importlib.import_module(each.name)\n"
        f"forbidden = {FORBIDDEN!r}\n"
        "print(json.dumps(sorted({f for f in forbidden for m in sys.modules "
        "if m == f or m.startswith(f + '.')})))\n"
    )
    run = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    loaded: list[str] = json.loads(run.stdout)
    graph = import_graph()
    how = sorted(
        (
            " -> ".join(found)
            for goal in loaded
            for start in sorted(graph)
            if start.startswith(layer) and (found := chain(graph, start, goal))
        ),
        key=len,
    )
    assert loaded == [], f"{layer} loads {loaded}:\n" + "\n".join(how[:5])
