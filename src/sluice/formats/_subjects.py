"""Subject name strategies: under which registry subject a topic's key or value schema is kept, as Confluent's
serializers name them (io.confluent.kafka.serializers.subject.TopicNameStrategy, RecordNameStrategy,
TopicRecordNameStrategy)."""

from __future__ import annotations

from typing import Literal

from sluice._errors import OptionError

SubjectNameStrategy = Literal["topic", "record", "topic-record"]
SUBJECT_NAME_STRATEGIES: tuple[SubjectNameStrategy, ...] = ("topic", "record", "topic-record")


def subject_name(strategy: str, topic: str, *, is_key: bool, record_name: str | None = None) -> str:
    """The subject: `topic` gives `<topic>-key` or `<topic>-value` (Confluent's default); `record` the record's full
    name (Avro's namespace.name, Protobuf's package.Message, JSON Schema's title), the same subject for every topic
    that carries it; `topic-record` `<topic>-<full name>`."""
    if strategy == "topic":
        return f"{topic}-{'key' if is_key else 'value'}"
    if strategy not in SUBJECT_NAME_STRATEGIES:
        raise OptionError(f"subject name strategy {strategy!r} is not one of {', '.join(SUBJECT_NAME_STRATEGIES)}")
    if not record_name:
        raise OptionError(f"the subject name strategy {strategy!r} names the subject by the record's full name, and "
                          "the schema has none: give the record a name (Avro's name and namespace, Protobuf's "
                          "message, JSON Schema's title), or use the strategy 'topic'")
    return record_name if strategy == "record" else f"{topic}-{record_name}"
