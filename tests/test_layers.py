"""The package's import graph: no circles, and no arrow from a lower layer up to a higher one.

Every import in ``simgpu/`` is read from the source (module level and inside functions; those under
``if TYPE_CHECKING:`` are left out: they never run). An edge goes from a module to the most specific
``simgpu`` module it names (``from .a import b`` is an edge to ``a.b`` where that is a module, else
to ``a``). A failure prints the offending edges with their lines.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "simgpu"

#: The layers, top to bottom: a module may import its own layer and those below it. A name is a
#: module or a package (every module inside it); the longest name that matches a module places it,
#: and every ``__main__`` module (a ``python -m`` command) is an entry point.
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("entry points", ("simgpu", "simgpu.api", "simgpu.run", "simgpu.replay", "simgpu.speed", "simgpu.speed_cases",
                      "simgpu.fit", "simgpu.bench", "simgpu.validate", "simgpu.comm.calibrate", "simgpu.reference")),
    ("studies", ("simgpu.whatif", "simgpu.search", "simgpu.stages", "simgpu.goodput", "simgpu.cluster",
                 "simgpu.uncertainty")),
    ("serving", ("simgpu.serve",)),
    ("pipeline", ("simgpu.sim", "simgpu.trace", "simgpu.collective_run")),
    ("reports", ("simgpu.report",)),
    ("engine", ("simgpu.engine",)),
    ("builders", ("simgpu.workload",)),
    ("kernel models", ("simgpu.kernels",)),
    ("collectives", ("simgpu.comm",)),
    ("topology", ("simgpu.platform",)),
    ("config", ("simgpu.config",)),
    ("shared", ("simgpu.graph", "simgpu.result", "simgpu.variant", "simgpu.errors", "simgpu.precision",
                "simgpu.elementwise", "simgpu.version", "simgpu.cli")),
)

#: Circles allowed: none.
KNOWN: tuple[frozenset[str], ...] = ()


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _type_checking(node: ast.If) -> bool:
    t = node.test
    return (isinstance(t, ast.Name) and t.id == "TYPE_CHECKING") or (
        isinstance(t, ast.Attribute) and t.attr == "TYPE_CHECKING")


def _imports(tree: ast.AST) -> Iterator[ast.Import | ast.ImportFrom]:
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.If) and _type_checking(node):
            for other in node.orelse:
                yield from _imports(ast.Module(body=[other], type_ignores=[]))
            continue
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node
        yield from _imports(node)


def _known(name: str) -> str | None:
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def edges() -> list[tuple[str, str, int]]:
    """(importer, imported, line) for every import of one simgpu module by another."""
    out = []
    for name, path in MODULES.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in _imports(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                base = node.module or ""
                if node.level:
                    up = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(up + ([node.module] if node.module else []))
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base for a in node.names]
            for t in targets:
                target = _known(t) if t.startswith("simgpu") else None
                if target is not None and target != name:
                    out.append((name, target, node.lineno))
    return sorted(set(out))


def circles(graph: dict[str, set[str]]) -> list[frozenset[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[frozenset[str]] = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            v, children = work[-1]
            for w in children:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                    break
                if w in on_stack:
                    low[v] = min(low[v], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    comp = set()
                    while True:
                        w = stack.pop()
                        on_stack.discard(w)
                        comp.add(w)
                        if w == v:
                            break
                    if len(comp) > 1:
                        found.append(frozenset(comp))
    return found


def layer_of(module: str) -> int:
    """The layer's position from the top (0: entry points)."""
    if module.rpartition(".")[2] == "__main__":
        return 0
    best, where = "", None
    for i, (_, names) in enumerate(LAYERS):
        for n in names:
            if (module == n or module.startswith(n + ".")) and len(n) > len(best):
                best, where = n, i
    assert where is not None, f"{module} is in no layer; add it to LAYERS"
    return where


def test_no_import_circles() -> None:
    graph: dict[str, set[str]] = {m: set() for m in MODULES}
    found = edges()
    for a, b, _ in found:
        graph[a].add(b)
    bad = [c for c in circles(graph) if c not in KNOWN]
    lines = [f"  {a}:{line} -> {b}" for c in bad for a, b, line in found if a in c and b in c]
    assert not bad, "import circles:\n" + "\n".join(lines)


def test_no_import_reaches_up_a_layer() -> None:
    up = [(a, b, line) for a, b, line in edges() if layer_of(b) < layer_of(a)]
    lines = [f"  {a}:{line} ({LAYERS[layer_of(a)][0]}) -> {b} ({LAYERS[layer_of(b)][0]})" for a, b, line in up]
    assert not up, "imports from a lower layer up to a higher one:\n" + "\n".join(lines)


def test_every_module_has_a_layer() -> None:
    for module in MODULES:
        layer_of(module)


def test_the_scan_sees_imports_inside_functions() -> None:
    found = {(a, b) for a, b, _ in edges()}
    assert ("simgpu.kernels.registry", "simgpu.kernels.analytical") in found  # a function-level import
    assert ("simgpu.run", "simgpu.sim") in found
