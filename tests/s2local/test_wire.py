"""Raw HTTP/2 and HTTP/1.1: exact error bodies, s2s framing, malformed and oversize input, auth."""

import base64
import contextlib
import json
import os
import socket
import struct
import subprocess
import sys
import time

import pytest
import s2_sdk
from s2_sdk._generated.s2.v1 import s2_pb2 as pb

from sluice.s2local import LocalS2
from tests.s2local.conftest import client_for, create_stream, run
from tests.s2local.raw import h1_request, h2_request

PROTO = {"content-type": "application/x-protobuf", "accept": "application/x-protobuf"}


def frames(data: bytes) -> list[tuple[int, bytes]]:
    out = []
    while data:
        length = int.from_bytes(data[:3], "big")
        out.append((data[3], data[4:3 + length]))
        data = data[3 + length:]
    return out


def frame(body: bytes, flag: int = 0) -> bytes:
    return struct.pack(">I", len(body) + 1)[1:] + bytes([flag]) + body


def append_input(n: int, **conditions) -> bytes:
    inp = pb.AppendInput(records=[pb.AppendRecord(body=b"r%d" % i) for i in range(n)], **conditions)
    return inp.SerializeToString()


@pytest.fixture
def stream_headers(s2_server, basin_name):
    create_stream(s2_server, basin_name)
    return {"s2-basin": basin_name}


def test_exact_412_and_416_bodies(s2_server, stream_headers):
    path = "/v1/streams/s/records"
    assert h2_request(s2_server.port, "POST", path, {**stream_headers, **PROTO}, append_input(2))[0] == 200
    status, _, body = h2_request(s2_server.port, "POST", path, {**stream_headers, **PROTO},
                                 append_input(1, match_seq_num=7))
    assert status == 412 and json.loads(body) == {"seq_num_mismatch": 2}
    status, _, body = h2_request(s2_server.port, "POST", path, {**stream_headers, **PROTO},
                                 append_input(1, fencing_token="nope"))
    assert status == 412 and json.loads(body) == {"fencing_token_mismatch": ""}
    status, _, body = h2_request(s2_server.port, "GET", path + "?seq_num=9", stream_headers)
    tail = json.loads(body)["tail"]
    assert status == 416 and tail["seq_num"] == 2 and tail["timestamp"] > 0


def test_http1_and_json_with_base64_format(s2_server, stream_headers):
    status, body = h1_request(s2_server.port, "GET", "/v1/basins")
    assert status == 200 and "basins" in json.loads(body)
    payload = {"records": [{"body": base64.b64encode(b"\x00\xffbin").decode(),
                            "headers": [[base64.b64encode(b"k").decode(), base64.b64encode(b"v").decode()]]}]}
    headers = {**stream_headers, "content-type": "application/json", "s2-format": "base64"}
    status, body = h1_request(s2_server.port, "POST", "/v1/streams/s/records", headers, json.dumps(payload).encode())
    assert status == 200 and json.loads(body)["end"]["seq_num"] == 1
    status, body = h1_request(s2_server.port, "GET", "/v1/streams/s/records?seq_num=0",
                              {**stream_headers, "accept": "application/json", "s2-format": "base64"})
    record = json.loads(body)["records"][0]
    assert base64.b64decode(record["body"]) == b"\x00\xffbin"
    assert [base64.b64decode(x) for x in record["headers"][0]] == [b"k", b"v"]


def test_append_session_over_raw_h2_acks_each_frame_in_order(s2_server, stream_headers):
    body = b"".join(frame(append_input(3)) for _ in range(4))
    status, headers, data = h2_request(s2_server.port, "POST", "/v1/streams/s/records",
                                       {**stream_headers, "content-type": "s2s/proto"}, body)
    assert status == 200 and headers["content-type"] == "s2s/proto"
    acks = []
    for flag, ack_body in frames(data):
        assert flag == 0
        ack = pb.AppendAck()
        ack.ParseFromString(ack_body)
        acks.append((ack.start.seq_num, ack.end.seq_num))
    assert acks == [(0, 3), (3, 6), (6, 9), (9, 12)]


def test_malformed_frames_get_a_terminal_error_frame(s2_server, stream_headers):
    headers = {**stream_headers, "content-type": "s2s/proto"}
    for body, code in [(b"\xff\xff\xff\x00" + b"x" * 10, "bad_frame"),  # length over the bound
                       (frame(b"\x0a\x05garbage-not-proto"), "bad_proto"),
                       (frame(b"", flag=0x80), "bad_frame")]:  # clients may not send terminal frames
        status, _, data = h2_request(s2_server.port, "POST", "/v1/streams/s/records", headers, body)
        assert status == 200
        flag, terminal = frames(data)[-1]
        assert flag & 0x80, "expected a terminal frame"
        assert int.from_bytes(terminal[:2], "big") == 400 and json.loads(terminal[2:])["code"] == code


def test_read_session_frames_and_heartbeats_over_raw_h2():
    os.environ["SLUICE_S2_HEARTBEAT_S"] = "0.3"
    try:
        with LocalS2() as server:
            async def create():
                async with client_for(server) as s2:
                    await s2.create_basin("heartbeats")
                    stream = s2.basin("heartbeats")
                    await stream.create_stream("s")
                    await stream.stream("s").append(s2_sdk.AppendInput(records=[s2_sdk.Record(body=b"a")]))

            run(create())
            started = time.monotonic()
            status, _, data = h2_request(server.port, "GET", "/v1/streams/s/records?seq_num=0&wait=2",
                                         {"s2-basin": "heartbeats", "content-type": "s2s/proto"})
            elapsed = time.monotonic() - started
    finally:
        del os.environ["SLUICE_S2_HEARTBEAT_S"]
    assert status == 200 and 1.8 < elapsed < 10  # wait=2: the session ends 2 s after the last record
    batches = []
    for flag, body in frames(data):
        assert flag == 0
        batch = pb.ReadBatch()
        batch.ParseFromString(body)
        batches.append(batch)
    assert [r.body for r in batches[0].records] == [b"a"] and batches[0].tail.seq_num == 1
    heartbeats = [b for b in batches[1:] if not b.records and b.HasField("tail")]
    assert len(heartbeats) >= 3 and all(b.tail.seq_num == 1 for b in heartbeats)


def test_limits_and_bad_bodies(s2_server, stream_headers):
    path = "/v1/streams/s/records"
    status, _, body = h2_request(s2_server.port, "POST", path, {**stream_headers, **PROTO}, append_input(1001))
    assert status == 422 and "1 to 1000 records" in json.loads(body)["message"]
    huge = pb.AppendInput(records=[pb.AppendRecord(body=b"x" * (1024 * 1024))]).SerializeToString()
    status, _, body = h2_request(s2_server.port, "POST", path, {**stream_headers, **PROTO}, huge)
    assert status == 422 and "limit is 1048576" in json.loads(body)["message"]
    status, _, body = h2_request(s2_server.port, "POST", path, {**stream_headers, **PROTO}, b"x" * (5 * 1024 * 1024))
    assert status == 413
    status, _, body = h2_request(s2_server.port, "POST", path, {**stream_headers, **PROTO}, b"\xff\xff\xff")
    assert status == 400 and json.loads(body)["code"] == "bad_proto"
    status, _, body = h2_request(s2_server.port, "POST", "/v1/basins", {"content-type": "application/json"}, b"{nope")
    assert status == 400 and json.loads(body)["code"] == "bad_json"
    status, _, body = h2_request(s2_server.port, "GET", "/v1/streams")
    assert status == 400 and json.loads(body)["code"] == "bad_header"
    status, _, body = h2_request(s2_server.port, "GET", path + "?seq_num=abc", stream_headers)
    assert status == 400 and json.loads(body)["code"] == "bad_query"


def test_garbage_on_the_wire_never_kills_the_server(s2_server):
    for junk in [b"\x00" * 100, b"GARBAGE / HTTP/9.9\r\n\r\n", b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\xff" * 64]:
        with socket.create_connection(("127.0.0.1", s2_server.port), timeout=5) as sock:
            sock.sendall(junk)
            with contextlib.suppress(ConnectionResetError, TimeoutError):
                sock.recv(4096)  # an error response or a closed connection, never a hang
    assert h1_request(s2_server.port, "GET", "/v1/basins")[0] == 200


def test_token_protects_every_request_and_is_never_echoed():
    with LocalS2(token="s3cret-token") as server:
        async def scenario(token):
            async with s2_sdk.S2(token, endpoints=server.endpoints) as s2:
                return [b.name async for b in s2.list_all_basins()]

        assert run(scenario("s3cret-token")) == []
        with pytest.raises(s2_sdk.S2ServerError) as wrong:
            run(scenario("wrong-token"))
        assert wrong.value.status_code == 401 and "wrong-token" not in str(wrong.value)
        status, body = h1_request(server.port, "GET", "/v1/basins")
        assert status == 401 and b"s3cret" not in body
        ps = subprocess.run(["ps", "-ww", "-o", "args=", "-p", str(server.process.pid)], capture_output=True, text=True)
        assert "s3cret" not in ps.stdout  # passed through the environment, not argv


def test_cli_serve_and_the_non_loopback_warning(tmp_path):
    proc = subprocess.Popen([sys.executable, "-m", "sluice.cli", "s2", "serve", "--host", "0.0.0.0", "--port", "0",
                             "--in-memory"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        assert "sluice s2 server listening on http://0.0.0.0:" in line and "in memory" in line
    finally:
        proc.terminate()
        _, err = proc.communicate(10)
    assert "WARNING: serving S2 on 0.0.0.0 without --token" in err
