"""A TCP proxy on loopback that can stall or cut the connections through it: the network between Spark and a store,
under a test's control (the soak's network faults).

    with TcpProxy(target_port=pg.port) as proxy:    # connect to proxy.port instead of pg.port
        proxy.stall(3.0)                             # every byte either way waits 3 s (connections stay open)
        proxy.cut()                                  # every connection through it is reset now

One thread accepts; each connection is two pump threads (one a direction). A stall holds the pumps before they
forward their next chunk; a cut closes both sockets of every open connection (the peers see a reset or EOF).
"""

from __future__ import annotations

import contextlib
import socket
import threading
from types import TracebackType


class TcpProxy:
    def __init__(self, target_port: int, target_host: str = "127.0.0.1", port: int = 0) -> None:
        self.target = (target_host, target_port)
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", port))
        self._listener.listen(256)
        self.port: int = self._listener.getsockname()[1]
        self._lock = threading.Lock()
        self._pairs: set[tuple[socket.socket, socket.socket]] = set()
        self._open = threading.Event()  # cleared while stalled
        self._open.set()
        self._closed = threading.Event()
        self.connections = 0  # accepted so far
        self._thread = threading.Thread(target=self._accept, name="sluice-proxy-accept", daemon=True)

    def start(self) -> TcpProxy:
        self._thread.start()
        return self

    def stall(self, seconds: float) -> None:
        """Hold every byte in both directions for `seconds`, or until the proxy closes (blocks the caller as long)."""
        self._open.clear()
        try:
            self._closed.wait(seconds)
        finally:
            self._open.set()

    def cut(self) -> int:
        """Reset every connection open through the proxy; returns how many."""
        with self._lock:
            pairs, self._pairs = self._pairs, set()
        for pair in pairs:
            for sock in pair:
                # A reset to each peer (linger 0), and shutdown first: a close alone neither wakes the pump blocked
                # in recv on the socket nor, while that recv holds it, reaches the peer, which would then wait
                # forever on a connection nobody forwards.
                with contextlib.suppress(OSError):
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
        return len(pairs)

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(self.target, timeout=10)
                upstream.settimeout(None)
            except OSError:
                client.close()  # the store is down: the client sees its connection end, as it would without us
                continue
            pair = (client, upstream)
            with self._lock:
                self._pairs.add(pair)
                self.connections += 1
            for source, sink in (pair, pair[::-1]):
                threading.Thread(target=self._pump, args=(source, sink, pair), daemon=True,
                                 name="sluice-proxy-pump").start()

    def _pump(self, source: socket.socket, sink: socket.socket, pair: tuple[socket.socket, socket.socket]) -> None:
        try:
            while True:
                data = source.recv(65536)
                if not data:
                    break
                self._open.wait()
                sink.sendall(data)
        except OSError:
            pass
        finally:
            with self._lock:
                self._pairs.discard(pair)
            for sock in pair:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
                with contextlib.suppress(OSError):
                    sock.close()

    def close(self) -> None:
        self._closed.set()
        with contextlib.suppress(OSError):
            self._listener.close()
        self.cut()

    def __enter__(self) -> TcpProxy:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()
