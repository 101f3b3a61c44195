"""Behaviour pinned to S2's published API (specs/s2/openapi.json, by operationId) and the official s2-sdk.

Each test is named after the operation (and parameter or schema) it follows.
"""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import s2_sdk
from s2_sdk import (
    AppendInput,
    BasinConfig,
    Encryption,
    EnsureStatus,
    Record,
    SeqNum,
    StreamConfig,
    Timestamping,
    TimestampingMode,
)

from tests.s2local.conftest import client_for, create_stream, run
from tests.s2local.raw import h2_request

# What S2 reports for a stream config field nobody set (openapi.json StreamConfig / TimestampingConfig /
# DeleteOnEmptyConfig descriptions; storage class: s2-lite's default).
S2_STREAM_DEFAULTS = {
    "storage_class": "express",
    "retention_policy": {"age": 7 * 24 * 3600},
    "timestamping": {"mode": "client-prefer", "uncapped": False},
    "delete_on_empty": {"min_age_secs": 0},
}


def _no_retry(server):
    return client_for(server, retry=s2_sdk.Retry(max_attempts=1))


# ---------------------------------------------------------------- ensure_basin / ensure_stream (PUT)
def test_ensure_basin_with_the_current_config_is_noop(s2_server, basin_name):
    """PUT /basins/{basin}: an existing basin whose effective config would not change answers 200 with
    s2-provision-result: noop (the SDK's CONFIG_UNCHANGED), also when the request writes defaults out."""

    async def scenario():
        async with client_for(s2_server) as s2:
            await s2.create_basin(basin_name)
            current = await s2.get_basin_config(basin_name)
            assert (await s2.ensure_basin(basin_name, config=current)).status == EnsureStatus.CONFIG_UNCHANGED
            spelled_out = BasinConfig(create_stream_on_append=False, create_stream_on_read=False)
            assert (await s2.ensure_basin(basin_name, config=spelled_out)).status == EnsureStatus.CONFIG_UNCHANGED
            changed = BasinConfig(create_stream_on_read=True)
            assert (await s2.ensure_basin(basin_name, config=changed)).status == EnsureStatus.CONFIG_UPDATED
            current = await s2.get_basin_config(basin_name)
            assert (await s2.ensure_basin(basin_name, config=current)).status == EnsureStatus.CONFIG_UNCHANGED

    run(scenario())
    # The current config restated in full (the flag it sets, the others at their defaults): nothing changes.
    body = json.dumps({"config": {"create_stream_on_read": True, "create_stream_on_append": False}}).encode()
    status, headers, _ = h2_request(s2_server.port, "PUT", f"/v1/basins/{basin_name}",
                                    {"content-type": "application/json"}, body)
    assert status == 200 and headers["s2-provision-result"] == "noop"


def test_ensure_stream_with_the_current_config_is_noop(s2_server, basin_name):
    """PUT /streams/{stream}: a stream created without a config has S2's defaults, so ensuring it with those
    defaults written out, or with what get_stream_config answers, is a noop."""

    async def scenario():
        async with client_for(s2_server) as s2:
            await s2.create_basin(basin_name)
            basin = s2.basin(basin_name)
            await basin.create_stream("s")
            defaults = StreamConfig(storage_class="express", retention_policy=7 * 24 * 3600,
                                    timestamping=Timestamping(mode=TimestampingMode.CLIENT_PREFER, uncapped=False),
                                    delete_on_empty_min_age=0)
            assert (await basin.ensure_stream("s", config=defaults)).status == EnsureStatus.CONFIG_UNCHANGED
            current = await basin.get_stream_config("s")
            assert (await basin.ensure_stream("s", config=current)).status == EnsureStatus.CONFIG_UNCHANGED
            changed = StreamConfig(retention_policy=3600)
            assert (await basin.ensure_stream("s", config=changed)).status == EnsureStatus.CONFIG_UPDATED
            assert (await basin.ensure_stream("s", config=changed)).status == EnsureStatus.CONFIG_UNCHANGED

    run(scenario())


# ---------------------------------------------------------------- get_stream_config / get_basin_config (GET)
def test_get_stream_config_reports_s2_defaults_for_unset_fields(s2_server, basin_name):
    """GET /streams/{stream} answers a StreamConfig with every field filled: the stream's own setting, else its
    basin's default_stream_config, else S2's default (retention 7 days, client-prefer, uncapped false, ...)."""
    create_stream(s2_server, basin_name, "plain")
    status, _, body = h2_request(s2_server.port, "GET", "/v1/streams/plain", {"s2-basin": basin_name})
    assert status == 200 and json.loads(body) == S2_STREAM_DEFAULTS

    async def scenario():
        async with client_for(s2_server) as s2:
            basin = s2.basin(basin_name)
            await s2.reconfigure_basin(basin_name, config=BasinConfig(default_stream_config=StreamConfig(
                retention_policy=3600, timestamping=Timestamping(mode=TimestampingMode.ARRIVAL))))
            await basin.create_stream("from-basin-defaults")
            await basin.create_stream("own", config=StreamConfig(storage_class="standard"))
            got = await basin.get_stream_config("from-basin-defaults")
            assert got.retention_policy == 3600 and got.timestamping.mode == TimestampingMode.ARRIVAL
            assert got.timestamping.uncapped is False and got.delete_on_empty_min_age == 0
            assert got.storage_class == "express"
            own = await basin.get_stream_config("own")
            assert own.storage_class == "standard" and own.retention_policy == 3600

    run(scenario())
    status, _, body = h2_request(s2_server.port, "GET", "/v1/streams/own", {"s2-basin": basin_name})
    assert json.loads(body) == {**S2_STREAM_DEFAULTS, "storage_class": "standard", "retention_policy": {"age": 3600},
                                "timestamping": {"mode": "arrival", "uncapped": False}}


def test_get_basin_config_reports_every_field(s2_server, basin_name):
    """GET /basins/{basin} answers a BasinConfig with all four fields; unset optional ones are null."""
    create_stream(s2_server, basin_name)
    status, _, body = h2_request(s2_server.port, "GET", f"/v1/basins/{basin_name}", {})
    assert status == 200 and json.loads(body) == {"default_stream_config": None, "stream_cipher": None,
                                                  "create_stream_on_append": False, "create_stream_on_read": False}


# ---------------------------------------------------------------- StreamInfo.cipher
def test_stream_info_reports_the_cipher_of_an_encrypted_basin(s2_server, basin_name):
    """StreamInfo.cipher: "Encryption algorithm for this stream, if encryption is enabled" (create_stream,
    ensure_stream and list_streams answer it); a plain stream's is null."""

    async def scenario():
        async with client_for(s2_server) as s2:
            await s2.create_basin(basin_name, config=BasinConfig(stream_cipher=Encryption.AES_256_GCM))
            basin = s2.basin(basin_name)
            assert (await basin.create_stream("a")).cipher == Encryption.AES_256_GCM
            assert (await basin.ensure_stream("b")).stream.cipher == Encryption.AES_256_GCM
            assert (await basin.ensure_stream("a")).stream.cipher == Encryption.AES_256_GCM
            assert [s.cipher for s in (await basin.list_streams()).items] == [Encryption.AES_256_GCM] * 2
            plain = f"{basin_name}-p"
            await s2.create_basin(plain)
            assert (await s2.basin(plain).create_stream("a")).cipher is None
            await s2.delete_basin(plain)

    run(scenario())
    status, _, body = h2_request(s2_server.port, "GET", "/v1/streams", {"s2-basin": basin_name})
    assert status == 200 and {s["cipher"] for s in json.loads(body)["streams"]} == {"aes-256-gcm"}


# ---------------------------------------------------------------- append / read with s2-encryption-key
def test_append_and_read_s2_encryption_key_errors(s2_server, basin_name):
    """The s2-encryption-key header of append and read: a missing or malformed key for an encrypted stream is
    400 bad_header; a key that does not open the records is 400 decryption_failed (S2's ErrorCode)."""
    key, wrong = os.urandom(32), os.urandom(32)

    async def scenario():
        async with _no_retry(s2_server) as s2:
            await s2.create_basin(basin_name, config=BasinConfig(stream_cipher=Encryption.AEGIS_256))
            basin = s2.basin(basin_name)
            await basin.create_stream("s")
            await basin.stream("s", encryption_key=key).append(AppendInput(records=[Record(body=b"secret")]))
            for stream in (basin.stream("s"), basin.stream("s", encryption_key=b"short")):
                with pytest.raises(s2_sdk.S2ServerError) as no_key:
                    await stream.append(AppendInput(records=[Record(body=b"x")]))
                assert (no_key.value.status_code, no_key.value.code) == (400, "bad_header")
                with pytest.raises(s2_sdk.S2ServerError) as no_key_read:
                    await stream.read(start=SeqNum(0))
                assert (no_key_read.value.status_code, no_key_read.value.code) == (400, "bad_header")
            with pytest.raises(s2_sdk.S2ServerError) as bad_key:
                await basin.stream("s", encryption_key=wrong).read(start=SeqNum(0))
            assert (bad_key.value.status_code, bad_key.value.code) == (400, "decryption_failed")
            assert (await basin.stream("s", encryption_key=key).read(start=SeqNum(0))).records[0].body == b"secret"

    run(scenario())


# ---------------------------------------------------------------- read: the `wait` query parameter
@pytest.mark.parametrize("session", [False, True], ids=["unary", "s2s-session"])
def test_read_wait_past_its_published_range_is_bad_query(s2_server, basin_name, session):
    """read's `wait` is {"type": "integer", "format": "int32", "minimum": 0}: a value past that range is refused
    with 400 bad_query (how S2 answers a query parameter it cannot parse) rather than waited out."""
    create_stream(s2_server, basin_name)
    headers = {"s2-basin": basin_name, **({"content-type": "s2s/proto"} if session else {})}
    for wait in (2**31, 2**32, 2**64 - 1):
        try:
            status, _, body = h2_request(s2_server.port, "GET", f"/v1/streams/s/records?seq_num=0&wait={wait}",
                                         headers, timeout=5)
        except TimeoutError:
            pytest.fail(f"wait={wait}: the server waited instead of refusing the parameter")
        assert status == 400 and json.loads(body)["code"] == "bad_query", (wait, status, body)


def test_read_wait_of_a_unary_read_is_capped_not_refused(tmp_path, monkeypatch):
    """read's `wait`: "you can achieve long poll semantics by specifying a non-zero duration up to 60 seconds". A
    unary read asking for longer, within int32, is not refused: it waits for the cap (s2-lite's
    MAX_UNARY_READ_WAIT, 60 s) and answers 200 with an empty batch and the tail. The server's cap is lowered to
    2 s here (SLUICE_S2_MAX_UNARY_WAIT_S) so that the clamp shows without waiting a minute."""
    from sluice.s2local import LocalS2

    monkeypatch.delenv("SLUICE_S2_MAX_UNARY_WAIT_S", raising=False)
    default = subprocess.run([sys.executable, "-c", "from sluice.s2local._records import MAX_UNARY_WAIT_S as cap; "
                              "print(cap)"], capture_output=True, text=True, check=True, timeout=60)
    assert default.stdout.strip() == "60"  # unless told otherwise, the server's cap is S2's
    monkeypatch.setenv("SLUICE_S2_MAX_UNARY_WAIT_S", "2")
    with LocalS2() as server:
        create_stream(server, "wait-cap-basin")
        started = time.monotonic()
        try:
            status, _, body = h2_request(server.port, "GET", f"/v1/streams/s/records?seq_num=0&wait={2**31 - 1}",
                                         {"s2-basin": "wait-cap-basin", "accept": "application/json"}, timeout=30)
        except TimeoutError:
            pytest.fail("the unary read waited past the cap")
        waited = time.monotonic() - started
    assert (status, json.loads(body)) == (200, {"records": [], "tail": {"seq_num": 0, "timestamp": 0}})
    assert 2 <= waited < 30, waited  # it did wait, for the cap and not for what was asked


# ---------------------------------------------------------------- account/basin/stream metrics: start and end
def test_metrics_start_after_end_is_bad_query(s2_server, basin_name):
    """The metrics operations' `start`/`end` bound a time range: a range that ends before it starts is refused
    with 400 and an ErrorInfo (the only error statuses the spec lists for them are 400, 403 and 408)."""
    create_stream(s2_server, basin_name)

    async def scenario():
        async with _no_retry(s2_server) as s2:
            calls = [
                lambda **kw: s2.account_metrics(set=s2_sdk.AccountMetricSet.ACCOUNT_OPS, **kw),
                lambda **kw: s2.basin_metrics(basin_name, set=s2_sdk.BasinMetricSet.APPEND_OPS, **kw),
                lambda **kw: s2.stream_metrics(basin_name, "s", set=s2_sdk.StreamMetricSet.STORAGE, **kw),
            ]
            for call in calls:
                with pytest.raises(s2_sdk.S2ServerError) as backwards:
                    await call(start=2000, end=1000)
                assert (backwards.value.status_code, backwards.value.code) == (400, "bad_query")
                await call(start=1000, end=1000)
                await call(start=1000, end=2000)

    run(scenario())


# ---------------------------------------------------------------- list_locations / get/set_default_location (SDK)
def test_locations_are_the_one_location_basins_report(s2_server, basin_name):
    """s2-sdk's location operations (GET /v1/locations, GET and PUT /v1/locations/default; not in the published
    openapi.json): the server is one location, `local`, which every basin reports as its location."""
    create_stream(s2_server, basin_name)

    async def scenario():
        async with _no_retry(s2_server) as s2:
            listed = await s2.list_locations()
            assert [(loc.name, loc.is_private) for loc in listed] == [("local", True)]
            assert (await s2.get_default_location()).name == "local"
            assert (await s2.set_default_location("local")).name == "local"
            with pytest.raises(s2_sdk.S2ServerError) as unknown:
                await s2.set_default_location("aws:us-east-1")
            assert (unknown.value.status_code, unknown.value.code) == (422, "invalid")
            basins = (await s2.list_basins()).items
            assert {b.location for b in basins if b.name == basin_name} == {"local"}

    run(scenario())


# ---------------------------------------------------------------- reconfigure_basin / reconfigure_stream (PATCH)
def test_reconfigure_with_null_resets_a_field_to_its_default(s2_server, basin_name):
    """PATCH /streams/{stream} and /basins/{basin}: StreamReconfiguration, TimestampingReconfiguration,
    DeleteOnEmptyReconfiguration and BasinReconfiguration make every field nullable. A field sent as null is reset to
    its default, a field left out keeps its value, an empty nested object changes nothing (s2-lite: `Maybe`,
    "`Specified(None)` clears it to the default")."""
    stream_headers = {"s2-basin": basin_name, "content-type": "application/json"}

    def patch(path, headers, body):
        status, _, answer = h2_request(s2_server.port, "PATCH", path, headers, json.dumps(body).encode())
        assert status == 200, answer
        return json.loads(answer)

    basin_config = {"stream_cipher": "aes-256-gcm", "create_stream_on_append": True,
                    "default_stream_config": {"storage_class": "standard", "retention_policy": {"age": 60}}}
    status, _, _ = h2_request(s2_server.port, "POST", "/v1/basins", {"content-type": "application/json"},
                              json.dumps({"basin": basin_name, "config": basin_config}).encode())
    assert status == 201
    stream_config = {"storage_class": "standard", "retention_policy": {"age": 3600},
                     "timestamping": {"mode": "arrival", "uncapped": True}, "delete_on_empty": {"min_age_secs": 60}}
    status, _, _ = h2_request(s2_server.port, "POST", "/v1/streams", stream_headers,
                              json.dumps({"stream": "s", "config": stream_config}).encode())
    assert status == 201
    assert patch("/v1/streams/s", stream_headers, {"delete_on_empty": {}}) == stream_config
    got = patch("/v1/streams/s", stream_headers, {"storage_class": None, "timestamping": {"mode": None}})
    assert got == {**stream_config, "storage_class": "express", "timestamping": {"mode": "client-prefer",
                                                                                  "uncapped": True}}
    got = patch("/v1/streams/s", stream_headers, {"retention_policy": None, "timestamping": None,
                                                  "delete_on_empty": {"min_age_secs": None}})
    assert got == {**S2_STREAM_DEFAULTS, "storage_class": "express"}
    basin_path = f"/v1/basins/{basin_name}"
    json_headers = {"content-type": "application/json"}
    got = patch(basin_path, json_headers, {"default_stream_config": {"storage_class": None}})
    assert got["default_stream_config"] == {"retention_policy": {"age": 60}}
    got = patch(basin_path, json_headers, {"stream_cipher": None, "default_stream_config": None})
    assert got == {"default_stream_config": None, "stream_cipher": None, "create_stream_on_append": True,
                   "create_stream_on_read": False}


def test_the_wire_messages_are_s2s_published_ones_and_the_sdks_read_them_alike():
    """specs/s2/s2.proto: the server's protobuf messages are built from S2's published file (not from an SDK's
    private module), in a pool of their own; every field the SDK's generated messages have, with its number and
    type, is there too, so what one writes the other reads."""
    from s2_sdk._generated.s2.v1 import s2_pb2 as sdk

    from sluice.s2local import _proto

    published = Path(__file__).resolve().parents[3] / "shared" / "specs" / "s2" / "s2.proto"
    assert published.is_file(), f"S2's published s2.proto is expected at {published} (../shared beside the checkout)"
    spec = published.read_text()
    for name in ("StreamPosition", "Header", "AppendRecord", "AppendInput", "AppendAck", "SequencedRecord",
                 "ReadBatch"):
        ours, theirs = getattr(_proto, name).DESCRIPTOR, getattr(sdk, name).DESCRIPTOR
        assert f"message {name} {{" in spec
        assert ours.file.pool is not sdk.DESCRIPTOR.pool, "a pool of its own: both can be imported at once"
        fields = {f.name: (f.number, f.type, f.is_repeated) for f in ours.fields}
        assert fields == {f.name: (f.number, f.type, f.is_repeated) for f in theirs.fields}, name
    record = _proto.AppendRecord(timestamp=5, body=b"x", headers=[_proto.Header(name=b"k", value=b"v")])
    assert sdk.AppendRecord.FromString(record.SerializeToString()) == sdk.AppendRecord(
        timestamp=5, body=b"x", headers=[sdk.Header(name=b"k", value=b"v")])
