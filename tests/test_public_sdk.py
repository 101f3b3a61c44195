"""The connector SDK's promise: a built-in connector uses only `sluice.connector`'s public names, as a newcomer's
would, and the table store no private module of another package. Read from the sources (every import, also those
inside functions), so the check needs no store and no Spark."""

import ast
import inspect
import re
import types
import typing
from collections.abc import Iterator
from pathlib import Path

import pytest

import sluice
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


# `Any` that stays in a public signature (sluice.__all__, sluice.connector.__all__), each for a reason: the value is
# the store's or the user's own kind, or JSON. A new `Any` there names its type instead, or joins this list with one.
STORE_ENTRY = "an entry is what the store's encoder made, of the store's own kind"
STORE_MESSAGE = "a store's pre-commit message is its own JSON-able value, handed to its Committer"
OPTION_VALUE = "an option's value is of the option's own type (str, int, bool, tuple, PrefixSettings...)"
JSON = "JSON: Spark's offsets, the collector's reports, the write summary"
SPARK_ROWS = "Spark's DataSourceReader.read yields tuples, Rows or Arrow batches: the connector's choice"
ALLOWED_ANY = {
    "Batch.__init__.entries": STORE_ENTRY,
    "BatchRun.__init__.entries": STORE_ENTRY,
    "Encoded.__init__.entries": STORE_ENTRY,
    "RequestBuffer.add.entry": STORE_ENTRY,
    "RequestBuffer.poll.return": STORE_ENTRY,
    "RequestBuffer.peek.return": STORE_ENTRY,
    "DequeRequestBuffer.peek.return": STORE_ENTRY,
    "RequestBuffer.buffered_state.return": STORE_ENTRY,
    "_ChunkBuffer.buffered_state.return": STORE_ENTRY,
    "Store.pre_commit.return": STORE_MESSAGE,
    "Store.refused_rows.entries": STORE_ENTRY,
    "DeadLetterWriter.finish.return": STORE_MESSAGE,
    "Committer.commit.messages": STORE_MESSAGE,
    "Committer.abort.messages": STORE_MESSAGE,
    "Committer.commit_with.messages": STORE_MESSAGE,
    "Committer.commit_with.companion_messages": STORE_MESSAGE,
    "Option.__init__.default": OPTION_VALUE,
    "Option.parse.raw": OPTION_VALUE,
    "Option.parse.return": OPTION_VALUE,
    "OptionSpec.extend.defaults": OPTION_VALUE,
    "OptionSpec.parse.raw": OPTION_VALUE,
    "Options.__init__.values": OPTION_VALUE,
    "Options.typed.extra": OPTION_VALUE,
    "Options.with_values.changes": OPTION_VALUE,
    "PrefixSettings.__init__.values": "a client's settings (kafka.*), of the client's own types",
    "SinkConfig.derived.return": "a TypedOptions dataclass's fields, of their own types",
    "TypedOptions.derived.return": "a TypedOptions dataclass's fields, of their own types",
    "SqlTrackingEnumerator.rows.return": "a SQL store's rows, of its own column types",
    "Split.__init__.info": JSON,
    "SparkOffset.to_json.return": JSON,
    "SparkOffset.json_or.return": JSON,
    "check_offset_version.raw": JSON,
    "TrackingPosition.to_json.return": JSON,
    "TrackingPosition.from_json.raw": JSON,
    "SourceReport.to_json.return": JSON,
    "SourceReport.from_json.data": JSON,
    "AdmissionControlledReader.latest_offset.start": JSON,
    "AdmissionControlledReader.latest_offset.return": JSON,
    "AdmissionControlledReader.latestOffset.start": JSON,
    "AdmissionControlledReader.latestOffset.return": JSON,
    "AdmissionControlledReader.partitions.start": JSON,
    "AdmissionControlledReader.partitions.end": JSON,
    "AdmissionControlledReader.plan_partitions.start": JSON,
    "AdmissionControlledReader.plan_partitions.end": JSON,
    "OpenStreamReaderCore.parse_offset.raw": JSON,
    "OpenStreamReaderCore.spark_end.return": JSON,
    "OpenStreamReaderCore.initialOffset.return": JSON,
    "OpenStreamReaderCore.latest_offset.start": JSON,
    "OpenStreamReaderCore.latest_offset.return": JSON,
    "OpenStreamReaderCore.plan_partitions.start": JSON,
    "OpenStreamReaderCore.plan_partitions.end": JSON,
    "OpenStreamReaderCore.commit.end": JSON,
    "OpenStreamReaderCore.report.fields": "a SourceReport's fields, each of its own type",
    "OpenStreamReaderCore.read_partition.return": SPARK_ROWS,
    "OpenStreamReaderCore.read.return": SPARK_ROWS,
    "SplitStreamReader.parse_offset.raw": JSON,
    "SplitStreamReader.read_partition.return": SPARK_ROWS,
    "TrackingStreamReader.parse_offset.raw": JSON,
    "TrackingStreamReader.read_partition.return": SPARK_ROWS,
    "last_write_summary.return": JSON,
    "SplitReader.read.return": SPARK_ROWS,
    "SplitReader.read_many.return": SPARK_ROWS,
    "SplitBatchReader.read.return": SPARK_ROWS,
    "SplitStreamReader.read.return": SPARK_ROWS,
    "TrackingReader.read.return": SPARK_ROWS,
}
# `Any`, and the bare generics that mean it (`dict` is dict[Any, Any]).
_ANY = re.compile(r"\bAny\b|\b(?:dict|list|tuple|set|frozenset|Sequence|Mapping|Iterable|Iterator|Callable)\b(?!\[)")
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _annotation_text(annotation: object, namespace: dict[str, object], seen: tuple[str, ...] = ()) -> str:
    """The annotation as written, with the module's type aliases it names spelled out (Encoder, Ints...)."""
    if isinstance(annotation, str):
        text = annotation
    elif isinstance(annotation, type):
        text = annotation.__qualname__
    else:
        text = repr(annotation)
    aliases = []
    for name in sorted(set(_NAME.findall(text)) - set(seen)):
        value = namespace.get(name)
        if isinstance(value, str) or typing.get_args(value):  # an alias: "Sequence[int] | ...", Callable[[X], Y]
            aliases.append(_annotation_text(value, namespace, (*seen, name)))
    return " ".join([text, *aliases])


def _public_functions(module: types.ModuleType) -> Iterator[tuple[str, types.FunctionType]]:
    """The functions `module.__all__` exports, and the public methods (and __init__) of the classes it exports,
    with those they inherit from sluice's classes."""
    for name in module.__all__:
        obj = getattr(module, name)
        if inspect.isfunction(obj):
            yield name, obj
        elif isinstance(obj, type):
            for klass in obj.__mro__:
                if klass.__module__.split(".")[0] not in ("sluice", module.__name__):
                    continue
                for attr, value in vars(klass).items():
                    if attr.startswith("_") and attr != "__init__":
                        continue
                    if isinstance(value, staticmethod | classmethod):
                        value = value.__func__
                    elif isinstance(value, property):
                        value = value.fget
                    if inspect.isfunction(value):
                        yield f"{klass.__qualname__}.{attr}", value


def any_in_signatures(*modules: types.ModuleType) -> dict[str, int]:
    """'Class.method.parameter' (or '.return') -> how many `Any` its annotation holds."""
    found = {}
    for module in modules:
        for qualname, function in _public_functions(module):
            for param, annotation in inspect.get_annotations(function).items():
                count = len(_ANY.findall(_annotation_text(annotation, function.__globals__)))
                if count:
                    found[f"{qualname}.{param}"] = count
    return found


def test_public_signatures_name_their_types():
    """Every parameter and return type of the public SDK names its type; `Any` only where ALLOWED_ANY says why."""
    found = any_in_signatures(sluice.connector, sluice)
    unexplained = {key: count for key, count in found.items() if key not in ALLOWED_ANY}
    assert not unexplained, (f"Any in public signatures: {unexplained}. Name the type (pa.RecordBatch, StructType, a "
                             "Protocol...), or add the signature to ALLOWED_ANY with the reason it cannot.")
    assert sum(found.values()) <= len(ALLOWED_ANY)


def test_the_signature_check_sees_an_any_in_a_method_and_through_an_alias():
    """The negative control: an `Any` in a public method's parameter, and one behind a type alias, are found."""
    module = types.ModuleType("demo")
    exec("from __future__ import annotations\n"
         "from typing import Any, Callable\n"
         "Hook = Callable[[int], Any]\n"
         "class Sink:\n"
         "    def submit(self, batch: list[Any], hook: Hook) -> int: ...\n"
         "    def _private(self, x: Any) -> Any: ...\n"
         "def typed(x: int) -> str: ...\n", module.__dict__)
    module.__all__ = ["Sink", "typed"]
    assert any_in_signatures(module) == {"Sink.submit.batch": 1, "Sink.submit.hook": 1}
