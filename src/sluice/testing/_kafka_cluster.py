"""`LocalKafkaCluster`: several `KafkaNode`s of one KRaft quorum (sluice/testing/_kafka.py), for fault tests that
kill a broker while the others go on."""

from __future__ import annotations

import threading
from types import TracebackType
from typing import Any, Self

from sluice.testing._kafka import KafkaNode, _Clients, _Quorum


class LocalKafkaCluster(_Clients):
    """Context manager: `brokers` nodes, each broker and controller, one KRaft quorum of them all; topics default to
    replication factor 3 and `min.insync.replicas=2` (so does the transaction state log). `.brokers[i]` is a node
    with `kill()`, `start()`, `stop(keep_data=True)`; with three, one may be down and writes with acks=all go on."""

    def __init__(self, brokers: int = 3, heap_mb: int = 384, *, start_timeout: float = 120,
                 **broker_config: Any) -> None:
        if brokers < 3:
            raise ValueError(f"a cluster needs 3 brokers or more (replication factor 3), not {brokers}")
        quorum = _Quorum(brokers)
        self.brokers = [KafkaNode(quorum, node, heap_mb=heap_mb, start_timeout=start_timeout,
                                  broker_config=broker_config) for node in range(1, brokers + 1)]

    @property
    def bootstrap_servers(self) -> str:
        return ",".join(b.bootstrap_servers for b in self.brokers)

    def _addresses(self) -> list[str]:
        return [b.bootstrap_servers for b in self.brokers if b.pid is not None]

    def start(self) -> Self:
        """Start every node at once (each waits for the quorum, which needs most of them up)."""
        errors: list[BaseException] = []

        def start(node: KafkaNode) -> None:
            try:
                node.start()
            except BaseException as e:
                errors.append(e)

        threads = [threading.Thread(target=start, args=(b,)) for b in self.brokers]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if errors:
            self.stop()
            raise errors[0]
        return self

    def stop(self) -> None:
        """Kill every node and delete their folders."""
        for b in self.brokers:
            b.stop()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 traceback: TracebackType | None) -> None:
        self.stop()
