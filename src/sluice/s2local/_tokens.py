"""Access tokens as S2 scopes them: resources (basins, streams, token ids) by exact name or prefix, operations
by name or by group (account/basin/stream x read/write), and an expiry.

The token given at start-up is the admin token: everything, forever. Issued tokens are random strings; only
their SHA-256 is kept (in memory and in the server's database), so the data files never hold a usable token.

A token issued with `auto_prefix_streams` (openapi.json AccessTokenInfo.auto_prefix_streams) lives in a namespace:
its stream scope, which must be a prefix, is put in front of every stream name it sends and taken off every stream
name it is sent (`Caller.stream_name` / `Caller.visible_name`).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sluice.s2local._config import check_stream_name
from sluice.s2local._errors import S2Error

# Operation -> (group, read or write). Groups as S2 documents them: account-level operations act on the
# account (basins, tokens), basin-level ones on one basin, stream-level ones on one stream.
OPERATIONS: dict[str, tuple[str, str]] = {
    "list-basins": ("account", "read"), "create-basin": ("account", "write"), "delete-basin": ("account", "write"),
    "list-access-tokens": ("account", "read"), "issue-access-token": ("account", "write"),
    "revoke-access-token": ("account", "write"), "account-metrics": ("account", "read"),
    "list-locations": ("account", "read"), "get-default-location": ("account", "read"),
    "set-default-location": ("account", "write"),
    "get-basin-config": ("basin", "read"), "reconfigure-basin": ("basin", "write"),
    "list-streams": ("basin", "read"), "create-stream": ("basin", "write"), "delete-stream": ("basin", "write"),
    "basin-metrics": ("basin", "read"),
    "get-stream-config": ("stream", "read"), "reconfigure-stream": ("stream", "write"),
    "check-tail": ("stream", "read"), "read": ("stream", "read"), "append": ("stream", "write"),
    "trim": ("stream", "write"), "fence": ("stream", "write"), "stream-metrics": ("stream", "read"),
}
MAX_ID_BYTES = 96


def _digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def _resource_set(value: Any, what: str) -> dict[str, str] | None:
    if value is None:
        return None
    if not isinstance(value, dict) or len(value) != 1 or not isinstance(next(iter(value.values())), str) \
            or next(iter(value)) not in ("exact", "prefix"):
        raise S2Error("invalid", f'scope.{what} must be {{"exact": NAME}} or {{"prefix": PREFIX}}')
    return dict(value)


def _matches(resource_set: dict[str, str] | None, name: str) -> bool:
    if resource_set is None:  # not restricted
        return True
    if "exact" in resource_set:
        return bool(resource_set["exact"]) and name == resource_set["exact"]  # "" matches nothing
    return name.startswith(resource_set["prefix"])


def _parse_time(value: Any) -> datetime | None:
    if value is None:
        return None
    if not isinstance(value, str):
        raise S2Error("invalid", "expires_at must be an RFC 3339 time")
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise S2Error("invalid", f"expires_at {value!r} is not an RFC 3339 time") from None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def _strip(resource_set: dict[str, str] | None, namespace: str) -> dict[str, str] | None:
    """A stream resource set as a namespaced token sees it: relative to its namespace where it lies inside."""
    if not namespace or resource_set is None:
        return resource_set
    (kind, value), = resource_set.items()
    if value.startswith(namespace) and (kind == "prefix" or len(value) > len(namespace)):
        return {kind: value[len(namespace):]}
    return resource_set


@dataclass
class IssuedToken:
    id: str
    scope: dict[str, Any]
    expires_at: datetime | None
    digest: str
    auto_prefix_streams: bool = False

    @classmethod
    def from_request(cls, body: Any, digest: str, ceiling: datetime | None, namespace: str = "") -> IssuedToken:
        """The token an AccessTokenInfo asks for. `namespace` is the issuer's own (auto_prefix_streams). The spec
        prefixes a namespaced token's "stream name arguments"; sluice reads the stream names in the scope of a
        token it issues as such arguments too, and gives a request without a stream scope the whole namespace,
        so that a namespaced token cannot issue one that reaches outside its namespace."""
        if not isinstance(body, dict):
            raise S2Error("invalid", "an access token request is a JSON object (AccessTokenInfo)")
        token_id = body.get("id")
        if not isinstance(token_id, str) or not 1 <= len(token_id.encode()) <= MAX_ID_BYTES or "\x00" in token_id:
            raise S2Error("invalid", f"access token id must be 1-{MAX_ID_BYTES} bytes with no NUL")
        auto_prefix = body.get("auto_prefix_streams")
        if auto_prefix is not None and not isinstance(auto_prefix, bool):
            raise S2Error("invalid", "auto_prefix_streams must be true or false")
        raw = body.get("scope")
        if not isinstance(raw, dict):
            raise S2Error("invalid", "scope must be an object")
        unknown = set(raw) - {"basins", "streams", "access_tokens", "op_groups", "ops"}
        if unknown:
            raise S2Error("invalid", f"unknown scope field(s): {sorted(unknown)}")
        scope: dict[str, Any] = {k: _resource_set(raw.get(k), k) for k in ("basins", "streams", "access_tokens")}
        if auto_prefix and (scope["streams"] is None or "prefix" not in scope["streams"]):
            # S2 answers 422 invalid with this message (s2-sdk-rust tests/account_ops.rs,
            # issue_access_token_with_auto_prefix_streams_but_without_prefix_errors).
            raise S2Error("invalid", "Auto prefixing is only allowed for streams with prefix matching")
        if namespace:
            streams = scope["streams"] or {"prefix": ""}
            (kind, value), = streams.items()
            # An empty exact name matches nothing (ResourceSet.exact) and stays so.
            scope["streams"] = streams if kind == "exact" and not value else {kind: namespace + value}
        ops = raw.get("ops") or []
        if not isinstance(ops, list) or any(not isinstance(op, str) or op not in OPERATIONS for op in ops):
            raise S2Error("invalid", f"scope.ops must be a list of: {', '.join(OPERATIONS)}")
        groups = raw.get("op_groups") or {}
        if not isinstance(groups, dict) or set(groups) - {"account", "basin", "stream"}:
            raise S2Error("invalid", "scope.op_groups has the fields account, basin and stream")
        clean_groups = {}
        for name, perms in groups.items():
            if perms is None:
                continue
            if not isinstance(perms, dict) or set(perms) - {"read", "write"} or \
                    any(not isinstance(v, bool) for v in perms.values()):
                raise S2Error("invalid", f"scope.op_groups.{name} is {{\"read\": bool, \"write\": bool}}")
            clean_groups[name] = {"read": perms.get("read", False), "write": perms.get("write", False)}
        scope.update(ops=sorted(set(ops)), op_groups=clean_groups)
        token = cls(token_id, scope, _parse_time(body.get("expires_at")), digest, bool(auto_prefix))
        if not token.operations():
            raise S2Error("invalid", "the token's scope permits no operation (set ops or op_groups)")
        if ceiling is not None:  # a token issues tokens that expire no later than itself (S2's rule)
            if token.expires_at is None:
                token.expires_at = ceiling
            elif token.expires_at > ceiling:
                raise S2Error("invalid", "expires_at is later than the issuing token's own expiry")
        return token

    def operations(self) -> set[str]:
        allowed = set(self.scope["ops"])
        for op, (group, mode) in OPERATIONS.items():
            if self.scope["op_groups"].get(group, {}).get(mode):
                allowed.add(op)
        return allowed

    @property
    def namespace(self) -> str:
        return self.scope["streams"]["prefix"] if self.auto_prefix_streams else ""

    def info(self, namespace: str = "") -> dict[str, Any]:
        """AccessTokenInfo, its stream scope relative to `namespace` (the namespace of the token asking)."""
        scope = {k: v for k, v in self.scope.items() if v not in (None, [], {})}
        if "streams" in scope:
            scope["streams"] = _strip(scope["streams"], namespace)
        return {"id": self.id, "scope": scope, "auto_prefix_streams": self.auto_prefix_streams,
                "expires_at": self.expires_at.isoformat().replace("+00:00", "Z") if self.expires_at else None}

    def to_json(self) -> str:
        return json.dumps({**self.info(), "digest": self.digest})

    @classmethod
    def from_json(cls, text: str) -> IssuedToken:
        data = json.loads(text)
        return cls(data["id"], {"basins": None, "streams": None, "access_tokens": None, "ops": [],
                                "op_groups": {}, **data["scope"]}, _parse_time(data["expires_at"]), data["digest"],
                   bool(data.get("auto_prefix_streams")))


@dataclass(frozen=True)
class Caller:
    """Who sent a request: the admin (start-up token, or any token on a server without one), or an issued token."""

    token: IssuedToken | None = None

    @property
    def expires_at(self) -> datetime | None:
        return self.token.expires_at if self.token else None

    @property
    def namespace(self) -> str:
        """The stream-name prefix of an auto_prefix_streams token ("" for any other caller)."""
        return self.token.namespace if self.token else ""

    def stream_name(self, name: str) -> str:
        """The stream a name argument of this caller means: in its namespace, if it has one."""
        namespace = self.namespace
        if not namespace:
            return name
        check_stream_name(name)  # the argument itself is a StreamNameStr, before any prefixing
        return namespace + name

    def visible_name(self, name: str) -> str:
        """A stream name as this caller is shown it: without its namespace."""
        namespace = self.namespace
        return name[len(namespace):] if namespace and name.startswith(namespace) else name

    def authorize(self, op: str, *, basin: str | None = None, stream: str | None = None,
                  token_id: str | None = None) -> None:
        """403 permission_denied unless the token's scope allows `op` on these resources."""
        if self.token is None:
            return
        scope = self.token.scope
        denied = None
        if op not in self.token.operations():
            denied = f"operation {op!r}"
        elif basin is not None and not _matches(scope["basins"], basin):
            denied = f"basin {basin!r}"
        elif stream is not None and not _matches(scope["streams"], stream):
            denied = f"stream {stream!r}"
        elif token_id is not None and not _matches(scope["access_tokens"], token_id):
            denied = f"access token {token_id!r}"
        if denied:
            raise S2Error("permission_denied", f"access token {self.token.id!r} is not allowed {denied} ({op})")

    def may_see(self, kind: str, name: str) -> bool:
        return self.token is None or _matches(self.token.scope[kind], name)


class TokenRegistry:
    """Issued tokens by digest; `authenticate` turns an Authorization header into a Caller."""

    def __init__(self, admin_token: str | None, stored: list[str]) -> None:
        self.admin_token = admin_token
        self.tokens: dict[str, IssuedToken] = {}  # by id
        for text in stored:
            token = IssuedToken.from_json(text)
            self.tokens[token.id] = token
        self._by_digest = {t.digest: t for t in self.tokens.values()}

    def authenticate(self, header: str | None) -> Caller:
        given = header or ""
        bearer = given[7:] if given.startswith("Bearer ") else None
        if bearer is not None:
            issued = self._by_digest.get(_digest(bearer))
            if issued is not None:
                if issued.expires_at is not None and issued.expires_at <= datetime.now(UTC):
                    raise S2Error("unauthorized", f"access token {issued.id!r} has expired")
                return Caller(issued)
        if self.admin_token is None:
            return Caller()
        if not hmac.compare_digest(given.encode(), f"Bearer {self.admin_token}".encode()):
            # Never echo what was sent: it may be a real token.
            raise S2Error("unauthorized", "missing or wrong access token (authorization: Bearer ...)")
        return Caller()

    def issue(self, body: Any, caller: Caller) -> tuple[IssuedToken, str]:
        secret = "s2l_" + secrets.token_urlsafe(32)
        token = IssuedToken.from_request(body, _digest(secret), caller.expires_at, caller.namespace)
        caller.authorize("issue-access-token", token_id=token.id)
        if token.id in self.tokens:
            raise S2Error("resource_already_exists", f"access token {token.id!r} already exists")
        return token, secret

    def add(self, token: IssuedToken) -> None:
        self.tokens[token.id] = token
        self._by_digest[token.digest] = token

    def remove(self, token_id: str) -> IssuedToken:
        token = self.tokens.pop(token_id, None)
        if token is None:
            raise S2Error("access_token_not_found", f"access token {token_id!r} not found")
        self._by_digest.pop(token.digest, None)
        return token

    def page(self, caller: Caller, prefix: str, start_after: str, limit: int) -> tuple[list[IssuedToken], bool]:
        ids = sorted(i for i in self.tokens if i.startswith(prefix) and i > start_after
                     and caller.may_see("access_tokens", i))
        return [self.tokens[i] for i in ids[:limit]], len(ids) > limit
