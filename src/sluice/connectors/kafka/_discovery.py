"""Which partitions a Kafka read covers (FLIP-27's Kafka source calls these subscribers): the enumerator lists the
cluster's topics and their partition counts, and a discovery picks the partitions, each a split. `TopicList` (option
subscribe) and `TopicPattern` (subscribePattern) pick every partition of their topics, so partitions added to a topic
are picked up at the next listing; `PartitionList` (assign) picks the partitions named. Another kind of discovery
implements `pick` (and `required`)."""

from __future__ import annotations

import re
from abc import ABC, abstractmethod
from collections.abc import Collection, Mapping

from sluice.connector import OptionError


class TopicDiscovery(ABC):
    def pick(self, listed: Mapping[str, int]) -> list[tuple[str, int]]:
        """The (topic, partition)s to read of those the cluster has now (`listed`: topic -> partition count);
        every partition of the topics `topics` picks, unless overridden."""
        return [(t, p) for t in self.topics_of(listed) for p in range(listed[t])]

    @abstractmethod
    def topics_of(self, listed: Collection[str]) -> list[str]:
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

    def topics_of(self, listed: Collection[str]) -> list[str]:
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

    def topics_of(self, listed: Collection[str]) -> list[str]:
        return sorted(t for t in listed if not t.startswith("__") and self._regex.fullmatch(t))

    def describe(self) -> str:
        return f"/{self.pattern}/"


class PartitionList(TopicDiscovery):
    """The partitions named, and no others (partitions added later are not read)."""

    def __init__(self, partitions: Mapping[str, Collection[int]]) -> None:
        self.partitions = {topic: sorted(set(ps)) for topic, ps in partitions.items()}

    def pick(self, listed: Mapping[str, int]) -> list[tuple[str, int]]:
        missing = [f"{t}:{p}" for t, ps in self.partitions.items() if t in listed for p in ps if p >= listed[t]]
        if missing:  # partitions are never removed: a partition beyond the count was never there
            raise OptionError(f"assign names partition(s) {missing} that do not exist (check the partition counts)")
        return [(t, p) for t, ps in self.partitions.items() if t in listed for p in ps]

    def topics_of(self, listed: Collection[str]) -> list[str]:
        return [t for t in self.partitions if t in listed]

    def required(self) -> set[str]:
        return set(self.partitions)

    def describe(self) -> str:
        return ",".join(f"{t}:{p}" for t, ps in self.partitions.items() for p in ps)
