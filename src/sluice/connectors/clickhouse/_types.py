"""ClickHouse column types: parsed once from system.columns, mapped to what Spark writes and reads.

Writes send Arrow (`FORMAT ArrowStream`) and ClickHouse converts each Arrow column to its column's type, so a write
only needs the DataFrame's Spark type to be one the column accepts (`write_problem`). Reads ask ClickHouse for
types whose Arrow form Spark has (`read_type`: UUID, IPv4/6, Enum, JSON and wide integers as String, UInt64 as
Decimal(20, 0), every DateTime as DateTime64(6, 'UTC'), ...), casting in the SELECT, nested types included.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

import pyarrow as pa

from sluice.connector import OptionError

if TYPE_CHECKING:
    from pyspark.sql.types import DataType

SIGNED = {"Int8": 8, "Int16": 16, "Int32": 32, "Int64": 64}
UNSIGNED = {"UInt8": 8, "UInt16": 16, "UInt32": 32, "UInt64": 64}
WIDE_INTS = ("Int128", "Int256", "UInt128", "UInt256")
AS_STRING = ("UUID", "IPv4", "IPv6", "JSON", "Object", *WIDE_INTS)  # read as their text
ENUMS = ("Enum8", "Enum16", "Enum")
WRAPPERS = ("Nullable", "LowCardinality", "SimpleAggregateFunction")
DECIMAL_WIDTHS = {"Decimal32": 9, "Decimal64": 18, "Decimal128": 38, "Decimal256": 76}
SUPPORTED = ("Int8..Int256, UInt8..UInt256, Float32/64, Bool, Decimal (up to 76 digits), String, FixedString, "
             "UUID, IPv4, IPv6, Enum8/16, JSON, Date, Date32, DateTime, DateTime64, and Nullable, LowCardinality, "
             "Array, Map and Tuple of them")

_TOKEN = re.compile(r"\s*(?:(?P<quoted>'(?:[^'\\]|\\.)*')|(?P<ident>`(?:[^`\\]|\\.)*`|[A-Za-z_][A-Za-z0-9_.]*)"
                    r"|(?P<number>-?\d+)|(?P<punct>[(),=]))")


@dataclass(frozen=True)
class CHType:
    """One ClickHouse type: its name, parameters (precision, time zone, enum names) and element types."""

    name: str
    params: tuple[str | int, ...] = ()
    children: tuple[CHType, ...] = ()
    fields: tuple[str, ...] = ()  # a named Tuple's element names

    @property
    def nullable(self) -> bool:
        return self.name == "Nullable" or (self.name == "LowCardinality" and self.children[0].nullable)

    @property
    def base(self) -> CHType:
        """The type under Nullable and LowCardinality (and SimpleAggregateFunction's value type)."""
        return self.children[-1].base if self.name in WRAPPERS else self

    @property
    def precision(self) -> int:
        return int(self.params[0]) if self.name == "Decimal" else DECIMAL_WIDTHS.get(self.name, 0)

    @property
    def scale(self) -> int:
        return int(self.params[-1]) if self.name in ("Decimal", *DECIMAL_WIDTHS) else 0

    @property
    def enum_names(self) -> tuple[str, ...]:
        return tuple(p for p in self.params if isinstance(p, str)) if self.name in ENUMS else ()

    def __str__(self) -> str:
        if self.name == "Tuple" and self.fields:
            return f"Tuple({', '.join(f'{_ident(n)} {c}' for n, c in zip(self.fields, self.children, strict=True))})"
        if self.name in ENUMS:
            pairs = [f"{_quote(self.params[i])} = {self.params[i + 1]}" for i in range(0, len(self.params), 2)]
            return f"{self.name}({', '.join(pairs)})"
        args = [_quote(p) if isinstance(p, str) else str(p) for p in self.params] + [str(c) for c in self.children]
        return f"{self.name}({', '.join(args)})" if args else self.name


def _quote(text: str | int) -> str:
    return "'" + str(text).replace("\\", "\\\\").replace("'", "\\'") + "'"


def _ident(name: str) -> str:
    return "`" + name.replace("\\", "\\\\").replace("`", "\\`") + "`"


def _unquote(token: str) -> str:
    return re.sub(r"\\(.)", r"\1", token[1:-1])


def parse_type(spelled: str) -> CHType:
    """A type as system.columns spells it, e.g. `Array(Tuple(a Nullable(Int32), b LowCardinality(String)))`."""
    tokens: list[tuple[str, str]] = []
    text, at = spelled.strip(), 0
    while at < len(text):
        match = _TOKEN.match(text, at)
        kind = match.lastgroup if match is not None else None  # every alternative of _TOKEN is a named group
        if match is None or kind is None:
            raise ValueError(f"cannot parse ClickHouse type {spelled!r} at position {at}")
        tokens.append((kind, match.group(kind)))
        at = match.end()
    parsed, end = _parse(tokens, 0)
    if end != len(tokens):
        raise ValueError(f"cannot parse ClickHouse type {spelled!r}")
    return parsed


def _parse(tokens: list[tuple[str, str]], i: int) -> tuple[CHType, int]:
    kind, name = tokens[i]
    if kind != "ident":
        raise ValueError(f"expected a type name, found {name!r}")
    i += 1
    if i >= len(tokens) or tokens[i][1] != "(":
        return CHType(name), i
    i += 1
    if name in ("JSON", "Object"):  # JSON(max_dynamic_paths = 10, a.b UInt32, SKIP c): read and written as text
        depth = 1
        while depth:
            depth += {"(": 1, ")": -1}.get(tokens[i][1], 0)
            i += 1
        return CHType(name), i
    params: list[str | int] = []
    children: list[CHType] = []
    fields: list[str] = []
    while tokens[i][1] != ")":
        kind, text = tokens[i]
        if kind == "quoted":
            params.append(_unquote(text))
            i += 1
            if tokens[i][1] == "=":  # Enum8('red' = 1)
                params.append(int(tokens[i + 1][1]))
                i += 2
        elif kind == "number":
            params.append(int(text))
            i += 1
        elif name == "SimpleAggregateFunction" and not children and not params:
            params.append(text)  # the aggregate function's name
            i += 1
        elif kind == "ident" and tokens[i + 1][0] == "ident":  # a named element: `Tuple(a Int32)`
            fields.append(_unquote(text) if text.startswith("`") else text)
            child, i = _parse(tokens, i + 1)
            children.append(child)
        else:
            child, i = _parse(tokens, i)
            children.append(child)
        if tokens[i][1] == ",":
            i += 1
    return CHType(name, tuple(params), tuple(children), tuple(fields)), i + 1


def column_type(column: str, spelled: str) -> CHType:
    """The parsed type of a column, or an error naming the column when sluice cannot move its values."""
    try:
        parsed = parse_type(spelled)
        read_type(parsed)
    except (ValueError, IndexError, KeyError):
        raise OptionError(f"column '{column}' has ClickHouse type {spelled}, which sluice does not write or read; "
                          f"supported: {SUPPORTED}. Exclude the column (it must then have a default) or change "
                          "its type.") from None
    return parsed


# ------------------------------------------------------------------------------------------------------- reads
def read_type(t: CHType) -> CHType:
    """The type a read casts the column to: one whose Arrow form Spark has (raises KeyError when none)."""
    name = t.name
    if name == "Nullable":
        return CHType("Nullable", (), (read_type(t.children[0]),))
    if name == "LowCardinality":
        return read_type(t.children[0])
    if name == "SimpleAggregateFunction":
        return read_type(t.children[-1])
    if name == "Array":
        return CHType("Array", (), (read_type(t.children[0]),))
    if name == "Map":
        return CHType("Map", (), tuple(read_type(c) for c in t.children))
    if name == "Tuple":
        fields = t.fields or tuple(f"_{i + 1}" for i in range(len(t.children)))
        return CHType("Tuple", (), tuple(read_type(c) for c in t.children), fields)
    if name in SIGNED or name in ("Float32", "Float64", "Bool", "String", "Date32"):
        return t
    if name == "Date":
        return CHType("Date32")  # Date32 is Arrow date32 on every server; Date may be UInt16
    if name in ("UInt8", "UInt16", "UInt32"):
        return CHType(f"Int{UNSIGNED[name] * 2}")  # Spark has no unsigned types: the next wider signed one
    if name == "UInt64":
        return CHType("Decimal", (20, 0))
    if name in ("DateTime", "DateTime64"):
        return CHType("DateTime64", (6, "UTC"))  # Spark's timestamp: microseconds, an instant
    if name == "Decimal" or name in DECIMAL_WIDTHS:
        return CHType("Decimal", (t.precision, t.scale)) if t.precision <= 38 else CHType("String")
    if name in AS_STRING or name in ENUMS or name == "FixedString":
        return CHType("String")
    raise KeyError(name)


def arrow_type(t: CHType) -> pa.DataType:
    """The Arrow type of a read_type() result, as Spark receives it."""
    name = t.name
    if name == "Nullable":
        return arrow_type(t.children[0])
    if name == "Array":
        return pa.list_(arrow_type(t.children[0]))
    if name == "Map":
        return pa.map_(arrow_type(t.children[0]), arrow_type(t.children[1]))
    if name == "Tuple":
        return pa.struct([pa.field(f, arrow_type(c)) for f, c in zip(t.fields, t.children, strict=True)])
    if name in SIGNED:
        return pa.from_numpy_dtype(f"int{SIGNED[name]}")
    if name == "Decimal":
        return pa.decimal128(t.precision, t.scale)
    simple = {"Float32": pa.float32(), "Float64": pa.float64(), "Bool": pa.bool_(), "String": pa.string(),
              "Date32": pa.date32(), "DateTime64": pa.timestamp("us", "UTC")}
    return simple[name]


# ------------------------------------------------------------------------------------------------------ writes
NUMBERS = {"byte", "short", "integer", "long", "float", "double", "decimal"}
TEXT = {"string"}
ACCEPTS = {
    **{n: NUMBERS | {"boolean"} for n in (*SIGNED, *UNSIGNED, *WIDE_INTS, "Bool")},
    "Float32": NUMBERS, "Float64": NUMBERS, "Decimal": NUMBERS,
    **{n: NUMBERS for n in DECIMAL_WIDTHS},
    "String": {"string", "binary"}, "FixedString": {"string", "binary"},
    **{n: TEXT for n in ("UUID", "IPv4", "IPv6", "JSON", "Object", *ENUMS)},
    "Date": {"date"}, "Date32": {"date"}, "DateTime": {"timestamp", "timestamp_ntz"},
    "DateTime64": {"timestamp", "timestamp_ntz"},
}


def write_problem(t: CHType, spark_type: DataType, where: str) -> str | None:
    """Why a Spark value of `spark_type` cannot go into a ClickHouse `t` (None when it can); `where` names the
    place (a column, or an element of one)."""
    from pyspark.sql.types import ArrayType, MapType, StructType

    base = t.base
    if base.name == "Array":
        if not isinstance(spark_type, ArrayType):
            return f"{where} is {spark_type.simpleString()} in the DataFrame but {t} in the table: give it an array"
        return write_problem(base.children[0], spark_type.elementType, f"an element of {where}")
    if base.name == "Map":
        if not isinstance(spark_type, MapType):
            return f"{where} is {spark_type.simpleString()} in the DataFrame but {t} in the table: give it a map"
        return (write_problem(base.children[0], spark_type.keyType, f"a key of {where}")
                or write_problem(base.children[1], spark_type.valueType, f"a value of {where}"))
    if base.name == "Tuple":
        if not isinstance(spark_type, StructType):
            return f"{where} is {spark_type.simpleString()} in the DataFrame but {t} in the table: give it a struct"
        names = list(spark_type.fieldNames())
        wanted = list(base.fields) or [f"_{i + 1}" for i in range(len(base.children))]
        if sorted(names) != sorted(wanted):
            # ClickHouse matches a struct's fields to a named Tuple's elements by name and fills the missing
            # ones with defaults: a misnamed field would silently be lost.
            return (f"{where} is a struct of fields {names} but the table's {t} has elements {wanted}: name the "
                    "struct's fields as the tuple's elements")
        for field in spark_type.fields:
            problem = write_problem(base.children[wanted.index(field.name)], field.dataType,
                                    f"field '{field.name}' of {where}")
            if problem:
                return problem
        return None
    accepted = ACCEPTS.get(base.name)
    if accepted is None:
        return f"{where} has ClickHouse type {t}, which sluice does not write; supported: {SUPPORTED}"
    if spark_type.typeName() not in accepted:
        return (f"{where} is {spark_type.simpleString()} in the DataFrame but {t} in the table; cast it first (it "
                f"takes {', '.join(sorted(accepted))})")
    return None


def column_sql_type(spark_type: DataType, nullable: bool, where: str) -> str:
    """The ClickHouse type schema.evolution=add-columns gives a new column of `spark_type`: the type that holds
    every value of it (Nullable where the Spark field is, arrays' elements too; ClickHouse has no Nullable Array,
    Map or Tuple: those default to empty)."""
    from pyspark.sql.types import ArrayType, DecimalType, MapType, StructType

    if isinstance(spark_type, ArrayType):
        return f"Array({column_sql_type(spark_type.elementType, spark_type.containsNull, where)})"
    if isinstance(spark_type, MapType):
        return (f"Map({column_sql_type(spark_type.keyType, False, where)}, "
                f"{column_sql_type(spark_type.valueType, spark_type.valueContainsNull, where)})")
    if isinstance(spark_type, StructType):
        return "Tuple(" + ", ".join(f"{_ident(f.name)} {column_sql_type(f.dataType, f.nullable, where)}"
                                    for f in spark_type.fields) + ")"
    if isinstance(spark_type, DecimalType):
        base = f"Decimal({spark_type.precision}, {spark_type.scale})"
    else:
        simple = {"boolean": "Bool", "byte": "Int8", "short": "Int16", "integer": "Int32", "long": "Int64",
                  "float": "Float32", "double": "Float64", "string": "String", "binary": "String",
                  "date": "Date32", "timestamp": "DateTime64(6, 'UTC')", "timestamp_ntz": "DateTime64(6)"}
        found = simple.get(spark_type.typeName())
        if found is None:
            raise OptionError(f"{where} has Spark type {spark_type.simpleString()}, which schema.evolution=add-columns "
                              "cannot map to a ClickHouse type; add the column to the table yourself.")
        base = found
    return f"Nullable({base})" if nullable else base
