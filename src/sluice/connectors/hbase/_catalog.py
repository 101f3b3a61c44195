"""The catalog: which Spark columns make the row key, and which `family:qualifier` cell each other column is.

hbase-spark users write a JSON catalog; sluice takes its three facts as options, the columns' types coming from
the DataFrame (writes) or the read's schema (`.schema(...)`, reads):

    .option("table", "shop:orders")          # namespace:table (namespace default when left out)
    .option("rowkey", "region,id")           # the key's columns, in key order (docs/hbase.md, row keys)
    .option("family", "d")                   # the family of every column the next option does not place
    .option("columns", "note=n:text,photo=m") # column=family:qualifier, or column=family (qualifier: its name)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from sluice.connector import Option, OptionError, Options

CATALOG_OPTIONS = (
    Option("table", "str", None, "The table, as namespace:table or table (namespace default).", required=True),
    Option("rowkey", "list", (), "The columns whose values make the row key, in key order (docs/hbase.md, row "
           "keys: composite keys sort as their columns).", required=True),
    Option("family", "str", None, "The column family of every non-key column the columns option does not place; "
           "its qualifier is the column's name."),
    Option("columns", "list", (), "Cells of named columns: column=family:qualifier or column=family (qualifier: "
           "the column's name), comma-separated."),
)


@dataclass(frozen=True)
class Cell:
    family: bytes
    qualifier: bytes

    def __str__(self) -> str:
        return f"{self.family.decode(errors='replace')}:{self.qualifier.decode(errors='replace')}"


@dataclass(frozen=True)
class Catalog:
    """The table, its row key's columns, and each other column's cell (in the DataFrame's or schema's order)."""

    table: str  # namespace:name
    key: tuple[str, ...]
    cells: tuple[tuple[str, Cell], ...]

    @property
    def families(self) -> frozenset[bytes]:
        return frozenset(cell.family for _, cell in self.cells)

    @classmethod
    def from_options(cls, opts: Options, columns: Sequence[str]) -> Catalog:
        table = opts["table"]
        namespace, _, name = table.rpartition(":")
        if not name or ":" in namespace:
            raise OptionError(f"table={table!r} must be namespace:table or table, e.g. 'shop:orders'.")
        key = tuple(opts["rowkey"])
        if not key:
            raise OptionError("rowkey must name the column(s) whose values make the row key, e.g. "
                              ".option('rowkey', 'id') or 'region,id'.")
        for column in key:
            if column not in columns:
                raise OptionError(f"rowkey column '{column}' is not a column (columns: {list(columns)}).")
        if len(set(key)) != len(key):
            raise OptionError(f"rowkey {list(key)} names a column twice.")
        placed: dict[str, Cell] = {}
        for item in opts["columns"]:
            column, sep, where = item.partition("=")
            family, _, qualifier = where.partition(":")
            column, family, qualifier = column.strip(), family.strip(), qualifier.strip()
            if not sep or not column or not family:
                raise OptionError(f"columns entry {item!r} must be column=family:qualifier or column=family, e.g. "
                                  "'note=d:text'.")
            if column not in columns:
                raise OptionError(f"columns entry {item!r} names column '{column}', which is not a column "
                                  f"(columns: {list(columns)}).")
            if column in key:
                raise OptionError(f"columns entry {item!r}: '{column}' is a rowkey column, which is the row key, "
                                  "not a cell. Remove the entry.")
            placed[column] = Cell(family.encode(), (qualifier or column).encode())
        default = opts["family"]
        cells = []
        for column in columns:
            if column in key:
                continue
            if column in placed:
                cells.append((column, placed[column]))
            elif default:
                cells.append((column, Cell(default.encode(), column.encode())))
            else:
                raise OptionError(f"column '{column}' has no cell: set family (the family of every column not "
                                  f"placed otherwise), or place it with columns='{column}=family:qualifier'.")
        seen: dict[Cell, str] = {}
        for column, cell in cells:
            if cell in seen:
                raise OptionError(f"columns '{seen[cell]}' and '{column}' are both cell {cell}; give each its own "
                                  "qualifier.")
            seen[cell] = column
        return cls(f"{namespace or 'default'}:{name}", key, tuple(cells))

    def check_families(self, existing: frozenset[bytes]) -> None:
        """Every family the catalog writes or reads exists in the table (a missing one fails every put)."""
        missing = sorted(f.decode(errors="replace") for f in self.families - existing)
        if missing:
            have = sorted(f.decode(errors="replace") for f in existing)
            raise OptionError(f"table {self.table} has no column family {missing} (its families: {have}). Add it "
                              f"(alter '{self.table}', NAME => '{missing[0]}' in the HBase shell) or map the "
                              "columns to an existing family (family, columns options).")
