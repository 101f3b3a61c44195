"""Row keys, cells and the catalog without a server: byte order follows key order, values survive the round
trip, bad keys and catalogs are refused with their column named."""

import datetime
import decimal

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sluice.connector import OptionError, OptionSpec, RecordError
from sluice.connectors.hbase._catalog import CATALOG_OPTIONS, Catalog
from sluice.connectors.hbase._cells import decoder, encoder
from sluice.connectors.hbase._keys import KeyCodec
from sluice.connectors.hbase._source import KeyRange, key_range, successor

SPEC = OptionSpec("hbase", CATALOG_OPTIONS)

TYPES = {
    "b": (pa.int8(), st.integers(-128, 127)),
    "i": (pa.int32(), st.integers(-(2**31), 2**31 - 1)),
    "l": (pa.int64(), st.integers(-(2**63), 2**63 - 1)),
    "d": (pa.float64(), st.floats(allow_nan=False).map(lambda v: 0.0 if v == 0 else v)),
    "f": (pa.float32(), st.floats(width=32, allow_nan=False).map(lambda v: 0.0 if v == 0 else v)),
    "s": (pa.string(), st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=6)),
    "y": (pa.binary(), st.binary(max_size=6).filter(lambda b: b"\x00" not in b)),
    "t": (pa.timestamp("us", "UTC"), st.datetimes(datetime.datetime(1900, 1, 1), datetime.datetime(2200, 1, 1),
                                                   timezones=st.just(datetime.UTC))),
    "e": (pa.date32(), st.dates()),
    "m": (pa.decimal128(12, 3), st.decimals(-(10**8), 10**8, places=3, allow_nan=False, allow_infinity=False)),
    "o": (pa.bool_(), st.booleans()),
}


@st.composite
def keyed_rows(draw):
    names = draw(st.lists(st.sampled_from(sorted(TYPES)), min_size=1, max_size=3, unique=True))
    rows = draw(st.lists(st.tuples(*(TYPES[n][1] for n in names)), min_size=2, max_size=12))
    return names, rows


@settings(max_examples=300, deadline=None)
@given(keyed_rows())
def test_key_bytes_sort_as_the_keys_and_decode_back(case):
    names, rows = case
    schema = pa.schema([(n, TYPES[n][0]) for n in names])
    batch = pa.RecordBatch.from_pylist([dict(zip(names, r, strict=True)) for r in rows], schema=schema)
    codec = KeyCodec.for_schema(names, schema)
    keys = codec.encode(batch)
    by_bytes = sorted(range(len(rows)), key=lambda i: keys[i])
    by_value = sorted(range(len(rows)), key=lambda i: rows[i])
    assert [rows[i] for i in by_bytes] == [rows[i] for i in by_value]
    decoded = codec.decoder(schema)(keys)
    assert pa.RecordBatch.from_arrays(decoded, schema=schema).to_pylist() == batch.to_pylist()


def test_a_one_string_key_is_the_strings_bytes_as_other_clients_write_it():
    batch = pa.record_batch({"id": ["row-1", "é"]})
    assert KeyCodec.for_schema(["id"], batch.schema).encode(batch) == [b"row-1", "é".encode()]


def test_null_and_nul_keys_are_refused_naming_the_column_and_every_such_row():
    batch = pa.record_batch({"a": pa.array(["x", None, "z\x00", "w"]), "b": pa.array([1, 2, 3, None])})
    with pytest.raises(RecordError, match="row key column 'a' is null in row 1") as refused:
        KeyCodec.for_schema(["a", "b"], batch.schema).encode(batch)
    # One problem at a time, each refused row with its own reason: the rest is encoded again (errors.tolerance=all).
    assert refused.value.rows == [1]
    batch = batch.take([0, 2, 3])
    with pytest.raises(RecordError, match="row key column 'a' holds a 0 byte in row 1") as refused:
        KeyCodec.for_schema(["a", "b"], batch.schema).encode(batch)
    assert refused.value.rows == [1]
    batch = pa.record_batch({"a": pa.array(["x\x00y"]), "b": pa.array([1])})
    with pytest.raises(RecordError, match="row key column 'a' holds a 0 byte"):
        KeyCodec.for_schema(["a", "b"], batch.schema).encode(batch)
    with pytest.raises(OptionError, match="row key column 'm' is"):
        KeyCodec.for_schema(["m"], pa.schema([("m", pa.map_(pa.string(), pa.int32()))]))


@pytest.mark.parametrize("dtype, value, cell", [
    (pa.int64(), -2, b"\xff" * 7 + b"\xfe"),
    (pa.int32(), 1, b"\x00\x00\x00\x01"),
    (pa.int16(), 258, b"\x01\x02"),
    (pa.float64(), 1.5, b"\x3f\xf8" + b"\x00" * 6),
    (pa.bool_(), True, b"\xff"),
    (pa.string(), "é", "é".encode()),
    (pa.decimal128(5, 2), decimal.Decimal("-1.50"), b"\x00\x00\x00\x02\xff\x6a"),
])
def test_cells_are_what_hbases_bytes_class_writes(dtype, value, cell):
    """Bytes.toBytes(-2L), toBytes(1), toBytes((short) 258), toBytes(1.5d), toBytes(true), UTF-8, and
    Bytes.toBytes(new BigDecimal("-1.50")) (scale 2, unscaled -150 = 0xff6a)."""
    assert encoder(dtype, "c")(pa.array([value, None], dtype)).to_pylist() == [cell, None]
    assert decoder(dtype, "c")(cell) == value


def test_a_cell_of_the_wrong_width_names_its_column():
    with pytest.raises(ValueError, match="column 'n', which takes 8-byte values"):
        decoder(pa.int64(), "n")(b"\x01\x02")


def test_the_catalog_places_columns_and_refuses_what_it_cannot():
    opts = SPEC.parse({"table": "shop:orders", "rowkey": "id", "family": "d", "columns": "note=n:text, pic=m"})
    catalog = Catalog.from_options(opts, ["id", "amount", "note", "pic"])
    assert catalog.table == "shop:orders" and catalog.key == ("id",)
    assert [(c, str(cell)) for c, cell in catalog.cells] == [("amount", "d:amount"), ("note", "n:text"),
                                                           ("pic", "m:pic")]
    assert Catalog.from_options(SPEC.parse({"table": "t", "rowkey": "id", "family": "d"}), ["id"]).table == \
        "default:t"
    bad = [({"rowkey": "nope", "family": "d"}, "rowkey column 'nope' is not a column"),
           ({"rowkey": "id"}, "column 'amount' has no cell: set family"),
           ({"rowkey": "id", "columns": "amount=d:x,note=d:x,pic=m"}, "both cell d:x"),
           ({"rowkey": "id", "family": "d", "columns": "id=d:x"}, "'id' is a rowkey column"),
           ({"rowkey": "id", "family": "d", "columns": "amount"}, "must be column=family:qualifier")]
    for more, message in bad:
        with pytest.raises(OptionError, match=message):
            Catalog.from_options(SPEC.parse({"table": "t", **more}), ["id", "amount", "note", "pic"])
    with pytest.raises(OptionError, match=r"no column family \['n'\].*its families: \['d', 'm'\]"):
        catalog.check_families(frozenset({b"d", b"m"}))


class F:
    """A filter as Spark 4.1 hands it to a Python reader."""

    def __init__(self, kind: str, column: str, value) -> None:
        self.__class__ = type(kind, (F,), {})
        self.attribute, self.value = (column,), value


def test_filters_on_the_first_key_column_become_the_scans_key_range():
    schema = pa.schema([("region", pa.string()), ("id", pa.int64())])
    two = KeyCodec.for_schema(["region", "id"], schema)
    rng, taken = key_range([F("EqualTo", "region", "eu"), F("GreaterThan", "id", 5)], two, schema)
    assert rng == KeyRange(b"eu\x00", b"eu\x01") and len(taken) == 1  # id is not the first column: Spark's
    rng, _ = key_range([F("StringStartsWith", "region", "e"), F("LessThan", "region", "eu")], two, schema)
    assert rng == KeyRange(b"e", b"eu\x00")
    one = KeyCodec.for_schema(["id"], schema)
    rng, _ = key_range([F("GreaterThan", "id", 1), F("LessThanOrEqual", "id", 3)], one, schema)
    assert rng == KeyRange(one.encode_values([1], schema) + b"\x00", one.encode_values([3], schema) + b"\x00")
    rng, _ = key_range([F("GreaterThan", "id", 5), F("LessThan", "id", 2)], one, schema)
    assert rng is None
    assert successor(b"a\xff\xff") == b"b" and successor(b"\xff") is None


def test_puts_built_in_arrow_are_the_bytes_thrift_writes_for_the_same_tputs():
    from thriftpy2.protocol import TBinaryProtocolFactory
    from thriftpy2.utils import serialize

    from sluice.connectors.hbase._client import thrift
    from sluice.connectors.hbase._wire import put_row, thrift_puts

    t = thrift()
    keys = [b"a", b"\x00\xff", b"row-3"]
    cells = [(b"d", b"v", pa.array([b"x", None, b""], pa.binary())), (b"m", b"big", pa.array([None, b"y" * 300, None]))]
    stamps = [1, 2**40, 3]
    puts, counts = thrift_puts(pa.array(keys, pa.binary()), cells, stamps, durability=1)
    assert counts.tolist() == [1, 1, 1]
    for i, key in enumerate(keys):
        values = [t.TColumnValue(family=f, qualifier=q, value=v[i].as_py(), timestamp=stamps[i])
                  for f, q, v in cells if v[i].is_valid]
        want = serialize(t.TPut(row=key, columnValues=values, timestamp=stamps[i], durability=1),
                         TBinaryProtocolFactory())
        assert puts[i].as_py() == want and put_row(want) == key


@settings(max_examples=200, deadline=None)
@given(st.lists(st.binary(max_size=4), min_size=1, max_size=6, unique=True),
       st.lists(st.binary(max_size=5), max_size=40))
def test_a_key_is_placed_in_the_region_whose_range_holds_its_bytes(bounds, keys):
    """Region placement in Arrow against Python's bytes order (HBase's: unsigned, a prefix first), on short keys
    of any bytes, so trailing 0 bytes, prefixes of a start key and keys equal to one all occur."""
    import bisect

    from sluice.connectors.hbase._client import Region
    from sluice.connectors.hbase._regions import RegionMap

    starts = sorted({b"", *bounds})
    regions = RegionMap.of([Region(s, b"", f"rs{i % 2}:16020") for i, s in enumerate(reversed(starts))])
    assert regions.starts == tuple(starts)
    got = regions.region_of(pa.array(keys, pa.binary())).tolist()
    assert got == [bisect.bisect_right(starts, k) - 1 for k in keys]
