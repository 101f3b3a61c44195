"""Where the table store's tables live: a local folder or an S3 prefix, and what it takes to reach it.

A `Warehouse` is resolved once on the driver (from the `warehouse` and `storage.*` options, else the usual
`AWS_*` environment variables) and travels inside the write plan and the read partitions, so executors on other
machines reach the same store with the same settings instead of their own working directory or environment.
Executors write and read Parquet files through a pyarrow filesystem; the driver commits through deltalake.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sluice.connector import OptionError

DEFAULT_WAREHOUSE = Path(".sluice") / "warehouse"
SUPPORTED = "a local path, file:///path or s3://bucket/prefix"

# storage.* option -> (deltalake storage option, environment variable read on the driver when it is not set)
_S3_SETTINGS = {
    "storage.endpoint": ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL"),
    "storage.region": ("AWS_REGION", "AWS_REGION"),
    "storage.access-key-id": ("AWS_ACCESS_KEY_ID", "AWS_ACCESS_KEY_ID"),
    "storage.secret-access-key": ("AWS_SECRET_ACCESS_KEY", "AWS_SECRET_ACCESS_KEY"),
    "storage.session-token": ("AWS_SESSION_TOKEN", "AWS_SESSION_TOKEN"),
}


@dataclass(frozen=True)
class Warehouse:
    """A warehouse root (`/abs/folder` or `s3://bucket/prefix`) and its deltalake storage options.

    The options may hold credentials: they are never part of repr() (Spark logs plans and partitions).
    """

    root: str
    storage: tuple[tuple[str, str], ...] = field(default=(), repr=False)

    @classmethod
    def resolve(cls, warehouse: str | Warehouse | None = None, options: Mapping[str, Any] | None = None) -> Warehouse:
        """The warehouse a user named; relative paths become absolute here, on the driver."""
        if isinstance(warehouse, Warehouse):
            return warehouse
        options = options or {}
        raw = warehouse or os.environ.get("SLUICE_WAREHOUSE") or str(DEFAULT_WAREHOUSE)
        scheme, sep, rest = raw.partition("://")
        scheme = scheme.lower() if sep else ""
        given = [k for k in _S3_SETTINGS if options.get(k) is not None] + \
            (["storage.allow-http"] if options.get("storage.allow-http") is not None else [])
        if scheme in ("", "file"):
            if given:
                raise OptionError(f"option '{given[0]}' is for an s3:// warehouse; warehouse {raw!r} is a local "
                                  "folder")
            return cls(str(Path(rest if sep else raw).absolute()))
        if scheme in ("s3", "s3a"):
            bucket = rest.split("/", 1)[0]
            if not bucket:
                raise OptionError(f"warehouse {raw!r} names no bucket: use s3://bucket/prefix")
            return cls("s3://" + rest.rstrip("/"), _s3_storage(options))
        # Never a local folder named 'gs:' or 's3:' - the files would land on one machine's disk, not in the store.
        raise OptionError(f"warehouse {raw!r}: {scheme}:// is not supported by the table store; use {SUPPORTED}")

    @property
    def is_local(self) -> bool:
        return not self.root.startswith("s3://")

    def table_uri(self, name: str) -> str:
        return f"{self.root}/{name}"

    def storage_options(self) -> dict[str, str] | None:
        """For deltalake (None: its defaults, as for a local folder). deltalake needs a region; S3-compatible servers
        ignore it. pyarrow gets none unless one was given: it finds the bucket's own."""
        if self.is_local:
            return None
        return {"AWS_REGION": "us-east-1", **dict(self.storage)}

    def filesystem(self) -> Any:
        """A pyarrow filesystem reaching this warehouse (built where it is used: executors build their own)."""
        from pyarrow import fs

        if self.is_local:
            return fs.LocalFileSystem()
        settings = dict(self.storage)
        endpoint = settings.get("AWS_ENDPOINT_URL")
        scheme = None
        if endpoint:
            scheme, _, endpoint = endpoint.rpartition("://")
        return fs.S3FileSystem(access_key=settings.get("AWS_ACCESS_KEY_ID"),
                               secret_key=settings.get("AWS_SECRET_ACCESS_KEY"),
                               session_token=settings.get("AWS_SESSION_TOKEN"), region=settings.get("AWS_REGION"),
                               endpoint_override=endpoint or None, scheme=scheme or None)

    def path(self, uri: str) -> str:
        """A URI or path inside this warehouse as the pyarrow filesystem names it."""
        if uri.startswith("file://"):
            return uri.removeprefix("file://")
        if uri.startswith(("s3://", "s3a://")):
            return uri.split("://", 1)[1]
        return uri


def _s3_storage(options: Mapping[str, Any]) -> tuple[tuple[str, str], ...]:
    settings: dict[str, str] = {}
    for option, (key, env) in _S3_SETTINGS.items():
        value = options.get(option)
        if value is None and env in os.environ:
            value = os.environ[env]
        if value is None and key == "AWS_REGION" and "AWS_DEFAULT_REGION" in os.environ:
            value = os.environ["AWS_DEFAULT_REGION"]
        if value is not None:
            settings[key] = str(value)
    if ("AWS_ACCESS_KEY_ID" in settings) != ("AWS_SECRET_ACCESS_KEY" in settings):
        have, missing = (("storage.access-key-id", "storage.secret-access-key") if "AWS_ACCESS_KEY_ID" in settings
                         else ("storage.secret-access-key", "storage.access-key-id"))
        raise OptionError(f"{have} is set but {missing} is not (nor its AWS_* environment variable); set both, or "
                          "neither to use the machine's default AWS credentials")
    endpoint = settings.get("AWS_ENDPOINT_URL")
    if endpoint and "://" not in endpoint:
        raise OptionError(f"storage.endpoint {endpoint!r} needs its scheme: http://host:port or https://host")
    allow_http = options.get("storage.allow-http")
    if allow_http is None:
        allow_http = endpoint is not None and endpoint.lower().startswith("http://")
    if endpoint and endpoint.lower().startswith("http://") and not allow_http:
        raise OptionError(f"storage.endpoint {endpoint!r} is plain http but storage.allow-http is false")
    if allow_http:
        settings["AWS_ALLOW_HTTP"] = "true"
    return tuple(sorted(settings.items()))
