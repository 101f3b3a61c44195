"""S2-style errors: an HTTP status and a JSON body the official SDK understands."""

from __future__ import annotations

import json
from typing import Any

# Status per code, as in S2's API (api/src/v1/error.rs).
STATUS = {
    "bad_frame": 400, "bad_header": 400, "bad_json": 400, "bad_path": 400, "bad_proto": 400, "bad_query": 400,
    "decryption_failed": 400,
    "invalid": 422, "basin_not_found": 404, "stream_not_found": 404, "access_token_not_found": 404,
    "resource_already_exists": 409, "basin_deletion_pending": 409, "stream_deletion_pending": 409,
    "transaction_conflict": 409, "permission_denied": 403, "rate_limited": 429, "unavailable": 503,
    "storage": 500, "other": 500, "timeout": 408, "unauthorized": 401, "not_implemented": 501,
    "payload_too_large": 413,
}


class S2Error(Exception):
    def __init__(self, code: str, message: str, status: int | None = None, body: dict[str, Any] | None = None):
        super().__init__(message)
        self.code = code
        self.message = message
        self.status = status or STATUS[code]
        self._body = body

    def body(self) -> bytes:
        body = self._body if self._body is not None else {"code": self.code, "message": self.message}
        return json.dumps(body).encode()


def seq_num_mismatch(expected: int) -> S2Error:
    return S2Error("append_condition_failed", f"seq num mismatch, next is {expected}", 412,
                   {"seq_num_mismatch": expected})


def fencing_token_mismatch(current: str) -> S2Error:
    return S2Error("append_condition_failed", "fencing token mismatch", 412, {"fencing_token_mismatch": current})


def unwritten(tail_seq: int, tail_ts: int) -> S2Error:
    return S2Error("range_not_satisfiable", "read from beyond the tail", 416,
                   {"tail": {"seq_num": tail_seq, "timestamp": tail_ts}})
