"""A refused S2 record as its dead letter's row (S2Store.refused_rows): its stream, body, headers and timestamp."""

from __future__ import annotations

import base64
from typing import Any

# Of a body over S2's record limit, what its dead letter keeps: the whole body would be over the limit of an S2 (or
# Kafka) dead-letter target too, and fail the write the dead letter was meant to let go on.
LETTER_BODY_BYTES = 64 * 1024


def _text(raw: bytes) -> object:
    try:
        return raw.decode()
    except UnicodeDecodeError:
        return {"base64": base64.b64encode(raw).decode()}


def letter(stream: str | None, record: Any) -> dict[str, object]:
    body = bytes(record.body)
    row: dict[str, object] = {"stream": stream, "body_bytes": len(body)}
    if len(body) > LETTER_BODY_BYTES:
        cut = body[:LETTER_BODY_BYTES]
        # A UTF-8 body cut inside a character stays text: drop the partial character's bytes.
        text = cut.decode(errors="ignore") if _is_text(body[:LETTER_BODY_BYTES + 4]) else None
        row["body"] = text if text is not None else _text(cut)
        row["body_truncated"] = True
    else:
        row["body"] = _text(body)
    headers = [[_text(bytes(name)), _text(bytes(value))] for name, value in (record.headers or ())]
    if headers:
        row["headers"] = headers
    if record.timestamp is not None:
        row["timestamp"] = record.timestamp
    return row


def _is_text(prefix: bytes) -> bool:
    """Whether a body starts as UTF-8 (its prefix decodes, up to a character cut at the end)."""
    try:
        prefix.decode()
    except UnicodeDecodeError as e:
        return e.start >= len(prefix) - 4
    return True
