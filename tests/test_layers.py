"""sluice's modules import each other without a circle, and its packages too (sluice.metrics below sluice.spark,
never both ways), counting every import: those inside functions and under TYPE_CHECKING as well, since a circle
hidden in a function is still one. The same holds for the checkout's other Python: the benchmarks (bench/), the
build's tools (tools/) and the tests' own helper modules (tests/). Read from the sources; no store, no Spark."""

import ast
from collections import defaultdict
from pathlib import Path

import sluice

SRC = Path(sluice.__file__).resolve().parent
ROOT = Path(__file__).resolve().parents[1]
# Where each top-level package's sources are: sluice's under src/ (or where it is installed), the others in the
# checkout's root.
PACKAGES = {"sluice": SRC, "bench": ROOT / "bench", "tools": ROOT / "tools", "tests": ROOT / "tests"}


def module_names() -> dict[str, Path]:
    names = {}
    for folder in PACKAGES.values():
        for path in folder.rglob("*.py"):
            parts = path.relative_to(folder.parent).with_suffix("").parts
            names[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return names


def import_graph() -> dict[str, set[str]]:
    """module -> the modules of PACKAGES it imports (`from a.b import c` counts as a.b.c when c is a module;
    `from . import c` is read relative to the importing module's package)."""
    modules = module_names()

    def resolve(name: str) -> str:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name

    def ours(name: str) -> bool:
        return name.split(".")[0] in PACKAGES

    graph: dict[str, set[str]] = defaultdict(set)
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[:len(package.split(".")) - (node.level - 1)]
                    base = ".".join([*anchor, *([node.module] if node.module else [])])
                if not ours(base):
                    continue
                targets = [f"{base}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names if ours(a.name)]
            else:
                continue
            graph[name] |= {resolve(t) for t in targets} - {name, ""}
    return graph


def package(module: str) -> str:
    """sluice.connectors.<store> for a connector's modules (tests.connectors.<store> for its tests), else the top
    package and its first part (sluice.spark, bench.soak, tests.soak)."""
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
    # The other packages are read too: a benchmark's imports of its own package, of the tests' helpers, of sluice.
    assert "bench.soak.stores" in graph["bench.soak.__main__"] and "sluice.testing" in graph["bench.soak.__main__"]
    assert "tests.clickhouse_chdb" in graph["bench.faults.stores"]
    assert "bench.soak.bank" in graph["tests.soak.test_store_checks"]
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
