"""The schema registry's client against a real registry (Apicurio Registry's Confluent API): registering and reading
back each schema type, a compatibility level's refusal, errors by Confluent's error_code, secrets kept out of errors,
the per-process id cache across a stopped registry, HTTP basic authentication and TLS with a CA as PEM text."""

import json
from concurrent.futures import ThreadPoolExecutor

import pytest

from sluice._errors import OptionError
from sluice.formats._registry import (
    IncompatibleSchema,
    RegistryClient,
    RegistryError,
    RegistrySettings,
    RegistryTlsError,
    RegistryUnauthorized,
    RegistryUnreachable,
    SchemaNotFound,
    SubjectNotFound,
    forget_cached_schemas,
)
from sluice.formats._subjects import subject_name
from sluice.testing import LocalSchemaRegistry
from sluice.testing._postgres import free_port
from sluice.testing._tls import TestCA


def avro(*fields: str) -> str:
    return json.dumps({"type": "record", "name": "Order", "namespace": "shop",
                       "fields": [{"name": f, "type": "long"} for f in fields]})


SCHEMAS = {
    "AVRO": avro("id"),
    "PROTOBUF": 'syntax = "proto3";\npackage shop;\n\nmessage Order {\n  int64 id = 1;\n  string note = 2;\n}\n',
    "JSON": json.dumps({"$schema": "http://json-schema.org/draft-07/schema#", "title": "Order", "type": "object",
                        "properties": {"id": {"type": "integer"}}}),
}


def same_text(kind, got, sent):
    """Apicurio gives Avro back compacted; the other types as sent."""
    return json.loads(got) == json.loads(sent) if kind == "AVRO" else got == sent


@pytest.mark.parametrize("kind", sorted(SCHEMAS))
def test_register_then_read_back_by_id_subject_and_lookup(client, new_subject, kind):
    subject = new_subject()
    registered = client.register(subject, kind, SCHEMAS[kind])
    assert (registered.subject, registered.schema_type) == (subject, kind)
    forget_cached_schemas()  # by id from the registry, not from what register() cached
    by_id = client.schema_by_id(registered.schema_id)
    assert by_id.schema_type == kind and same_text(kind, by_id.text, SCHEMAS[kind])
    latest = client.latest(subject)
    assert (latest.schema_id, latest.version, latest.schema_type) == (registered.schema_id, 1, kind)
    found = client.lookup(subject, kind, SCHEMAS[kind])
    assert (found.schema_id, found.version, found.schema_type) == (registered.schema_id, 1, kind)
    assert client.version(subject, 1).schema_id == registered.schema_id


def test_backward_refuses_an_incompatible_avro_schema_and_none_takes_it(client, new_subject):
    subject = new_subject()
    client.register(subject, "AVRO", avro("id"))
    client.set_compatibility(subject, "BACKWARD")
    added_without_default = avro("id", "total")  # a BACKWARD reader cannot read v1's records: no default for total
    with pytest.raises(IncompatibleSchema) as refused:
        client.register(subject, "AVRO", added_without_default)
    error = refused.value
    assert (error.status, error.level, error.subject) == (409, "BACKWARD", subject)
    assert "refused the AVRO schema" in str(error) and "as incompatible under BACKWARD" in str(error)
    assert client.url in str(error) and error.reason in str(error)
    assert client.latest(subject).version == 1

    client.set_compatibility(subject, "NONE")  # negative control: the same schema, the rule off
    taken = client.register(subject, "AVRO", added_without_default)
    assert client.latest(subject).schema_id == taken.schema_id and client.latest(subject).version == 2


def test_unknown_id_and_unknown_subject_are_named_with_their_error_codes(client, new_subject):
    known = client.register(new_subject(), "AVRO", avro("id", "n"))
    unknown_id = known.schema_id + 1000
    with pytest.raises(SchemaNotFound) as no_schema:
        client.schema_by_id(unknown_id)
    assert (no_schema.value.status, no_schema.value.error_code) == (404, 40403)
    assert f"schema id {unknown_id}" in str(no_schema.value) and client.url in str(no_schema.value)

    missing = new_subject("missing")
    with pytest.raises(SubjectNotFound) as no_subject:
        client.latest(missing)
    assert (no_subject.value.status, no_subject.value.error_code) == (404, 40401)
    assert f"subject '{missing}'" in str(no_subject.value) and "subject name strategy" in str(no_subject.value)

    with pytest.raises(SchemaNotFound) as not_under:  # lookup: the subject exists, the schema is not in it
        client.lookup(known.subject, "AVRO", avro("other"))
    assert not_under.value.error_code == 40403 and "not registered under subject" in str(not_under.value)


def test_a_url_that_is_not_confluents_api_is_named(registry, client, new_subject):
    known = client.register(new_subject(), "AVRO", avro("id", "r"))
    forget_cached_schemas()
    with pytest.raises(RegistryError) as wrong_root:  # Apicurio's root, without /apis/ccompat/v7
        RegistryClient(RegistrySettings(registry.url, timeout_s=5)).schema_by_id(known.schema_id)
    assert not isinstance(wrong_root.value, SchemaNotFound) and wrong_root.value.status == 404
    assert "not the root of Confluent's Schema Registry API" in str(wrong_root.value)


@pytest.mark.parametrize("auth", ["user-info", "bearer"])
def test_an_unreachable_registry_is_named_without_its_secrets(auth):
    port = free_port()  # nothing listens there
    secret = "s3cret-Pa55"
    if auth == "user-info":
        settings = RegistrySettings(f"http://alice:{secret}@127.0.0.1:{port}/apis/ccompat/v7", timeout_s=0.5)
        assert settings.user_info == f"alice:{secret}"  # negative control: the secret is in the settings
    else:
        settings = RegistrySettings(f"http://127.0.0.1:{port}/apis/ccompat/v7", bearer_token=secret, timeout_s=0.5)
    assert secret in settings.headers()["Authorization"] or auth == "user-info"
    assert settings.url == f"http://127.0.0.1:{port}/apis/ccompat/v7"
    assert secret not in repr(settings) and secret not in str(settings)
    with pytest.raises(RegistryUnreachable) as unreachable:
        RegistryClient(settings).schema_by_id(1)
    text = str(unreachable.value)
    assert settings.url in text and "schema id 1" in text and "did not answer" in text
    assert secret not in text and secret not in repr(unreachable.value)


def test_settings_refuse_what_they_cannot_use():
    with pytest.raises(OptionError, match="keep one"):
        RegistrySettings("http://a:b@127.0.0.1:1", bearer_token="t")
    with pytest.raises(OptionError, match="not an HTTP endpoint"):
        RegistrySettings("ftp://user:pw@127.0.0.1:1")
    with pytest.raises(OptionError) as error:
        RegistrySettings("ftp://user:pw@127.0.0.1:1")
    assert "pw" not in str(error.value)


def test_a_stopped_registry_known_ids_from_the_cache_new_ones_waited_for(registry, client, new_subject):
    fetched = client.register(new_subject(), "AVRO", avro("id", "a"))
    never_fetched = client.register(new_subject(), "AVRO", avro("id", "b"))
    forget_cached_schemas()
    client.schema_by_id(fetched.schema_id)
    registry.stop(keep_data=True)
    try:
        other_client = RegistryClient(RegistrySettings(registry.ccompat_url, timeout_s=0.5))  # the same process
        assert other_client.schema_by_id(fetched.schema_id).text == client.schema_by_id(fetched.schema_id).text
        with pytest.raises(RegistryUnreachable) as unreachable:  # negative control: an id not fetched before
            other_client.schema_by_id(never_fetched.schema_id)
        assert f"schema id {never_fetched.schema_id}" in str(unreachable.value)
        # A client with time to wait asks again until the registry is back (on the same port and storage).
        patient = RegistryClient(RegistrySettings(registry.ccompat_url, timeout_s=120))
        with ThreadPoolExecutor(1) as pool:
            waiting = pool.submit(patient.schema_by_id, never_fetched.schema_id)
            registry.start()
            assert json.loads(waiting.result(120).text) == json.loads(avro("id", "b"))
    finally:
        if registry.pid is None:
            registry.start()


def test_subject_name_strategies():
    assert subject_name("topic", "orders", is_key=False) == "orders-value"
    assert subject_name("topic", "orders", is_key=True) == "orders-key"
    assert subject_name("record", "orders", is_key=False, record_name="shop.Order") == "shop.Order"
    assert subject_name("topic-record", "orders", is_key=True, record_name="shop.Order") == "orders-shop.Order"
    with pytest.raises(OptionError, match="has none"):
        subject_name("record", "orders", is_key=False)
    with pytest.raises(OptionError, match="not one of"):
        subject_name("topic_name", "orders", is_key=False)


@pytest.fixture(scope="module")
def secured():
    """A registry that takes HTTPS only (a certificate from a CA the test makes) and requires authentication: HTTP
    basic, or a bearer token (a JWT it verifies with a public key)."""
    with LocalSchemaRegistry(auth=True, tls=True) as server:
        yield server


def secured_settings(server, **overrides):
    values = {"user_info": f"{server.username}:{server.password}", "ca_pem": server.ca_pem, "timeout_s": 5,
              **overrides}
    return RegistrySettings(server.ccompat_url, **values)


@pytest.mark.parametrize("auth", ["basic", "bearer"])
def test_authentication_and_tls_with_a_ca_as_pem(secured, new_subject, auth):
    overrides = {"user_info": None, "bearer_token": secured.bearer_token()} if auth == "bearer" else {}
    client = RegistryClient(secured_settings(secured, **overrides))
    registered = client.register(new_subject(), "AVRO", avro("id"))
    forget_cached_schemas()
    assert client.schema_by_id(registered.schema_id).schema_id == registered.schema_id
    assert secured.url.startswith("https://")


@pytest.mark.parametrize("credentials", ["wrong password", "none", "forged bearer token"])
def test_a_refused_credential_is_named_by_url_without_the_secret(secured, credentials):
    forged = secured.bearer_token(forged=True)
    wrong = {"wrong password": "not-the-Pa55word", "none": "", "forged bearer token": forged}[credentials]
    overrides = {"wrong password": {"user_info": f"{secured.username}:{wrong}"},
                 "none": {"user_info": None},
                 "forged bearer token": {"user_info": None, "bearer_token": forged}}[credentials]
    client = RegistryClient(secured_settings(secured, **overrides))
    with pytest.raises(RegistryUnauthorized) as refused:
        client.latest("anything-value")
    assert refused.value.status == 401 and secured.ccompat_url in str(refused.value)
    assert secured.password not in str(refused.value)
    assert not wrong or wrong not in str(refused.value)


def test_a_certificate_from_another_ca_is_refused(secured):
    for ca_pem in (TestCA("another CA").pem, None):  # another CA, and the system's CAs
        client = RegistryClient(secured_settings(secured, ca_pem=ca_pem))
        with pytest.raises(RegistryTlsError) as refused:
            client.latest("anything-value")
        assert secured.ccompat_url in str(refused.value) and "ca_pem" in str(refused.value)
        assert secured.password not in str(refused.value)
