"""The connector SDK's promise: a built-in connector uses only `sluice.connector`'s public names, as a newcomer's
would, and the table store no private module of another package. Read from the sources (every import, also those
inside functions), so the check needs no store and no Spark."""

import ast
from pathlib import Path

import pytest

import sluice.connector

SRC = Path(sluice.connector.__file__).resolve().parent
CONNECTORS = sorted((SRC / "connectors").rglob("*.py"))
TABLESTORE = sorted((SRC / "tablestore").rglob("*.py"))


def imports(path: Path) -> list[tuple[int, str, tuple[str, ...]]]:
    """(line, module, names) of every sluice import in `path`; `import sluice.x` gives names ()."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").split(".")[0] == "sluice":
            found.append((node.lineno, node.module, tuple(a.name for a in node.names)))
        elif isinstance(node, ast.Import):
            found += [(node.lineno, a.name, ()) for a in node.names if a.name.split(".")[0] == "sluice"]
    return found


def own_package(path: Path) -> str:
    """sluice.connectors.<store> for a connector's module, sluice.tablestore for the table store's."""
    parts = path.relative_to(SRC.parent).with_suffix("").parts
    return ".".join(parts[:3] if parts[1] == "connectors" else parts[:2])


def is_private(module: str) -> bool:
    return any(part.startswith("_") for part in module.split("."))


def private_imports(path: Path) -> list[str]:
    own = own_package(path)
    problems = []
    for line, module, names in imports(path):
        if module == own or module.startswith(own + "."):
            continue
        private = [n for n in names if n.startswith("_")] if not is_private(module) else list(names) or [module]
        if is_private(module) or private:
            problems.append(f"{path.relative_to(SRC.parent)}:{line}: from {module} import {', '.join(private)}")
    return problems


def test_the_sources_are_found():
    assert len(CONNECTORS) > 50 and len(TABLESTORE) > 10


@pytest.mark.parametrize("path", CONNECTORS, ids=lambda p: str(p.relative_to(SRC)))
def test_a_connector_imports_only_sluice_connector_and_its_own_package(path):
    public = set(sluice.connector.__all__)
    wrong = []
    for line, module, names in imports(path):
        own = own_package(path)
        if module == own or module.startswith(own + "."):
            continue
        if module == "sluice.connector":
            wrong += [f"{line}: {n} is not in sluice.connector.__all__" for n in names if n not in public]
        elif names:  # `import sluice` in a docstring's example is text, not an import: ast never sees it
            wrong.append(f"{line}: from {module} import {', '.join(names)}")
        else:
            wrong.append(f"{line}: import {module}")
    assert not wrong, (f"{path.relative_to(SRC)} reaches past the public SDK: {wrong}. Import it from "
                       "sluice.connector (add it there, to __all__ and docs/connectors.md, if a connector needs it).")


@pytest.mark.parametrize("path", TABLESTORE, ids=lambda p: str(p.relative_to(SRC)))
def test_the_table_store_imports_no_private_module_of_another_package(path):
    wrong = private_imports(path)
    assert not wrong, f"private imports outside sluice.tablestore: {wrong}. Use sluice.connector or a public package."


def test_the_check_sees_a_private_import_inside_a_function(tmp_path):
    """The negative control: the same check on a connector module that imports privately, lazily as the built-ins
    used to, fails."""
    store = tmp_path / "sluice" / "connectors" / "demo"
    store.mkdir(parents=True)
    module = store / "_datasource.py"
    module.write_text("from sluice.connector import SinkDataSource\n"
                      "from sluice.connectors.demo._sink import Plan\n\n"
                      "def schema():\n    from sluice.spark._compat import to_arrow_schema\n")
    found = [(line, mod) for line, mod, _ in imports(module)]
    assert found == [(1, "sluice.connector"), (2, "sluice.connectors.demo._sink"), (5, "sluice.spark._compat")]
    assert is_private("sluice.spark._compat") and not is_private("sluice.connector")
