"""sluice's modules import each other without a circle, and its packages too (sluice.metrics below sluice.spark,
never both ways), counting every import: those inside functions and under TYPE_CHECKING as well, since a circle
hidden in a function is still one. Read from the sources; no store, no Spark."""

import ast
from collections import defaultdict
from pathlib import Path

import sluice

SRC = Path(sluice.__file__).resolve().parent


def module_names() -> dict[str, Path]:
    names = {}
    for path in SRC.rglob("*.py"):
        parts = path.relative_to(SRC.parent).with_suffix("").parts
        names[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return names


def import_graph() -> dict[str, set[str]]:
    """module -> the sluice modules it imports (`from a.b import c` counts as a.b.c when c is a module)."""
    modules = module_names()

    def resolve(name: str) -> str:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name

    graph: dict[str, set[str]] = defaultdict(set)
    for name, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("sluice"):
                targets = [f"{node.module}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names if a.name.startswith("sluice")]
            else:
                continue
            graph[name] |= {resolve(t) for t in targets} - {name, ""}
    return graph


def package(module: str) -> str:
    """sluice.connectors.<store> for a connector's modules, else sluice.<first part>."""
    parts = module.split(".")
    return ".".join(parts[:3] if len(parts) > 2 and parts[1] == "connectors" else parts[:2])


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one node (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in list(graph):
        if v not in index:
            visit(v)
    return found


def test_no_module_imports_itself_round_a_circle():
    graph = import_graph()
    assert len(graph) > 100 and "sluice.sink._datasource" in graph["sluice.connector"]
    assert not circles(graph), f"import circles: {circles(graph)}"


def test_no_package_imports_another_that_imports_it_back():
    packages: dict[str, set[str]] = defaultdict(set)
    for module, targets in import_graph().items():
        packages[package(module)] |= {package(t) for t in targets} - {package(module)}
    assert not circles(packages), f"package circles: {circles(packages)}"


def test_a_circle_is_found():
    """The negative control: the check sees a circle of two and one of three, and none in a line."""
    assert circles({"a": {"b"}, "b": {"a"}}) == [["a", "b"]]
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert circles({"a": {"b"}, "b": {"c"}, "c": set()}) == []
