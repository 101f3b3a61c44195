"""Raw HTTP/2 (h2c prior knowledge) and HTTP/1.1 requests, for exact status codes and bodies."""

from __future__ import annotations

import http.client
import json
import socket

import h2.config
import h2.connection
import h2.events


def h2_request(port: int, method: str, path: str, headers: dict[str, str] | None = None,
               body: bytes = b"", timeout: float = 10.0) -> tuple[int, dict[str, str], bytes]:
    sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    conn.initiate_connection()
    sock.sendall(conn.data_to_send())
    stream_id = conn.get_next_available_stream_id()
    hdrs = [(":method", method), (":path", path), (":scheme", "http"), (":authority", f"127.0.0.1:{port}")]
    hdrs += list((headers or {}).items())
    conn.send_headers(stream_id, hdrs, end_stream=not body)
    if body:
        # Respect flow control: send in windows.
        sent = 0
        while sent < len(body):
            window = conn.local_flow_control_window(stream_id)
            chunk = body[sent:sent + min(window, conn.max_outbound_frame_size)]
            if not chunk:
                sock.sendall(conn.data_to_send())
                _pump(sock, conn, stream_id, {}, bytearray())
                continue
            conn.send_data(stream_id, chunk, end_stream=sent + len(chunk) == len(body))
            sent += len(chunk)
            sock.sendall(conn.data_to_send())
    sock.sendall(conn.data_to_send())
    status_headers: dict[str, str] = {}
    data = bytearray()
    while not _pump(sock, conn, stream_id, status_headers, data):
        pass
    sock.close()
    return int(status_headers[":status"]), status_headers, bytes(data)


def _pump(sock, conn, stream_id, headers, data) -> bool:
    chunk = sock.recv(65536)
    if not chunk:
        return True
    done = False
    for event in conn.receive_data(chunk):
        if isinstance(event, h2.events.ResponseReceived):
            headers.update({k.decode(): v.decode() for k, v in event.headers})
        elif isinstance(event, h2.events.DataReceived) and event.stream_id == stream_id:
            data.extend(event.data)
            conn.acknowledge_received_data(event.flow_controlled_length, stream_id)
        elif isinstance(event, (h2.events.StreamEnded, h2.events.StreamReset)) and event.stream_id == stream_id:
            done = True
    sock.sendall(conn.data_to_send())
    return done


def h1_request(port: int, method: str, path: str, headers: dict[str, str] | None = None,
               body: bytes | None = None) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    conn.request(method, path, body=body, headers=headers or {})
    response = conn.getresponse()
    out = response.status, response.read()
    conn.close()
    return out


def json_body(data: bytes):
    return json.loads(data)
