"""The rooms' import graph (issue 46): no file-level import cycle in the three packages, type-only
imports counted (they are what a reader follows too), and the worker imported only by what
composes it. Imports inside functions are left out of the cycles (they run late and form no load
cycle) but not out of the layers: a package imports only those below it, anywhere in a file."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("kclpy_spark", "shard_sync", "checkpoint")
WORKER = "kclpy_spark.runtime.worker"
# Those that build and run Workers: the daemon (``kclpy-spark run``) and the demo's scenario.
COMPOSERS = {"kclpy_spark.runtime.daemon", "kclpy_spark.demo.run"}
# The one cycle left: WorkerConfig validates itself with config_checks, whose functions name
# WorkerConfig in their annotations only (a type-only import back).
ALLOWED_CYCLES = [{"kclpy_spark.config", "kclpy_spark.config_checks"}]


def _modules() -> dict[str, Path]:
    found = {}
    for pkg in PACKAGES:
        for path in (ROOT / pkg).rglob("*.py"):
            parts = path.relative_to(ROOT).with_suffix("").parts
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def _imports(
    name: str, path: Path, known: dict[str, Path], *, in_functions: bool = False
) -> set[str]:
    """The modules of ``known`` that ``name`` imports outside functions (and inside them too
    with ``in_functions``)."""
    out: set[str] = set()
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            functions = ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda
            if isinstance(child, functions) and not in_functions:
                continue
            if isinstance(child, ast.Import):
                out.update(a.name for a in child.names if a.name in known)
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:
                    up = package.split(".")[: len(package.split(".")) - child.level + 1]
                    base = ".".join([*up, *([base] if base else [])])
                for alias in child.names:
                    full = f"{base}.{alias.name}"
                    if full in known:
                        out.add(full)
                    elif base in known:
                        out.add(base)
            visit(child)

    visit(ast.parse(path.read_text()))
    out.discard(name)
    return out


def _graph(*, in_functions: bool = False) -> dict[str, set[str]]:
    known = _modules()
    return {
        name: _imports(name, path, known, in_functions=in_functions) for name, path in known.items()
    }


def _cycles(graph: dict[str, set[str]]) -> list[set[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[set[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.add(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(component)
    return found


def test_the_cycle_finder_finds_a_cycle_and_leaves_a_chain() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [{"a", "b", "c"}]
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": set()}) == []


def test_the_graph_sees_type_only_imports() -> None:
    graph = _graph()
    assert "kclpy_spark.moves.lease_worker" in graph["kclpy_spark.moves.taking"]  # TYPE_CHECKING
    assert "kclpy_spark.config" in graph["kclpy_spark.config_checks"]


def test_no_import_cycle_in_the_packages() -> None:
    cycles = [c for c in _cycles(_graph()) if c not in ALLOWED_CYCLES]
    assert not cycles, f"import cycles: {[sorted(c) for c in cycles]}"


def test_only_the_composers_import_the_worker() -> None:
    importers = {name for name, deps in _graph().items() if WORKER in deps}
    assert importers <= COMPOSERS, f"modules that import the Worker: {sorted(importers)}"


def _layer_breaches(graph: dict[str, set[str]]) -> list[str]:
    """Imports of a package above the importer's (PACKAGES lists them from the top down)."""
    rank = {pkg: i for i, pkg in enumerate(PACKAGES)}
    return sorted(
        f"{name} -> {dep}"
        for name, deps in graph.items()
        for dep in deps
        if rank[dep.partition(".")[0]] < rank[name.partition(".")[0]]
    )


def test_the_layer_check_finds_an_import_upwards() -> None:
    graph = {"checkpoint.lease": {"kclpy_spark.config"}, "kclpy_spark.cli": {"checkpoint.lease"}}
    assert _layer_breaches(graph) == ["checkpoint.lease -> kclpy_spark.config"]


def test_each_package_imports_only_the_ones_below_it() -> None:
    graph = _graph(in_functions=True)
    assert "checkpoint.coordination" in graph["kclpy_spark.moves.rules.cpu_load"]
    breaches = _layer_breaches(graph)
    assert not breaches, f"imports of a package above: {breaches}"
