"""The layers import in one direction, and no module of rofu imports itself round a circle."""

from __future__ import annotations

import ast
from pathlib import Path

import rofu

ROOT = Path(rofu.__file__).parent
#: layer -> the layers it must never import
FORBIDDEN = {
    "rofu.models": ("rofu.service", "rofu.replay", "rofu.bench", "rofu.evaluation", "rofu.client"),
    "rofu.service": ("rofu.replay", "rofu.bench", "rofu.evaluation"),
    "rofu.replay": ("rofu.service", "rofu.bench", "rofu.evaluation"),
    "rofu.client": ("rofu.models", "rofu.service", "rofu.replay", "rofu.bench", "rofu.evaluation"),
}


def _module(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module(path): path for path in ROOT.rglob("*.py")}


def _imports(path: Path) -> set[str]:
    """Every rofu module `path` imports, at any depth of its code (lazy imports included)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                sub = f"{node.module}.{alias.name}"
                names.add(sub if sub in MODULES else node.module)
    return {name for name in names if name in MODULES}


GRAPH = {name: _imports(path) for name, path in MODULES.items()}


def _within(name: str, layer: str) -> bool:
    return name == layer or name.startswith(layer + ".")


def test_layering_no_layer_imports_one_above_it():
    offenders = sorted(
        f"{name} imports {target}"
        for layer, above in FORBIDDEN.items()
        for name, targets in GRAPH.items()
        if _within(name, layer)
        for target in targets
        if any(_within(target, other) for other in above)
    )
    assert not offenders, offenders


def _cycle_from(start: str) -> list[str] | None:
    path: list[str] = []
    on_path: set[str] = set()
    done: set[str] = set()

    def visit(node: str) -> list[str] | None:
        path.append(node)
        on_path.add(node)
        for target in sorted(GRAPH[node]):
            if target == node or _within(node, target):
                continue  # a module importing its own package's names is no circle of modules
            if target in on_path:
                return [*path[path.index(target) :], target]
            if target not in done and (found := visit(target)):
                return found
        path.pop()
        on_path.discard(node)
        done.add(node)
        return None

    return visit(start)


def test_layering_no_import_circle():
    circles = [cycle for name in sorted(GRAPH) if (cycle := _cycle_from(name))]
    assert not circles, " -> ".join(circles[0])


def test_layering_the_graph_is_read():
    # The checks above pass vacuously on an empty graph; make sure they see real edges.
    assert "rofu.models.rofu" in GRAPH["rofu.models"]
    assert any(_within(target, "rofu.models") for target in GRAPH["rofu.service.deciding.scoring"])
