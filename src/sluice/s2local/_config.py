"""S2's names, limits and configs as the local server checks and reports them (openapi.json's BasinConfig,
StreamConfig and their defaults)."""

from __future__ import annotations

import json
import re
import time
from datetime import UTC, datetime
from typing import Any

from sluice.s2local._errors import S2Error

MIB = 1024 * 1024
MAX_BATCH_RECORDS = 1000
MAX_FENCING_TOKEN_BYTES = 36
_BASIN_NAME = re.compile(r"^[a-z0-9]([a-z0-9-]{6,46})[a-z0-9]$")
TIMESTAMPING_MODES = ("client-prefer", "client-require", "arrival")


def now_ms() -> int:
    return int(time.time() * 1000)


def rfc3339_now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def check_basin_name(name: str) -> None:
    if not _BASIN_NAME.match(name):
        raise S2Error("invalid", f"basin name {name!r}: 8-48 characters of a-z, 0-9 and '-', "
                                 "not starting or ending with '-'")


def check_stream_name(name: str) -> None:
    raw = name.encode()
    if not 1 <= len(raw) <= 512 or name in (".", "..") or "\x00" in name:
        raise S2Error("invalid", "stream name must be 1-512 bytes, not '.' or '..', and contain no NUL")


def set_fields(config: Any, what: str, known: set[str]) -> dict[str, Any]:
    """The fields a config object sets (nulls mean unset), after checking it is an object of known fields."""
    if not isinstance(config, dict):
        raise S2Error("invalid", f"{what} must be a JSON object")
    unknown = set(config) - known
    if unknown:
        raise S2Error("invalid", f"unknown {what} field(s): {sorted(unknown)}")
    return {k: v for k, v in config.items() if v is not None}


U64_MAX = 2**64 - 1
STORAGE_CLASSES = ("standard", "express")


def check_uint(value: Any, what: str, minimum: int = 0) -> int:
    """A JSON whole number in [minimum, 2^64) (JSON booleans are not numbers here)."""
    if isinstance(value, bool) or not isinstance(value, int) or not minimum <= value <= U64_MAX:
        raise S2Error("invalid", f"{what} must be a whole number from {minimum} to {U64_MAX}, got {value!r}")
    return value


def _retention(value: Any) -> dict[str, Any]:
    if not isinstance(value, dict) or len(value) != 1 or not ({"age", "infinite"} & set(value)):
        raise S2Error("invalid", 'retention_policy must be {"age": SECONDS} or {"infinite": {}}')
    if "age" in value:
        return {"age": check_uint(value["age"], "retention_policy.age", minimum=1)}  # S2 refuses an age of 0
    if value["infinite"] not in ({}, None):
        raise S2Error("invalid", 'retention_policy.infinite must be {}')
    return {"infinite": {}}


# What S2 reports (and applies) for a stream config field that neither the stream nor its basin's
# default_stream_config sets (openapi.json StreamConfig.retention_policy: "If unspecified, the default is to retain
# records for 7 days"; TimestampingConfig.uncapped: "false or not set"; DeleteOnEmptyConfig.min_age_secs: "0
# (default)"; the SDK's Timestamping.mode: "Defaults to CLIENT_PREFER"). The spec leaves the storage class to the
# basin's location; express is s2-lite's default (common/src/config.rs StorageClass).
STREAM_DEFAULTS: dict[str, Any] = {
    "storage_class": "express",
    "retention_policy": {"age": 7 * 24 * 3600},
    "timestamping": {"mode": "client-prefer", "uncapped": False},
    "delete_on_empty": {"min_age_secs": 0},
}


def effective_stream_config(config: dict[str, Any]) -> dict[str, Any]:
    """A stream's config as S2 answers get_stream_config: every field present, S2's default where unset."""
    out = json.loads(json.dumps(STREAM_DEFAULTS))
    for key, value in config.items():
        if key == "timestamping":
            out[key].update({k: v for k, v in (value or {}).items() if v is not None})
        elif value is not None:
            out[key] = value
    return out


def basin_config_view(config: dict[str, Any]) -> dict[str, Any]:
    """A basin's config as S2 answers get_basin_config (openapi.json BasinConfig): every field present, the
    create-on-append/read flags false by default; default_stream_config holds only the fields the basin sets
    (null when none), since streams fill the rest from S2's defaults when they are created."""
    default = dict(config.get("default_stream_config") or {})
    if not any(v is not None for v in (default.get("timestamping") or {}).values()):
        default.pop("timestamping", None)
    return {"default_stream_config": default or None, "stream_cipher": config.get("stream_cipher"),
            "create_stream_on_append": bool(config.get("create_stream_on_append")),
            "create_stream_on_read": bool(config.get("create_stream_on_read"))}


def cleared_fields(config: Any, known: set[str]) -> set[str]:
    """The fields a reconfiguration sets to null. StreamReconfiguration, TimestampingReconfiguration,
    DeleteOnEmptyReconfiguration and BasinReconfiguration make their fields nullable: null resets a field to its
    default, absent leaves it as it is (s2-lite's `Maybe`: "`Specified(None)` clears it to the default")."""
    return {key for key, value in config.items() if value is None and key in known} if isinstance(config, dict) \
        else set()


def normalize_stream_config(config: dict[str, Any] | None, base: dict[str, Any] | None = None, *,
                            reconfigure: bool = False) -> dict[str, Any]:
    """Validate a StreamConfig JSON object as S2 does, filling unset fields from `base`; as a StreamReconfiguration
    (`reconfigure`) a null field is reset to its default."""
    out = dict(base or {})
    if config is None:
        return out
    known = {"storage_class", "retention_policy", "timestamping", "delete_on_empty"}
    fields = set_fields(config, "stream config", known)
    for key in cleared_fields(config, known) if reconfigure else ():
        out.pop(key, None)
    for key, value in fields.items():
        if key == "timestamping":
            merged = dict(out.get("timestamping") or {})
            for sub in cleared_fields(value, {"mode", "uncapped"}) if reconfigure else ():
                merged.pop(sub, None)
            merged.update(set_fields(value, "timestamping", {"mode", "uncapped"}))
            if merged.get("mode") is not None and merged["mode"] not in TIMESTAMPING_MODES:
                raise S2Error("invalid", f"timestamping.mode must be one of {', '.join(TIMESTAMPING_MODES)}")
            if not isinstance(merged.get("uncapped", False), bool):
                raise S2Error("invalid", "timestamping.uncapped must be true or false")
            out["timestamping"] = merged
        elif key == "storage_class":
            if value not in STORAGE_CLASSES:
                raise S2Error("invalid", f"storage_class must be one of {', '.join(STORAGE_CLASSES)}")
            out[key] = value
        elif key == "retention_policy":
            out[key] = _retention(value)
        else:  # delete_on_empty
            doe = set_fields(value, "delete_on_empty", {"min_age_secs"})
            if reconfigure and "min_age_secs" not in doe:
                if cleared_fields(value, {"min_age_secs"}):
                    out.pop(key, None)
                continue  # {} changes nothing
            out[key] = {"min_age_secs": check_uint(doe.get("min_age_secs", 0), "delete_on_empty.min_age_secs")}
    return out
