"""A client of Confluent's Schema Registry API (Confluent's own server, Apicurio's `/apis/ccompat/v7`, Redpanda's):
schemas by id, a subject's versions, registering and looking up, compatibility levels. Over urllib3, one connection
pool per process and CA.

`schema_by_id` is cached per process, keyed by (registry URL, id): a schema id names one schema for good in a
registry, so the tasks of one Python worker fetch each id once, and a registry that restarts or becomes unreachable
does not stop a read whose ids are already known. `register` and `lookup` results are cached the same way, keyed by
the subject and the schema. A registry that does not answer is tried again until `timeout_s` has passed.

Errors are RegistryError's subclasses, with the HTTP status and Confluent's `error_code`; each names the registry's
URL (never its credentials), the subject or id, and what to do.
"""

from __future__ import annotations

import base64
import json
import ssl
import threading
import time
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote, unquote, urlsplit, urlunsplit

from sluice._errors import OptionError
from sluice.formats._codec import RegisteredSchema, SchemaReference, SchemaType
from sluice.formats._registry_errors import (
    IncompatibleSchema,
    InvalidSchema,
    RegistryError,
    RegistryTlsError,
    RegistryUnauthorized,
    RegistryUnreachable,
    SchemaNotFound,
    SubjectNotFound,
    VersionNotFound,
)

__all__ = ["COMPATIBILITY_LEVELS", "SCHEMA_TYPES", "IncompatibleSchema", "InvalidSchema", "RegistryClient",
           "RegistryError", "RegistrySettings", "RegistryTlsError", "RegistryUnauthorized", "RegistryUnreachable",
           "SchemaNotFound", "SubjectNotFound", "VersionNotFound", "forget_cached_schemas"]

SCHEMA_TYPES: tuple[SchemaType, ...] = ("AVRO", "PROTOBUF", "JSON")
COMPATIBILITY_LEVELS = ("NONE", "BACKWARD", "BACKWARD_TRANSITIVE", "FORWARD", "FORWARD_TRANSITIVE", "FULL",
                        "FULL_TRANSITIVE")
CONTENT_TYPE = "application/vnd.schemaregistry.v1+json"


@dataclass(frozen=True)
class RegistrySettings:
    """Where the registry is and how to reach it; pickled to the tasks. `url` is the API's root (for Apicurio,
    `http://host:8080/apis/ccompat/v7`); user-info in it (`https://user:password@host/...`) moves to `user_info`.
    `user_info` is HTTP basic authentication's `user:password` (Confluent's `basic.auth.user.info`), `bearer_token`
    a token sent as `Authorization: Bearer` (one of the two); `ca_pem` the PEM text of the CA that signed the
    registry's certificate (default: the system's CAs). Neither secret appears in repr() or in any error."""

    url: str
    user_info: str | None = field(default=None, repr=False)
    bearer_token: str | None = field(default=None, repr=False)
    ca_pem: str | None = field(default=None, repr=False)
    timeout_s: float = 30.0

    def __post_init__(self) -> None:
        parts = urlsplit(self.url.strip())
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise OptionError(f"the schema registry's URL {_without_user_info(self.url)!r} is not an HTTP endpoint: "
                              "write http://host:8081 or https://... (for Apicurio, .../apis/ccompat/v7)")
        if parts.query or parts.fragment:
            raise OptionError(f"the schema registry's URL {_without_user_info(self.url)!r} must not carry a query "
                              "string or fragment")
        user_info = self.user_info
        if parts.username is not None:
            if user_info is not None:
                raise OptionError(f"the schema registry's URL {_without_user_info(self.url)!r} carries a user and "
                                  "so do the settings' user-info: keep one")
            user_info = f"{unquote(parts.username)}:{unquote(parts.password or '')}"
        if user_info is not None and ":" not in user_info:
            raise OptionError("the schema registry's user-info must be 'user:password'")
        if user_info is not None and self.bearer_token is not None:
            raise OptionError("the schema registry's user-info and bearer token both authenticate: keep one")
        if self.timeout_s <= 0:
            raise OptionError(f"the schema registry's timeout must be above 0 s, not {self.timeout_s}")
        object.__setattr__(self, "url", _without_user_info(self.url.strip()).rstrip("/"))
        object.__setattr__(self, "user_info", user_info)

    def __repr__(self) -> str:
        auth = ("basic (user-info hidden)" if self.user_info is not None else
                "bearer (token hidden)" if self.bearer_token is not None else "none")
        return (f"RegistrySettings(url={self.url!r}, auth={auth}, ca_pem={'given' if self.ca_pem else 'system'}, "
                f"timeout_s={self.timeout_s})")

    def scrub(self, text: str) -> str:
        """`text` without this setting's secrets (an exception's text may quote a header)."""
        for secret in (self.user_info, self.user_info and self.user_info.split(":", 1)[1], self.bearer_token,
                       self.user_info and base64.b64encode(self.user_info.encode()).decode()):
            if secret:
                text = text.replace(secret, "<hidden>")
        return text

    def headers(self) -> dict[str, str]:
        headers = {"Content-Type": CONTENT_TYPE, "Accept": f"{CONTENT_TYPE}, application/json"}
        if self.user_info is not None:
            headers["Authorization"] = "Basic " + base64.b64encode(self.user_info.encode()).decode()
        elif self.bearer_token is not None:
            headers["Authorization"] = f"Bearer {self.bearer_token}"
        return headers


def _without_user_info(url: str) -> str:
    parts = urlsplit(url)
    if parts.username is None and parts.password is None:
        return url
    host = parts.netloc.rsplit("@", 1)[1]
    return urlunsplit((parts.scheme, host, parts.path, parts.query, parts.fragment))


_POOLS: dict[str | None, Any] = {}
_LOCK = threading.Lock()
_BY_ID: dict[tuple[str, int], RegisteredSchema] = {}
_BY_SUBJECT_SCHEMA: dict[tuple[str, str, str, str, tuple[SchemaReference, ...]], RegisteredSchema] = {}


def _pool(ca_pem: str | None) -> Any:
    """One connection pool per process and CA (the tasks of one Python worker share it)."""
    with _LOCK:
        pool = _POOLS.get(ca_pem)
        if pool is None:
            import urllib3

            context = ssl.create_default_context(cadata=ca_pem) if ca_pem else ssl.create_default_context()
            pool = _POOLS[ca_pem] = urllib3.PoolManager(maxsize=8, block=False, ssl_context=context)
        return pool


def forget_cached_schemas() -> None:
    """Empty this process's caches (tests of the cache)."""
    with _LOCK:
        _BY_ID.clear()
        _BY_SUBJECT_SCHEMA.clear()


def _references(value: Any) -> tuple[SchemaReference, ...]:
    return tuple(SchemaReference(str(r["name"]), str(r["subject"]), int(r["version"])) for r in value or ())


def _schema_type(value: Any) -> SchemaType:
    kind = str(value or "AVRO").upper()  # Confluent's API leaves schemaType out for Avro
    for known in SCHEMA_TYPES:
        if kind == known:
            return known
    raise ValueError(f"a {kind} schema: sluice's formats read {', '.join(SCHEMA_TYPES)}")


class RegistryClient:
    """Confluent's Schema Registry API at `settings.url`. Cheap to make (the pools and caches are the process's)."""

    def __init__(self, settings: RegistrySettings) -> None:
        self.settings = settings

    @property
    def url(self) -> str:
        return self.settings.url

    # -- reads ------------------------------------------------------------------------------------------------------

    def schema_by_id(self, schema_id: int) -> RegisteredSchema:
        """The schema with this global id (GET /schemas/ids/{id}), from this process's cache once fetched."""
        key = (self.url, schema_id)
        cached = _BY_ID.get(key)
        if cached is not None:
            return cached
        body = self._request("GET", f"/schemas/ids/{int(schema_id)}", schema_id=schema_id)
        try:
            schema = RegisteredSchema(schema_id, _schema_type(body.get("schemaType")), str(body["schema"]),
                                      _references(body.get("references")))
        except (KeyError, TypeError, ValueError) as e:
            raise self._unexpected(f"schema id {schema_id}", body, e) from None
        with _LOCK:
            _BY_ID[key] = schema
        return schema

    def latest(self, subject: str) -> RegisteredSchema:
        """The subject's latest version (GET /subjects/{s}/versions/latest); never cached (it moves)."""
        return self._version(subject, "latest")

    def version(self, subject: str, version: int) -> RegisteredSchema:
        """Version `version` of the subject (GET /subjects/{s}/versions/{n})."""
        return self._version(subject, str(int(version)))

    def _version(self, subject: str, version: str) -> RegisteredSchema:
        body = self._request("GET", f"/subjects/{quote(subject, safe='')}/versions/{version}", subject=subject)
        return self._registered(body, subject)

    def _registered(self, body: dict[str, Any], subject: str,
                    schema_type: SchemaType | None = None) -> RegisteredSchema:
        """`schema_type`: what the caller sent (Apicurio's lookup answer leaves schemaType out for every type)."""
        try:
            kind = _schema_type(body.get("schemaType") or schema_type)
            schema = RegisteredSchema(int(body["id"]), kind, str(body["schema"]),
                                      _references(body.get("references")), str(body.get("subject", subject)),
                                      int(body["version"]) if body.get("version") is not None else None)
        except (KeyError, TypeError, ValueError) as e:
            raise self._unexpected(f"subject '{subject}'", body, e) from None
        with _LOCK:  # what the id names, for readers in this process
            _BY_ID.setdefault((self.url, schema.schema_id),
                              RegisteredSchema(schema.schema_id, schema.schema_type, schema.text, schema.references))
        return schema

    def compatibility(self, subject: str) -> str:
        """The subject's compatibility level, or the registry's default when the subject has none
        (GET /config/{s}?defaultToGlobal=true)."""
        body = self._request("GET", f"/config/{quote(subject, safe='')}?defaultToGlobal=true", subject=subject)
        return str(body.get("compatibilityLevel") or body.get("compatibility"))

    # -- writes -----------------------------------------------------------------------------------------------------

    def register(self, subject: str, schema_type: SchemaType, text: str,
                 references: tuple[SchemaReference, ...] = ()) -> RegisteredSchema:
        """Register the schema under the subject (POST /subjects/{s}/versions), or find it there already; its id
        (`version` is left None: the API does not return it). IncompatibleSchema when the subject's compatibility
        level refuses it, InvalidSchema when it does not parse."""
        key = (self.url, subject, schema_type, text, tuple(references))
        cached = _BY_SUBJECT_SCHEMA.get(key)
        if cached is not None:
            return cached
        try:
            body = self._request("POST", f"/subjects/{quote(subject, safe='')}/versions",
                                 self._schema_body(schema_type, text, references), subject=subject)
        except IncompatibleSchema as e:
            raise self._incompatible(e, subject, schema_type) from None
        try:
            schema = RegisteredSchema(int(body["id"]), schema_type, text, tuple(references), subject)
        except (KeyError, TypeError, ValueError) as e:
            raise self._unexpected(f"subject '{subject}'", body, e) from None
        with _LOCK:
            _BY_SUBJECT_SCHEMA.setdefault(key, schema)
            _BY_ID.setdefault((self.url, schema.schema_id),
                              RegisteredSchema(schema.schema_id, schema_type, text, tuple(references)))
        return schema

    def lookup(self, subject: str, schema_type: SchemaType, text: str,
               references: tuple[SchemaReference, ...] = ()) -> RegisteredSchema:
        """The version of the subject that is this schema (POST /subjects/{s}), with its id and version.
        SchemaNotFound (40403) when the subject holds no such schema, SubjectNotFound (40401) when there is no
        subject."""
        key = (self.url, subject, schema_type, text, tuple(references))
        cached = _BY_SUBJECT_SCHEMA.get(key)
        if cached is not None and cached.version is not None:
            return cached
        body = self._request("POST", f"/subjects/{quote(subject, safe='')}",
                             self._schema_body(schema_type, text, references), subject=subject, looking_up=True)
        schema = self._registered(body, subject, schema_type)
        with _LOCK:
            _BY_SUBJECT_SCHEMA[key] = schema
        return schema

    def set_compatibility(self, subject: str, level: str) -> None:
        """Set the subject's compatibility level (PUT /config/{s}): one of COMPATIBILITY_LEVELS."""
        if level.upper() not in COMPATIBILITY_LEVELS:
            raise OptionError(f"compatibility level {level!r} is not one of {', '.join(COMPATIBILITY_LEVELS)}")
        self._request("PUT", f"/config/{quote(subject, safe='')}", {"compatibility": level.upper()}, subject=subject)

    @staticmethod
    def _schema_body(schema_type: SchemaType, text: str, references: tuple[SchemaReference, ...]) -> dict[str, Any]:
        body: dict[str, Any] = {"schema": text, "schemaType": _schema_type(schema_type)}
        if references:
            body["references"] = [{"name": r.name, "subject": r.subject, "version": r.version} for r in references]
        return body

    def _unexpected(self, what: str, body: Any, error: Exception) -> RegistryError:
        """An answer that is not what Confluent's API gives (a field missing, a type sluice does not read)."""
        return RegistryError(f"the schema registry at {self.url} answered for {what} with what sluice cannot use "
                             f"({type(error).__name__}: {error}; the answer: {self.settings.scrub(str(body))[:300]}). "
                             "Check that the URL is the root of Confluent's API (Apicurio's ends in /apis/ccompat/v7).",
                             url=self.url)

    def _incompatible(self, error: IncompatibleSchema, subject: str, schema_type: SchemaType) -> IncompatibleSchema:
        """The 409 named with the subject's compatibility level (asked for once the registry refused)."""
        try:
            level = self.compatibility(subject)
        except RegistryError as e:  # said in the message: the refusal is what matters
            level = f"<its level, which could not be read: {e}>"
        return IncompatibleSchema(
            f"the schema registry at {self.url} refused the {schema_type} schema for subject '{subject}' as "
            f"incompatible under {level} ({error.status}, error_code {error.error_code}): {error.reason}. Make the "
            f"schema compatible with the subject's latest version under {level}, or change the subject's "
            "compatibility level (PUT /config/{subject}).",
            reason=error.reason, level=level, url=self.url, status=error.status, error_code=error.error_code,
            subject=subject)

    # -- HTTP -------------------------------------------------------------------------------------------------------

    def _request(self, method: str, path: str, body: Any = None, *, subject: str | None = None,
                 schema_id: int | None = None, looking_up: bool = False) -> dict[str, Any]:
        """One API call; its JSON answer. Retries an unreachable registry (and 502/503/504) until the timeout."""
        settings = self.settings
        data = json.dumps(body).encode() if body is not None else None
        deadline = time.monotonic() + settings.timeout_s
        pause = 0.1
        while True:
            left = deadline - time.monotonic()
            try:
                response = _pool(settings.ca_pem).request(
                    method, settings.url + path, body=data, headers=settings.headers(),
                    timeout=max(left, 0.05), retries=False)
            except Exception as e:  # urllib3's connection, TLS and timeout errors
                said = settings.scrub(str(e))
                if "CERTIFICATE_VERIFY_FAILED" in said or "SSLError" in type(e).__name__ + said:
                    raise RegistryTlsError(
                        f"TLS: the schema registry at {settings.url} presented a certificate that was refused "
                        f"({said}). Give the PEM text of the CA that signed it (ca_pem), and reach it by a name its "
                        "certificate lists.", url=settings.url, subject=subject, schema_id=schema_id) from None
                last = said
            else:
                if response.status not in (502, 503, 504):
                    return self._answer(method, path, response.status, response.data, subject, schema_id,
                                        looking_up)
                last = f"{response.status}: {settings.scrub(response.data.decode(errors='replace')[:300])}"
            if time.monotonic() + pause >= deadline:
                what = (f" (schema id {schema_id})" if schema_id is not None else
                        f" (subject '{subject}')" if subject is not None else "")
                raise RegistryUnreachable(
                    f"the schema registry at {settings.url} did not answer {method} {path.split('?')[0]}{what} within "
                    f"{settings.timeout_s:g} s (last: {last}). Check that it runs and that this machine reaches it.",
                    url=settings.url, subject=subject, schema_id=schema_id)
            time.sleep(pause)
            pause = min(pause * 2, 1.0)

    def _answer(self, method: str, path: str, status: int, raw: bytes, subject: str | None, schema_id: int | None,
                looking_up: bool) -> dict[str, Any]:
        settings = self.settings
        try:
            parsed = json.loads(raw) if raw else {}
        except ValueError:
            parsed = {"message": raw.decode(errors="replace")[:300]}
        if status < 300:
            return parsed if isinstance(parsed, dict) else {"value": parsed}
        code = parsed.get("error_code") if isinstance(parsed, dict) else None
        code = int(code) if isinstance(code, int | str) and str(code).isdigit() else None
        reason = settings.scrub(str(parsed.get("message") if isinstance(parsed, dict) else parsed)).rstrip(". ")
        url = settings.url
        where: dict[str, Any] = dict(url=url, status=status, error_code=code, subject=subject, schema_id=schema_id)
        named = f"({status}, error_code {code})" if code is not None else f"({status})"
        if status == 401:
            who = ("the user-info's credentials" if settings.user_info is not None else
                   "the bearer token" if settings.bearer_token is not None else "a request without credentials")
            raise RegistryUnauthorized(f"the schema registry at {url} refused {who} {named}: give credentials it "
                                       "accepts (user-info 'user:password', or a bearer token).", **where)
        if status == 403:
            raise RegistryUnauthorized(f"the schema registry at {url} forbids {method} {path.split('?')[0]} to "
                                       f"these credentials {named}: {reason}. Grant the user the role it needs.",
                                       **where)
        if status == 404 and code is None:
            raise RegistryError(f"the schema registry at {url} answered {method} {path.split('?')[0]} with 404 and no "
                                "Confluent error_code: the URL is not the root of Confluent's Schema Registry API "
                                "(Apicurio serves it at /apis/ccompat/v7).", **where)
        if code == 40401:
            raise SubjectNotFound(f"subject '{subject}' is not in the schema registry at {url} {named}. Check the "
                                  "topic and the subject name strategy (topic, record, topic-record), or register a "
                                  "schema under it first.", **where)
        if code == 40402:
            raise VersionNotFound(f"subject '{subject}' of the schema registry at {url} has no such version "
                                  f"{named}: {reason}. List its versions (GET /subjects/{{subject}}/versions).",
                                  **where)
        if code == 40403:
            if looking_up:
                raise SchemaNotFound(f"the schema is not registered under subject '{subject}' in the schema "
                                     f"registry at {url} {named}. Register it first, or let the writer register "
                                     "it.", **where)
            raise SchemaNotFound(f"schema id {schema_id} is not in the schema registry at {url} {named}. The record "
                                 "was written through another registry, or the schema was deleted: read with the "
                                 "registry its producer used.", **where)
        if status == 409:
            raise IncompatibleSchema(f"the schema registry at {url} refused the schema for subject '{subject}' as "
                                     f"incompatible {named}: {reason}", reason=reason, **where)
        if status == 422:
            raise InvalidSchema(f"the schema registry at {url} refused the schema for subject '{subject}' as invalid "
                                f"{named}: {reason}. Fix the schema text (or its schemaType).", **where)
        raise RegistryError(f"the schema registry at {url}: {method} {path.split('?')[0]} failed {named}: {reason}",
                            **where)
