import pytest

from sluice import OptionError
from sluice._options import Option, OptionSpec, option_table
from sluice.engine import SINK_SPEC, SinkConfig

SECRET_SPEC = SINK_SPEC.extend([Option("store.password", "str", None, "Password.", secret=True)])


def parse(**raw):
    return SINK_SPEC.parse({k.replace("_", "."): v for k, v in raw.items()})


def test_defaults_follow_flink_connector_s2():
    config = SinkConfig.of(SINK_SPEC.parse({}))
    assert (config.batch_max_size, config.flush_buffer_size, config.flush_buffer_timeout) == (1000, 1048576, 1000)
    assert (config.requests_max_buffered, config.requests_max_inflight, config.mode) == (2000, 500, "unordered")
    assert (config.parallelism, config.max_retries, config.retry_delay_ms) == (16, 3, 1000)


def test_values_are_parsed_by_type_and_keys_are_case_insensitive():
    opts = SINK_SPEC.parse({"SINK.BATCH.MAX-SIZE": "10", "sink.mode": "Partition-Ordered",
                            "sink.partition-key": "a, b", "sink.flush-on-checkpoint": "TRUE"})
    assert opts["sink.batch.max-size"] == 10 and opts["sink.mode"] == "partition-ordered"
    assert opts["sink.partition-key"] == ("a", "b") and opts["sink.flush-on-checkpoint"] is True


def test_unknown_option_lists_valid_keys_and_closest_match():
    with pytest.raises(OptionError) as info:
        SINK_SPEC.parse({"sink.batch.maxsize": "10"})
    text = str(info.value)
    assert "unknown option 'sink.batch.maxsize'" in text
    assert "Did you mean 'sink.batch.max-size'?" in text
    assert "sink.requests.max-inflight" in text  # the list of valid keys


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"sink.batch.max-size": "ten"}, "'sink.batch.max-size' must be a whole number, got 'ten'"),
        ({"sink.batch.max-size": "0"}, "'sink.batch.max-size' must be >= 1, got 0"),
        ({"sink.parallelism": "5000"}, "'sink.parallelism' must be <= 4096"),
        ({"sink.mode": "fast"}, "'sink.mode' must be one of unordered, partition-ordered, global-ordered"),
        ({"sink.transactional": "maybe"}, "'sink.transactional' must be true or false"),
        ({"sink.transactional": "true"}, "sink.transactional=true needs sink.mode=global-ordered"),
        ({"sink.partition-key": "id"}, "sink.partition-key only applies to sink.mode=partition-ordered"),
        ({"sink.flush-on-checkpoint": "true", "sink.mode": "global-ordered"},
         "sink.flush-on-checkpoint only applies to sink.mode=partition-ordered"),
        ({"sink.requests.max-buffered": "500"}, "sink.requests.max-buffered (500) must be greater than"),
        ({"sink.max-retries": "100000"}, "'sink.max-retries' must be <= 100, got 100000"),
    ],
)
def test_bad_values_and_combinations_name_the_option(raw, message):
    with pytest.raises(OptionError, match=message.replace("(", r"\(").replace(")", r"\)")):
        SINK_SPEC.parse(raw)


def test_secrets_never_show_in_repr_or_errors():
    opts = SECRET_SPEC.parse({"store.password": "hunter2"})
    assert "hunter2" not in repr(opts) and "hunter2" not in str(opts)
    bad = SINK_SPEC.extend([Option("store.token-ttl", "int", 1, "TTL.", secret=True)])
    with pytest.raises(OptionError) as info:
        bad.parse({"store.token-ttl": "hunter2"})
    assert "hunter2" not in str(info.value)


CLIENT_SPEC = OptionSpec("client", (Option("client.servers", "str", None, "Servers.", required=True),
                                    Option("client.*", "prefix", None, "Any other client setting."),
                                    Option("timeout-ms", "int", 100, "Timeout.")))


def test_a_prefix_option_collects_every_key_under_it_into_one_value_hiding_secrets():
    opts = CLIENT_SPEC.parse({"client.servers": "a:1", "client.linger.ms": "20", "client.sasl.password": "pw-1",
                              "client.ssl.key.password": "pw-2", "client.ssl.keystore.password": "pw-3",
                              "client.sasl.oauthbearer.client.secret": "pw-4", "client.api-key": "pw-5",
                              "timeout-ms": "5"})
    settings = opts["client.*"]
    assert dict(settings) == {"servers": "a:1", "linger.ms": "20", "sasl.password": "pw-1",
                              "ssl.key.password": "pw-2", "ssl.keystore.password": "pw-3",
                              "sasl.oauthbearer.client.secret": "pw-4", "api-key": "pw-5"}
    assert opts["client.servers"] == "a:1" and opts["timeout-ms"] == 5 and opts.is_set("client.*")
    for shown in (repr(opts), str(opts), repr(settings)):
        assert "a:1" in shown and not any(f"pw-{n}" in shown for n in range(1, 6))
    assert settings.scrub("login pw-1 failed") == "login <redacted> failed"
    assert dict(CLIENT_SPEC.parse({"client.servers": "a:1"})["client.*"]) == {"servers": "a:1"}
    with pytest.raises(OptionError, match="Did you mean 'timeout-ms'") as info:
        CLIENT_SPEC.parse({"client.servers": "a:1", "timeout-m": "5", "client.sasl.password": "pw-1"})
    assert "pw-1" not in str(info.value) and "client.*" in str(info.value)
    with pytest.raises(OptionError, match=r"Did you mean 'client\.servers'"):
        CLIENT_SPEC.parse({"clent.servers": "a:1"})
    with pytest.raises(OptionError, match="needs option"):
        CLIENT_SPEC.parse({"client.other": "x"})
    assert "| `client.*` | prefix | (none) | any client.<setting> |" in option_table(CLIENT_SPEC.options)
    with pytest.raises(AssertionError, match="prefix option"):
        OptionSpec("bad", (Option("client.*", "str", None, "Not a prefix kind."),))


def test_required_options_are_named():
    spec = OptionSpec("demo", (Option("demo.table", "str", None, "Table.", required=True),))
    with pytest.raises(OptionError, match=r"needs option\(s\) demo.table"):
        spec.parse({})


def test_docs_options_tables_are_generated_from_the_declarations():
    from sluice import docgen

    assert docgen.render_options_doc() == docgen.OPTIONS_DOC.read_text(), (
        "docs/options.md is stale: run `make docs` (python -m sluice.docgen --write)"
    )
    assert docgen.render_reliability_doc() == docgen.RELIABILITY_DOC.read_text(), (
        "docs/reliability.md's table of refused records is stale: run `make docs` (python -m sluice.docgen --write)"
    )


def test_every_builtin_format_has_a_discovery_module_exporting_it():
    import importlib

    from sluice.spark._registry import BUILTIN_FORMATS, DISCOVERY_MODULES

    assert set(DISCOVERY_MODULES) == {*BUILTIN_FORMATS, "sluice_summary"}
    for name, module in DISCOVERY_MODULES.items():
        assert importlib.import_module(module).DefaultSource.name() == name


def test_a_read_only_format_refuses_every_write_first_naming_the_format_to_write_with():
    """Before any option is looked at: a write's options for it would otherwise be refused as unknown."""
    from sluice.connectors.postgres import PostgresChangesDataSource

    with pytest.raises(OptionError, match=r"format 'postgres_changes' is read-only \(spark.readStream\); write "
                                          r"with format\('postgres'\)"):
        PostgresChangesDataSource(options={"url": "postgresql://h/db", "table": "t", "sink.mode": "x"}).write_options()


def test_options_become_a_typed_object_whose_fields_are_the_declared_options():
    from dataclasses import dataclass

    from sluice._options import Option, OptionSpec

    spec = OptionSpec("demo", (Option("slot.failover", "bool", False, "."), Option("failOnDataLoss", "bool", True, "."),
                               Option("max-rows", "int", 5, ".")))

    @dataclass(frozen=True)
    class Demo:
        slot_failover: bool
        fail_on_data_loss: bool
        max_rows: int
        origin: str

    typed = spec.parse({"slot.failover": "true", "max-rows": "7"}).typed(Demo, covering=spec.options, origin="test")
    assert typed == Demo(slot_failover=True, fail_on_data_loss=True, max_rows=7, origin="test")

    @dataclass(frozen=True)
    class Partial:
        slot_failover: bool

    with pytest.raises(AssertionError, match=r"options \['failOnDataLoss', 'max-rows'\] have no field"):
        spec.parse({}).typed(Partial, covering=spec.options)

    @dataclass(frozen=True)
    class Misnamed:
        slot_fail_over: bool

    with pytest.raises(AssertionError, match=r"fields \['slot_fail_over'\] name no option"):
        spec.parse({}).typed(Misnamed)


def test_change_capture_reads_its_options_typed_and_never_shows_the_password():
    from sluice.connectors.postgres.changes._options import CHANGES_SPEC, ChangeOptions

    options = ChangeOptions.of(CHANGES_SPEC.parse({"url": "postgresql://u@h/db", "password": "s3cret", "table": "a,b",
                                                   "fetch-ranges": "3", "failOnDataLoss": "false"}))
    assert (options.table, options.fetch_ranges, options.fail_on_data_loss) == (("a", "b"), 3, False)
    assert options.slot is None
    assert options.connection == {"url": "postgresql://u@h/db", "password": "s3cret"}
    assert "s3cret" not in repr(options)


def test_postgres_reads_and_writes_its_options_typed_and_never_shows_the_password():
    import pickle

    from sluice.connectors.postgres._options import READ_SPEC, WRITE_SPEC, ReadOptions, WriteOptions

    write = WriteOptions.of(WRITE_SPEC.parse({"url": "postgresql://u:s3cret@h/db", "table": "s.t",
                                              "primary-key": "a, b", "connections-per-task": "4"}))
    assert write == WriteOptions(table="s.t", primary_key=("a", "b"), upsert_op_column=None,
                                 upsert_unchanged_column=None, schema_evolution="none", create_table=False,
                                 connections_per_task=4)
    read = ReadOptions.of(READ_SPEC.parse({"url": "postgresql://u:s3cret@h:5433/db", "query": "SELECT 1",
                                           "num-partitions": "3"}))
    assert (read.table, read.query, read.partition_column, read.num_partitions) == (None, "SELECT 1", None, 3)
    assert (read.consistent_snapshot, read.pushdown, read.snapshot_timeout_s) == (True, False, 600)
    assert (read.conn.host, read.conn.port, read.conn.dbname, read.conn.password) == ("h", 5433, "db", "s3cret")
    assert "s3cret" not in repr(read) and "s3cret" not in repr(write)
    assert pickle.loads(pickle.dumps(read)) == read  # the split readers carry it to the executors


def test_the_table_store_reads_and_writes_its_options_typed_and_never_shows_the_secrets():
    import pickle

    from sluice.tablestore._options import READ_SPEC, WRITE_SPEC, ReadOptions, WriteOptions

    secret = {"meta": "postgresql://u:s3cret@h/db", "storage.secret-access-key": "k3y", "warehouse": "s3://b/wh",
              "storage.access-key-id": "id"}
    write = WriteOptions.of(WRITE_SPEC.parse({"table": "t", "primary-key": "a, b", "auto-compact": "false", **secret}))
    assert (write.table, write.primary_key, write.auto_compact, write.job, write.job_named) == \
        ("t", ("a", "b"), False, "batch", False)
    job_named = WriteOptions.of(WRITE_SPEC.parse({"table": "t", "job": "batch"})).job_named
    assert job_named, "set to its default is still set"
    read = ReadOptions.of(READ_SPEC.parse({"table": "t", "barrier": "7", "aligned-with": "x,y", **secret}))
    assert (read.barrier, read.version, read.aligned_with, read.changes) == (7, None, ("x", "y"), False)
    assert read.meta == secret["meta"]
    for shown in (repr(write), repr(read)):
        assert "s3cret" not in shown and "k3y" not in shown
    assert pickle.loads(pickle.dumps(write)) == write  # the write plan carries it to the tasks
