"""Avro schemas as typed trees: parsed from a schema's JSON text (Avro's specification, "Schema Declaration"), named
types resolved by full name with namespaces, so the decoder, the resolver and the encoder walk one structure."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from sluice._errors import SluiceError

PRIMITIVES = frozenset({"null", "boolean", "int", "long", "float", "double", "bytes", "string"})
NO_DEFAULT: Any = object()  # a field without "default" (None is the JSON null default)


class SchemaError(SluiceError, ValueError):
    """A schema text that is not a valid Avro schema, or a pair of schemas that do not resolve."""


@dataclass(frozen=True, eq=False)
class AvroField:
    name: str
    type: AvroType
    default: Any = NO_DEFAULT
    aliases: tuple[str, ...] = ()


@dataclass(frozen=True, eq=False)
class AvroType:
    """One Avro type. `kind` is the Avro type name (record, enum, array, map, union, fixed or a primitive)."""

    kind: str
    logical: str | None = None
    name: str | None = None  # full name of a record, enum or fixed
    aliases: tuple[str, ...] = ()
    fields: tuple[AvroField, ...] = ()
    symbols: tuple[str, ...] = ()
    enum_default: str | None = None
    items: AvroType | None = None  # array items, map values
    branches: tuple[AvroType, ...] = ()
    size: int = 0
    precision: int = 0
    scale: int = 0
    props: dict[str, Any] = field(default_factory=dict)

    @property
    def null_index(self) -> int | None:
        """The branch index of null in a union, None when null is not a branch."""
        for i, b in enumerate(self.branches):
            if b.kind == "null":
                return i
        return None

    @property
    def non_null(self) -> tuple[AvroType, ...]:
        return tuple(b for b in self.branches if b.kind != "null")


def parse(text: str) -> AvroType:
    """Parse a schema's JSON text. Recursive records are refused (Spark refuses them by default too)."""
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as e:
        raise SchemaError(f"the Avro schema is not JSON: {e}") from e
    return _Parser().parse(obj, "")


def _full(name: str, namespace: str) -> str:
    return name if "." in name or not namespace else f"{namespace}.{name}"


class _Parser:
    def __init__(self) -> None:
        self.named: dict[str, AvroType] = {}
        self.open: set[str] = set()

    def parse(self, obj: Any, ns: str) -> AvroType:
        if isinstance(obj, str):
            if obj in PRIMITIVES:
                return AvroType(obj)
            for candidate in (_full(obj, ns), obj):
                if candidate in self.open:
                    raise SchemaError(f"the Avro schema is recursive at {candidate!r}: sluice reads no recursive types")
                if candidate in self.named:
                    return self.named[candidate]
            raise SchemaError(f"the Avro schema names an undefined type {obj!r}")
        if isinstance(obj, list):
            return AvroType("union", branches=tuple(self.parse(b, ns) for b in obj))
        if not isinstance(obj, dict) or "type" not in obj:
            raise SchemaError(f"not an Avro schema: {json.dumps(obj)[:200]}")
        kind, logical = obj["type"], obj.get("logicalType")
        if isinstance(kind, (dict, list)) or (
            kind not in PRIMITIVES and kind not in ("record", "error", "enum", "array", "map", "fixed")
        ):
            inner = self.parse(kind, ns)  # {"type": "Name"} or {"type": {...}}: the inner type itself
            return inner
        if kind in PRIMITIVES:
            return AvroType(
                kind, logical=logical, precision=int(obj.get("precision", 0)), scale=int(obj.get("scale", 0))
            )
        if kind == "array":
            return AvroType("array", items=self.parse(obj["items"], ns))
        if kind == "map":
            return AvroType("map", items=self.parse(obj["values"], ns))
        name = obj.get("name")
        if not isinstance(name, str):
            raise SchemaError(f"an Avro {kind} needs a name: {json.dumps(obj)[:200]}")
        full = _full(name, obj.get("namespace", ns) if "." not in name else "")
        inner_ns = full.rpartition(".")[0]
        aliases = tuple(_full(a, inner_ns) for a in obj.get("aliases", ()))
        if kind == "enum":
            t = AvroType(
                "enum", name=full, aliases=aliases, symbols=tuple(obj["symbols"]), enum_default=obj.get("default")
            )
        elif kind == "fixed":
            t = AvroType(
                "fixed",
                logical=logical,
                name=full,
                aliases=aliases,
                size=int(obj["size"]),
                precision=int(obj.get("precision", 0)),
                scale=int(obj.get("scale", 0)),
            )
        else:
            self.open.add(full)
            fields = tuple(
                AvroField(
                    f["name"],
                    self.parse(f["type"], inner_ns),
                    f.get("default", NO_DEFAULT),
                    tuple(f.get("aliases", ())),
                )
                for f in obj["fields"]
            )
            self.open.discard(full)
            t = AvroType("record", name=full, aliases=aliases, fields=fields)
        self.named[full] = t
        return t


def to_json(t: AvroType, seen: set[str] | None = None) -> Any:
    """The schema's JSON object again (named types written once, then referenced by name)."""
    seen = set() if seen is None else seen
    if t.kind in PRIMITIVES:
        if t.logical is None:
            return t.kind
        out: dict[str, Any] = {"type": t.kind, "logicalType": t.logical}
        if t.logical == "decimal":
            out.update(precision=t.precision, scale=t.scale)
        return out
    if t.kind == "union":
        return [to_json(b, seen) for b in t.branches]
    if t.kind == "array":
        return {"type": "array", "items": to_json(t.items, seen)}  # type: ignore[arg-type]
    if t.kind == "map":
        return {"type": "map", "values": to_json(t.items, seen)}  # type: ignore[arg-type]
    assert t.name is not None
    if t.name in seen:
        return t.name
    seen.add(t.name)
    namespace, _, short = t.name.rpartition(".")
    named: dict[str, Any] = {"name": short, "namespace": namespace}
    if t.kind == "enum":
        out = {"type": "enum", **named, "symbols": list(t.symbols)}
        if t.enum_default is not None:
            out["default"] = t.enum_default
        return out
    if t.kind == "fixed":
        out = {"type": "fixed", **named, "size": t.size}
        if t.logical:
            out["logicalType"] = t.logical
            if t.logical == "decimal":
                out.update(precision=t.precision, scale=t.scale)
        return out
    fields = []
    for f in t.fields:
        fo: dict[str, Any] = {"name": f.name, "type": to_json(f.type, seen)}
        if f.default is not NO_DEFAULT:
            fo["default"] = f.default
        fields.append(fo)
    return {"type": "record", **named, "fields": fields}
