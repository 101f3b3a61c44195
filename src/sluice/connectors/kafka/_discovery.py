"""Which topics a Kafka read covers (FLIP-27's Kafka source calls these subscribers): the enumerator lists the
cluster's topics and partitions, and a discovery picks the topics; every partition of a picked topic is a split, so
partitions added to a topic are picked up at the next listing. Pluggable: `TopicList` (option subscribe) and
`TopicPattern` (subscribePattern); another kind of discovery implements `pick` (and `required`)."""

from __future__ import annotations

import re
from abc import ABC, abstractmethod
from collections.abc import Collection


class TopicDiscovery(ABC):
    @abstractmethod
    def pick(self, listed: Collection[str]) -> list[str]:
        """The topics to read of those the cluster has now."""

    def required(self) -> set[str]:
        """Topics that must exist when the read starts (missing ones are the user's mistake, named)."""
        return set()

    @abstractmethod
    def describe(self) -> str:
        """What is read, for metrics and messages."""


class TopicList(TopicDiscovery):
    """The topics named, each with all its partitions."""

    def __init__(self, topics: Collection[str]) -> None:
        self.topics = tuple(topics)

    def pick(self, listed: Collection[str]) -> list[str]:
        return [t for t in self.topics if t in listed]

    def required(self) -> set[str]:
        return set(self.topics)

    def describe(self) -> str:
        return ",".join(self.topics)


class TopicPattern(TopicDiscovery):
    """Every topic whose whole name matches a regular expression, those created later too; Kafka's internal topics
    (__consumer_offsets, __transaction_state, ...) never."""

    def __init__(self, pattern: str) -> None:
        self.pattern = pattern
        self._regex = re.compile(pattern)

    def pick(self, listed: Collection[str]) -> list[str]:
        return sorted(t for t in listed if not t.startswith("__") and self._regex.fullmatch(t))

    def describe(self) -> str:
        return f"/{self.pattern}/"
