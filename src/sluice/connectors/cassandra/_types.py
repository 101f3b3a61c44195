"""CQL types and Spark's: the Spark type a CQL column reads as, the Spark types a CQL column accepts on write, and
the conversion of a whole Arrow column into the Python values the driver binds.

The mapping follows the Spark Cassandra Connector where it has one (varint as decimal(38,0), decimal as
decimal(38,18), time as long nanoseconds, uuid/timeuuid/inet as strings, tuples as structs `_1`, `_2`, ...), so
schemas carry over. Counters (written only by `UPDATE ... SET c = c + ?`) and durations (no Spark type) are
refused on write, naming the column.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from pyspark.sql import types as T

from sluice.connector import OptionError

SCALARS: dict[str, T.DataType] = {
    "ascii": T.StringType(), "text": T.StringType(), "varchar": T.StringType(),
    "tinyint": T.ByteType(), "smallint": T.ShortType(), "int": T.IntegerType(), "bigint": T.LongType(),
    "counter": T.LongType(), "varint": T.DecimalType(38, 0), "decimal": T.DecimalType(38, 18),
    "float": T.FloatType(), "double": T.DoubleType(), "boolean": T.BooleanType(), "blob": T.BinaryType(),
    "timestamp": T.TimestampType(), "date": T.DateType(), "time": T.LongType(),
    "uuid": T.StringType(), "timeuuid": T.StringType(), "inet": T.StringType(),
}
_INTEGER_RANK = {"ByteType": 1, "ShortType": 2, "IntegerType": 3, "LongType": 4}
_CQL_INTEGER_RANK = {"tinyint": 1, "smallint": 2, "int": 3, "bigint": 4, "varint": 5}
NOT_WRITABLE = {
    "counter": "counter columns change only by increments (UPDATE ... SET c = c + n), which sluice does not write",
    "duration": "duration has no Spark type",
}


@dataclass(frozen=True)
class CQLType:
    """A parsed CQL type: `name` (lower case; a user type's own name), its `args`, and a user type's fields."""

    name: str
    args: tuple[CQLType, ...] = ()
    fields: tuple[tuple[str, CQLType], ...] = ()  # user-defined types only
    frozen: bool = False

    def __str__(self) -> str:
        inner = f"<{', '.join(map(str, self.args))}>" if self.args and self.name != "vector" else ""
        if self.name == "vector":
            inner = f"<{self.args[0]}, {self.fields[0][0]}>"
        text = f"{self.name}{inner}"
        return f"frozen<{text}>" if self.frozen else text


def _split_args(text: str) -> list[str]:
    out, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch == "<":
            depth += 1
        elif ch == ">":
            depth -= 1
        elif ch == "," and depth == 0:
            out.append(text[start:i].strip())
            start = i + 1
    out.append(text[start:].strip())
    return [a for a in out if a]


def parse(text: str, user_types: Callable[[str], list[tuple[str, str]] | None]) -> CQLType:
    """A CQL type as the driver's metadata spells it ('frozen<map<text, list<int>>>', 'address', ...);
    `user_types(name)` gives a user type's (field, type) pairs, or None when `name` is none."""
    text = text.strip()
    name, _, rest = text.partition("<")
    name = name.strip().strip('"')
    args = _split_args(rest[:-1]) if rest else []
    if name.lower() == "frozen":
        return CQLType(**{**parse(args[0], user_types).__dict__, "frozen": True})
    if name.lower() == "vector":
        element = parse(args[0], user_types)
        return CQLType("vector", (element,), ((args[1], element),))
    if name.lower() in ("list", "set", "map", "tuple"):
        return CQLType(name.lower(), tuple(parse(a, user_types) for a in args))
    if name.lower() in SCALARS or name.lower() == "duration":
        return CQLType(name.lower())
    fields = user_types(name)
    if fields is None:
        return CQLType(name.lower())  # unknown: refused by spark_type / write_problem, naming it
    return CQLType(name, fields=tuple((f, parse(t, user_types)) for f, t in fields))


def spark_type(kind: CQLType, column: str) -> T.DataType:
    """The Spark type a column of `kind` reads as."""
    if kind.name in SCALARS:
        return SCALARS[kind.name]
    if kind.name in ("list", "set", "vector"):
        return T.ArrayType(spark_type(kind.args[0], column), containsNull=kind.name != "vector")
    if kind.name == "map":
        return T.MapType(spark_type(kind.args[0], column), spark_type(kind.args[1], column), True)
    if kind.name == "tuple":
        return T.StructType([T.StructField(f"_{i + 1}", spark_type(a, column)) for i, a in enumerate(kind.args)])
    if kind.fields:
        return T.StructType([T.StructField(f, spark_type(t, column)) for f, t in kind.fields])
    raise OptionError(f"column '{column}' has CQL type {kind}, which sluice does not read; leave it out with "
                      ".select() on a read, or ask for its support.")


def write_problem(kind: CQLType, given: T.DataType, where: str) -> str | None:
    """Why a Spark column of type `given` cannot be written into a CQL column of `kind` (None if it can)."""
    if kind.name in NOT_WRITABLE:
        return f"{where} is CQL {kind.name}: {NOT_WRITABLE[kind.name]}. Leave it out of the DataFrame"
    spark = type(given).__name__
    ok = False
    if kind.name in _CQL_INTEGER_RANK:
        rank = _INTEGER_RANK.get(spark)
        ok = rank is not None and rank <= _CQL_INTEGER_RANK[kind.name]
        if kind.name == "varint" and isinstance(given, T.DecimalType):
            ok = given.scale == 0
    elif kind.name in ("ascii", "text", "varchar", "uuid", "timeuuid", "inet"):
        ok = isinstance(given, T.StringType)
    elif kind.name in ("float", "double"):
        ok = isinstance(given, T.FloatType) or (kind.name == "double" and isinstance(given, T.DoubleType))
    elif kind.name == "decimal":
        ok = isinstance(given, T.DecimalType) or spark in _INTEGER_RANK
    elif kind.name == "time":
        ok = isinstance(given, T.LongType)
    elif kind.name in SCALARS:
        ok = type(SCALARS[kind.name]) is type(given)
    elif kind.name in ("list", "set", "vector") and isinstance(given, T.ArrayType):
        return write_problem(kind.args[0], given.elementType, f"{where}'s elements")
    elif kind.name == "map" and isinstance(given, T.MapType):
        return (write_problem(kind.args[0], given.keyType, f"{where}'s keys")
                or write_problem(kind.args[1], given.valueType, f"{where}'s values"))
    elif kind.name == "tuple" and isinstance(given, T.StructType):
        if len(given.fields) != len(kind.args):
            return f"{where} is CQL {kind} ({len(kind.args)} parts) but the DataFrame's struct has {len(given.fields)}"
        for i, (part, field) in enumerate(zip(kind.args, given.fields, strict=True)):
            problem = write_problem(part, field.dataType, f"{where}'s part {i + 1}")
            if problem:
                return problem
        return None
    elif kind.fields and isinstance(given, T.StructType):
        known = dict(kind.fields)
        for field in given.fields:
            if field.name not in known:
                return (f"{where}'s field '{field.name}' is not a field of user type {kind.name} "
                        f"(fields: {list(known)})")
            problem = write_problem(known[field.name], field.dataType, f"{where}'s field '{field.name}'")
            if problem:
                return problem
        return None
    if ok:
        return None
    hint = {"timestamp": " (a TIMESTAMP_NTZ column: convert it with to_utc_timestamp)",
            "uuid": " (UUIDs travel as strings)", "time": " (nanoseconds since midnight, as a long)"}
    return f"{where} is CQL {kind} and cannot take Spark {given.simpleString()}{hint.get(kind.name, '')}"


def _in_collections(kind: CQLType, leaf: Callable[[CQLType], Callable[[Any], Any] | None], *, reading: bool
                    ) -> Callable[[Any], Any] | None:
    """`leaf(kind)` applied inside lists, sets, maps, tuples and user types; None = every value as it is.

    Reading, a map becomes Arrow's (key, value) pairs and a tuple or user type a struct dict; writing, the reverse:
    a dict, and a sequence in field order (the driver binds a user type from one)."""
    if kind.name in ("list", "set", "vector"):
        inner = _in_collections(kind.args[0], leaf, reading=reading)
        if inner is None:
            return list if reading else None
        return lambda v: [None if x is None else inner(x) for x in v]
    if kind.name == "map":
        k = _in_collections(kind.args[0], leaf, reading=reading) or (lambda x: x)
        v = _in_collections(kind.args[1], leaf, reading=reading) or (lambda x: x)
        if reading:
            return lambda m: [(k(a), None if b is None else v(b)) for a, b in m.items()]
        return lambda pairs: {k(a): None if b is None else v(b) for a, b in pairs}
    if kind.name == "tuple" or kind.fields:
        names = [f"_{i + 1}" for i in range(len(kind.args))] if kind.name == "tuple" else [n for n, _ in kind.fields]
        parts = [_in_collections(t, leaf, reading=reading)
                 for t in (kind.args if kind.name == "tuple" else [t for _, t in kind.fields])]
        if reading:  # the driver reads both as tuples in field order (user type fields possibly renamed)
            return lambda t: {n: None if x is None else (f(x) if f else x)
                              for n, f, x in zip(names, parts, tuple(t), strict=True)}
        if kind.name == "tuple":
            return lambda d: tuple(None if x is None else (f(x) if f else x)
                                   for x, f in zip(d.values(), parts, strict=True))
        return lambda d: tuple(None if d.get(n) is None else (f(d[n]) if f else d[n])
                               for n, f in zip(names, parts, strict=True))
    return leaf(kind)


def _write_leaf(kind: CQLType) -> Callable[[Any], Any] | None:
    return {"uuid": uuid.UUID, "timeuuid": uuid.UUID, "varint": int}.get(kind.name)


def _converter(kind: CQLType) -> Callable[[Any], Any] | None:
    """What one Python value (as pyarrow's to_pylist gives it) must become for the driver; None = as it is."""
    return _in_collections(kind, _write_leaf, reading=False)


def scalar_converter(kind: CQLType) -> Callable[[Any], Any]:
    """One Spark value (e.g. a pushed filter's) as the driver binds it to a `kind` column."""
    return _converter(kind) or (lambda v: v)


def python_values(column: pa.Array, kind: CQLType) -> list[Any]:
    """A whole Arrow column as the Python values the driver binds to a `kind` column (None stays None)."""
    values = column.to_pylist()
    convert = _converter(kind)
    if convert is None:
        return values
    return [None if v is None else convert(v) for v in values]


def _read_leaf(kind: CQLType) -> Callable[[Any], Any] | None:
    from decimal import Context, Decimal

    if kind.name in ("uuid", "timeuuid", "inet"):
        return str
    if kind.name == "varint":
        return Decimal
    if kind.name == "decimal":
        # decimal(38,18)'s 38 digits, not Python's default 28: a value with more than 20 integer digits raises
        # InvalidOperation (a value the read cannot type).
        step, digits = Decimal(1).scaleb(-18), Context(prec=38)
        return lambda v: v.quantize(step, context=digits)
    if kind.name == "date":
        return lambda v: v.date()  # cassandra.util.Date
    if kind.name == "time":
        return lambda v: v.nanosecond_time  # cassandra.util.Time
    return None


def _reader(kind: CQLType) -> Callable[[Any], Any] | None:
    """What one value the driver read must become for Arrow in `kind`'s Spark type; None = as it is."""
    return _in_collections(kind, _read_leaf, reading=True)


def arrow_column(values: list[Any], kind: CQLType, arrow_type: pa.DataType) -> pa.Array:
    """Values of one column as the driver read them, as an Arrow array of the column's Spark type."""
    convert = _reader(kind)
    if convert is not None:
        values = [None if v is None else convert(v) for v in values]
    return pa.array(values, type=arrow_type)
