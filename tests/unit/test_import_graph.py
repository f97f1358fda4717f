"""The package's import graph: no cycle, and no import from a lower layer up to a higher one,
lazy imports included.

Every ``import`` and ``from ... import`` statement of every module under ``kerasdist/`` is an
edge, wherever it stands (module level, or inside a function: a lazy import is still a
dependency); only the imports under ``if TYPE_CHECKING:`` are left out (they never run).
``from a.b import c`` is an edge to the module ``a.b.c`` when that is a module, else to ``a.b``.
Edges to a package's ``__init__`` are not added implicitly for its sub-modules (as import-linter
counts them). The layers are :data:`LAYERS`, written down here once."""

from __future__ import annotations

import ast
import functools
from pathlib import Path

import kerasdist

ROOT = Path(kerasdist.__file__).parent
PACKAGE = "kerasdist"

LAYERS: list[set[str]] = [
    # commands: the CLI and what only it calls
    {"kerasdist.__main__", "kerasdist.cli", "kerasdist.cli_bench", "kerasdist.cli_ops",
     "kerasdist.cli_export", "kerasdist.cli_init", "kerasdist.environment"},
    # tools built on whole runs
    {"kerasdist.bench", "kerasdist.conformance", "kerasdist.sweep", "kerasdist.testing"},
    # the Python face: kerasdist.fit, enable
    {"kerasdist"},
    # where a run starts: cluster kinds, launchers, supervisor, forking
    {"kerasdist.launch"},
    # THE run lifecycle and the run directory
    {"kerasdist.training"},
    # one object per strategy kind, and its training loop
    {"kerasdist.strategies"},
    # what a run is made of: cluster specs and exports, input, experiment tracking
    {"kerasdist.cluster", "kerasdist.data", "kerasdist.tracking"},
    # Keras-level pieces usable without recipes
    {"kerasdist.keras"},
    # recipe configuration; the mends of Keras and TF internals
    {"kerasdist.config", "kerasdist._compat"},
    {"kerasdist.models"},
    # the process's basics
    {"kerasdist.errors", "kerasdist.importpath", "kerasdist._exit", "kerasdist._files",
     "kerasdist._log", "kerasdist._native_log", "kerasdist._parent_death", "kerasdist._preload",
     "kerasdist._registry", "kerasdist._scratch", "kerasdist._signals", "kerasdist._task_logs",
     "kerasdist._timeline", "kerasdist._version"},
]
"""The package's layers, top to bottom, each a set of module prefixes (a prefix names a module
and, but for the package itself, everything under it; the longest prefix places a module). A
module imports only modules of its own layer or of the layers below it."""


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


@functools.cache
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


def _prefix(module: str) -> str | None:
    """The longest prefix of :data:`LAYERS` that places ``module``."""
    found = [prefix for layer in LAYERS for prefix in layer
             if module == prefix or (prefix != PACKAGE and module.startswith(prefix + "."))]
    return max(found, key=len) if found else None


def _layer(module: str) -> int:
    prefix = _prefix(module)
    return next(i for i, layer in enumerate(LAYERS) if prefix in layer)


def back_arrows(graph: dict[str, set[str]]) -> list[str]:
    """``'a -> b'`` for each import of a module ``b`` of a higher layer than ``a``'s."""
    return [f"{a} -> {b}" for a in sorted(graph) for b in sorted(graph[a]) if _layer(b) < _layer(a)]


def test_every_module_has_a_layer():
    assert not [m for m in _modules() if _prefix(m) is None], "add them to LAYERS"
    assert sum(len(layer) for layer in LAYERS) == len(set().union(*LAYERS)), "a prefix twice"


def test_no_module_imports_a_module_of_a_higher_layer():
    assert back_arrows({"kerasdist.keras.x": {"kerasdist.launch.y"}}) == [
        "kerasdist.keras.x -> kerasdist.launch.y"]
    found = back_arrows(import_graph())
    assert not found, "imports from a lower layer up (lazy ones included):\n" + "\n".join(found)


def test_no_two_parts_of_the_layers_import_each_other():
    """Collapsed to the prefixes of :data:`LAYERS` (``kerasdist.data``, ``kerasdist.cluster``,
    ...), the graph has no cycle either: no two folders of one layer import each other."""
    graph: dict[str, set[str]] = {}
    for a, targets in import_graph().items():
        graph.setdefault(_prefix(a), set()).update(_prefix(b) for b in targets)
    for prefix, targets in graph.items():
        targets.discard(prefix)
    found = cycles(graph)
    assert not found, "; ".join(" <-> ".join(c) for c in found)


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
