"""The errors of the schema registry's client (_registry.py), one class per kind of refusal, each with the HTTP status
and Confluent's `error_code` (as Confluent's Schema Registry API reference lists them under Errors)."""

from __future__ import annotations

from typing import Any

from sluice._errors import SluiceError


class RegistryError(SluiceError):
    """A request the schema registry refused or could not answer. `status` is the HTTP status (None: no answer),
    `error_code` Confluent's (40401 ...), `url` the registry's (without credentials)."""

    def __init__(self, message: str, *, url: str, status: int | None = None, error_code: int | None = None,
                 subject: str | None = None, schema_id: int | None = None) -> None:
        super().__init__(message)
        self.url, self.status, self.error_code = url, status, error_code
        self.subject, self.schema_id = subject, schema_id


class RegistryUnreachable(RegistryError):
    """No answer (connection refused, timed out) or a 5xx until the timeout."""


class RegistryTlsError(RegistryError):
    """The registry's certificate was refused (not signed by the CA given, or not for its host)."""


class RegistryUnauthorized(RegistryError):
    """401 (credentials missing or refused) or 403 (not allowed)."""


class SubjectNotFound(RegistryError):
    """40401: no such subject."""


class VersionNotFound(RegistryError):
    """40402: the subject has no such version."""


class SchemaNotFound(RegistryError):
    """40403: no schema with that id, or the schema is not registered under the subject."""


class IncompatibleSchema(RegistryError):
    """409: the schema breaks the subject's compatibility level; `reason` is the registry's, `level` the subject's
    level (from register(): read once the registry refused)."""

    def __init__(self, message: str, *, reason: str, level: str | None = None, **where: Any) -> None:
        super().__init__(message, **where)
        self.reason, self.level = reason, level


class InvalidSchema(RegistryError):
    """42201 (or another 422): the schema text does not parse, or its type is unknown."""
