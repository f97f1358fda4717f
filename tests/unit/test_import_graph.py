"""Issue 41: the package's import graph has no cycle, lazy imports included.

Every ``import`` and ``from ... import`` statement of every module under ``kerasdist/`` is an
edge, wherever it stands (module level, or inside a function: a lazy import is still a
dependency, and a circle through one is what issue 41 found in ``data/``); only the imports under
``if TYPE_CHECKING:`` are left out (they never run). ``from a.b import c`` is an edge to the
module ``a.b.c`` when that is a module, else to ``a.b``. Edges to a package's ``__init__`` are
not added implicitly for its sub-modules (as import-linter counts them)."""

from __future__ import annotations

import ast
from pathlib import Path

import kerasdist

ROOT = Path(kerasdist.__file__).parent
PACKAGE = "kerasdist"


def _modules() -> dict[str, Path]:
    found = {}
    for path in ROOT.rglob("*.py"):
        parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


def _type_checking_lines(tree) -> set[int]:
    lines = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for child in node.body:
                for sub in ast.walk(child):
                    if hasattr(sub, "lineno"):
                        lines.add(sub.lineno)
    return lines


def import_graph() -> dict[str, set[str]]:
    """``{module: modules it imports}`` within the package, lazy imports included."""
    modules = _modules()
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        skipped = _type_checking_lines(tree)
        is_package = path.name == "__init__.py"
        for node in ast.walk(tree):
            if getattr(node, "lineno", None) in skipped:
                continue
            for target in _targets(node, name, is_package, modules):
                while target and target not in modules and "." in target:
                    target = target.rsplit(".", 1)[0]  # 'pkg.mod.attr' -> 'pkg.mod'
                if target in modules and target != name:
                    graph[name].add(target)
    return graph


def _targets(node, name: str, is_package: bool, modules) -> list[str]:
    """The modules an import statement names (``from a.b import c``: ``a.b.c`` when a module)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if not isinstance(node, ast.ImportFrom):
        return []
    base = node.module or ""
    if node.level:
        anchor = name.split(".") if is_package else name.split(".")[:-1]
        anchor = anchor[:len(anchor) - node.level + 1]
        base = ".".join(anchor + ([base] if base else []))
    return [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:  # noqa: C901
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []
    counter = [0]

    def visit(node):  # noqa: C901 - Tarjan's algorithm, as written in the textbooks
        index[node] = low[node] = counter[0]
        counter[0] += 1
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    import sys

    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 10_000))
    try:
        for node in sorted(graph):
            if node not in index:
                visit(node)
    finally:
        sys.setrecursionlimit(limit)
    return found


def test_the_walker_sees_lazy_imports_and_finds_a_circle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(graph) == [["a", "b", "c"]]
    real = import_graph()
    # a function-level import is an edge: launch/run.py imports the data entry point lazily
    assert "kerasdist.data.inputs" in real["kerasdist.launch.run"]


def test_the_package_has_no_import_cycle():
    found = cycles(import_graph())
    assert not found, "import cycles (lazy imports included): " + "; ".join(
        " <-> ".join(c) for c in found)


def test_no_data_source_string_is_compared_outside_the_registry():
    """``data.source`` is compared with a kind's name nowhere but in the registry of kinds
    (:mod:`kerasdist.data.sources`) and the traits table (:mod:`kerasdist.config.data_configs`)."""
    import re

    kinds = ("embedded", "tfds", "idx", "npz", "tfrecord", "synthetic_linear", "synthetic_clicks",
             "csv", "image_folder", "python")
    words = "|".join(kinds)
    pattern = re.compile(rf"source\s*(==|!=|\bin\b|\bnot in\b)\s*[\(\[{{]?\s*[\"']({words})[\"']")
    bad = []
    for name, path in _modules().items():
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
            if pattern.search(line):
                bad.append(f"{name}:{number}: {line.strip()}")
    assert not bad, "\n".join(bad)
