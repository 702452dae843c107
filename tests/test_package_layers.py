"""The import layers of the cudacore package: no cycle, no upward import, no import hidden in a function.

Every module of ``python/cudacore`` is parsed with :mod:`ast` (nothing is imported, so this runs without the
extension). The run-time import graph among the package's own modules is built from every ``import`` and
``from ... import`` statement, at module level or inside functions, leaving out only the bodies of
``if TYPE_CHECKING:`` (those imports exist for annotations alone and may point anywhere). Then:

(a) the graph has no cycle;
(b) every edge goes from a module to one of a lower or equal layer of :data:`LAYERS`;
(c) no function imports a module of the package (a function-local import is how a cycle hides; imports of
    optional third-party libraries inside functions are fine).

The generated ``_gopy`` package and the C module ``_fast`` are the extension, loaded by ``_native``: they
are not modules of this graph.
"""

from __future__ import annotations

import ast
import itertools
from dataclasses import dataclass
from pathlib import Path

PACKAGE = "cudacore"
PKG_DIR = Path(__file__).resolve().parent.parent / "python" / PACKAGE

#: Each module's layer. A module may import (at run time) only modules of its own layer or below.
#: ``__init__`` is the package itself (``import cudacore``, ``from cudacore import Device``).
LAYERS: dict[str, int] = {
    # 0: leaves, importing nothing of the package
    "_results": 0,  # the generated table of CUresult codes
    "_tables": 0,  # the generated tables Go owns: kernel-argument codes, limit names, the held-copy bound
    "_errors": 0,  # the exceptions and the one parser of Go's wire-format errors
    "_display": 0,  # format_bytes, MemoryStats and the HTML reprs of devices and buffers
    "_version": 0,  # __version__
    # 1: the extension and its door
    "_native": 1,  # loads the extension: core (gopy) and fast (the C fast path)
    "_api": 1,  # fork check and error translation around gopy calls
    "_handles": 1,  # stream_handle, each thread's current device and streams, the registry to Device
    # 2: the handles
    "_owner": 2,  # the one owner of memory and descriptors that Python objects hold (below _memory, _ipc)
    "_stream": 2,  # Stream, Event, Graph
    "_copy": 2,  # host <-> device copies (below _memory: Buffer.copy_from/copy_to call it)
    "_memory": 2,  # Buffer, PinnedBuffer, tiles, statistics
    "_external": 2,  # ExternalBuffer: other libraries' device arrays as Buffers
    "_module": 2,  # Module, Kernel
    "_limits": 2,  # Limits
    "_diagnostics": 2,  # the flight recorder, memory_summary, allocation logging, out-of-memory reports
    "_ipc": 2,  # SharedBuffer, ImportedBuffer, IpcHandle: memory shared between processes
    "_accounts": 2,  # the split by library of a pool's use (memory_stats()["by_library"])
    # 3: the device, which composes the handles
    "_device": 3,
    "_capture_tools": 3,  # rehearse, graphed: capture diagnostics over Stream and Graph
    # 4: the tools
    "_doctor": 4,
    "_topology": 4,  # the peer-access matrix and the ways of sharing with other processes (doctor)
    "_verify": 4,  # doctor --verify: the device probes and their report
    "_notebook": 4,
    "testing": 4,
    "pytest_plugin": 4,
    "interop": 4,
    "_broker": 4,  # share_pool: one pool for every library of the process, and their wiring
    "_explain": 4,  # explain_oom: cudacore's verdict, and the pool's split, for any library's out-of-memory error
    "dask": 4,  # the Dask worker plugin, memory_report and Buffer serialization (needs distributed)
    "__main__": 4,
    # 5: the public face, re-exporting everything
    "__init__": 5,
}


@dataclass(frozen=True)
class Import:
    source: str  # the importing module
    target: str  # the imported module of the package
    line: int
    text: str  # the statement, as written
    function: str | None  # the enclosing function, or None at module (or class) level


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


class _Collector(ast.NodeVisitor):
    def __init__(self, module: str, modules: set[str], source: str) -> None:
        self.module = module
        self.modules = modules
        self.source = source
        self.imports: list[Import] = []
        self._scope: list[str] = []
        self._functions = 0

    # -- scopes ----------------------------------------------------------------------------------------

    def _visit_scope(self, node: ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef | ast.Lambda, function: bool) -> None:
        self._scope.append(getattr(node, "name", "<lambda>"))
        self._functions += function
        self.generic_visit(node)
        self._functions -= function
        self._scope.pop()

    def visit_FunctionDef(self, node: ast.FunctionDef) -> None:
        self._visit_scope(node, True)

    def visit_AsyncFunctionDef(self, node: ast.AsyncFunctionDef) -> None:
        self._visit_scope(node, True)

    def visit_Lambda(self, node: ast.Lambda) -> None:
        self._visit_scope(node, True)

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        self._visit_scope(node, False)

    def visit_If(self, node: ast.If) -> None:
        if _is_type_checking(node.test):
            for stmt in node.orelse:  # the else branch runs
                self.visit(stmt)
            return
        self.generic_visit(node)

    # -- imports ---------------------------------------------------------------------------------------

    def _add(self, target: str, node: ast.stmt) -> None:
        if target not in self.modules:
            return  # the extension (_gopy, _fast) or something outside the package
        self.imports.append(
            Import(
                source=self.module,
                target=target,
                line=node.lineno,
                text=ast.get_source_segment(self.source, node) or ast.dump(node),
                function=".".join(self._scope) if self._functions else None,
            )
        )

    def _submodule(self, dotted: str) -> str:
        """The package module a dotted name relative to the package names: "" is the package itself."""
        return dotted.split(".", 1)[0] if dotted else "__init__"

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            if alias.name == PACKAGE:
                self._add("__init__", node)
            elif alias.name.startswith(PACKAGE + "."):
                self._add(self._submodule(alias.name[len(PACKAGE) + 1 :]), node)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if node.level == 0:
            if node.module != PACKAGE and not (node.module or "").startswith(PACKAGE + "."):
                return
            rel = (node.module or "")[len(PACKAGE) + 1 :]
        else:
            assert node.level == 1, f"{self.module}:{node.lineno}: relative import above the package"
            rel = node.module or ""
        if rel:
            self._add(self._submodule(rel), node)
            return
        # `from cudacore import x` / `from . import x`: x is a module of the package, or a name of __init__
        for alias in node.names:
            self._add(alias.name if alias.name in self.modules else "__init__", node)


def package_modules() -> dict[str, Path]:
    return {path.stem: path for path in sorted(PKG_DIR.glob("*.py"))}


def collect_imports() -> list[Import]:
    paths = package_modules()
    found: list[Import] = []
    for name, path in paths.items():
        source = path.read_text()
        collector = _Collector(name, set(paths), source)
        collector.visit(ast.parse(source, filename=str(path)))
        found.extend(collector.imports)
    return found


def _where(imp: Import) -> str:
    inside = f" (inside {imp.function})" if imp.function else ""
    return f"python/{PACKAGE}/{imp.source}.py:{imp.line}{inside}: {imp.text.splitlines()[0]}"


def _components(edges: dict[str, set[str]]) -> list[set[str]]:
    """The strongly connected components of more than one module, or with a self-loop (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[set[str]] = []

    def connect(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.add(w)
                if w == v:
                    break
            if len(comp) > 1 or v in edges.get(v, ()):
                components.append(comp)

    for v in sorted(edges):
        if v not in index:
            connect(v)
    return components


def _shortest_cycle(edges: dict[str, set[str]], comp: set[str], start: str) -> list[str]:
    paths = {start: [start]}
    queue = [start]
    while queue:
        v = queue.pop(0)
        for w in sorted(edges.get(v, ())):
            if w == start:
                return [*paths[v], start]
            if w in comp and w not in paths:
                paths[w] = [*paths[v], w]
                queue.append(w)
    raise AssertionError(f"{start} is in no cycle of {sorted(comp)}")


def find_cycles(edges: dict[str, set[str]]) -> list[tuple[list[str], list[list[str]]]]:
    """Each group of modules that import each other in a cycle (sorted), with the shortest cycle through
    each of its modules (without repeats)."""
    found = []
    for comp in _components(edges):
        cycles: list[list[str]] = []
        seen: set[frozenset[tuple[str, str]]] = set()
        for start in sorted(comp):
            cycle = _shortest_cycle(edges, comp, start)
            key = frozenset(itertools.pairwise(cycle))
            if key not in seen:
                seen.add(key)
                cycles.append(cycle)
        found.append((sorted(comp), cycles))
    return found


def test_every_module_has_a_layer() -> None:
    modules = set(package_modules())
    missing = sorted(modules - set(LAYERS))
    stale = sorted(set(LAYERS) - modules)
    assert not missing, f"modules without a layer (add them to LAYERS in {Path(__file__).name}): {missing}"
    assert not stale, f"LAYERS names modules that do not exist: {stale}"


def test_no_import_cycle() -> None:
    imports = collect_imports()
    edges: dict[str, set[str]] = {}
    for imp in imports:
        edges.setdefault(imp.source, set()).add(imp.target)
    groups = find_cycles(edges)
    if groups:
        lines = []
        for members, cycles in groups:
            lines.append(f"{len(members)} modules in a cycle: {', '.join(members)}")
            for cycle in cycles:
                lines.append("  cycle: " + " -> ".join(cycle))
                for a, b in itertools.pairwise(cycle):
                    first = next(imp for imp in imports if imp.source == a and imp.target == b)
                    lines.append(f"    {a} -> {b}: {_where(first)}")
        raise AssertionError("the package's modules import each other in a cycle:\n" + "\n".join(lines))


def test_imports_go_down_the_layers() -> None:
    upward = [
        f"{imp.source} (layer {LAYERS[imp.source]}) imports {imp.target} (layer {LAYERS[imp.target]}): {_where(imp)}"
        for imp in collect_imports()
        if imp.source in LAYERS and imp.target in LAYERS and LAYERS[imp.target] > LAYERS[imp.source]
    ]
    assert not upward, "imports that go up the layers (see LAYERS):\n" + "\n".join(upward)


def test_no_function_local_import_of_the_package() -> None:
    local = [_where(imp) for imp in collect_imports() if imp.function is not None]
    assert not local, (
        "functions that import a module of the package (import it at the top; if that makes a cycle, "
        "fix the layering):\n" + "\n".join(local)
    )
