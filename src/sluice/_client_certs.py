"""Client certificates (mutual TLS) as every connector takes them: a certificate and its key as PEM text in two
options (executors are other machines: no driver file paths), both or neither, the key unencrypted and secret; and
what a server's TLS alert about the certificate means (OpenSSL's alert names, as a server sends them)."""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from sluice._errors import OptionError
from sluice._options import Options

if TYPE_CHECKING:
    import ssl

# The TLS alerts a server sends when it refuses the client's certificate, and what each means. A Java server (a Kafka
# broker) says "bad certificate" for none as for another CA's, and "certificate unknown" for one it cannot accept
# otherwise (expired, say); OpenSSL servers are more precise.
CLIENT_ALERTS = (
    ("certificate expired", "it has expired: renew it"),
    ("unknown ca", "the server does not trust the CA that signed it"),
    ("certificate required", "the server requires one and none was given: set the certificate and its key"),
    ("bad certificate", "none was given, or a CA the server does not trust signed it"),
    ("certificate unknown", "the server cannot accept it (expired, or not valid otherwise)"),
)


@dataclass(frozen=True)
class ClientCertificate:
    """A client's certificate and its private key, PEM text; the key never in a repr."""

    cert_pem: str
    key_pem: str

    def __repr__(self) -> str:
        return "ClientCertificate(<certificate>, key=<redacted>)"

    def load_into(self, context: ssl.SSLContext, cert_option: str = "ssl.cert-pem",
                  key_option: str = "ssl.key-pem") -> None:
        """Present this certificate from `context`. Python's ssl loads a certificate and key from files only: they
        are written, owner-only (0600), to a folder only this user can enter (mkdtemp: 0700, a random name), loaded
        into the context (which keeps them in memory) and removed at once; the key is never on a command line or in
        the environment."""
        with tempfile.TemporaryDirectory(prefix="sluice-client-cert-") as folder:
            paths = []
            for name, pem in (("client.crt", self.cert_pem), ("client.key", self.key_pem)):
                path = Path(folder) / name
                with os.fdopen(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w") as out:
                    out.write(pem)
                paths.append(str(path))
            try:
                context.load_cert_chain(paths[0], paths[1])
            except Exception as e:  # ssl.SSLError: its text names OpenSSL's reason, never the key
                raise OptionError(f"{cert_option} and {key_option} could not be loaded as a certificate and its key "
                                  f"({e}): check they are PEM text of one pair, the key unencrypted") from None


def client_certificate(opts: Options, cert_option: str = "ssl.cert-pem",
                       key_option: str = "ssl.key-pem") -> ClientCertificate | None:
    """The certificate and key the options give (None: neither), checked on the driver; the key's text is in no
    message."""
    cert, key = opts[cert_option], opts[key_option]
    if (cert is None) != (key is None):
        given, missing = (cert_option, key_option) if key is None else (key_option, cert_option)
        raise OptionError(f"option '{given}' is set without '{missing}': a client certificate needs both")
    if cert is None or key is None:
        return None
    if "-----BEGIN CERTIFICATE-----" not in cert:
        raise OptionError(f"option '{cert_option}' must be the client's certificate as PEM text (-----BEGIN "
                          "CERTIFICATE-----...), not a path: executors cannot read the driver's files")
    if "PRIVATE KEY-----" not in key:
        raise OptionError(f"option '{key_option}' must be the private key as PEM text (-----BEGIN PRIVATE KEY-----"
                          "...), not a path: executors cannot read the driver's files (its value is not shown)")
    if "ENCRYPTED" in key:
        raise OptionError(f"option '{key_option}' is an encrypted key; give it unencrypted (the option is a secret, "
                          "redacted everywhere)")
    return ClientCertificate(cert, key)


def refused_certificate(text: str) -> tuple[str, str] | None:
    """(the alert, what it means) when `text` reports a TLS alert about the client's certificate, else None."""
    low = text.lower()
    return next(((alert, meaning) for alert, meaning in CLIENT_ALERTS if f"alert {alert}" in low), None)


def server_alert(host: str, port: int, context: ssl.SSLContext, wait_s: float = 2.0) -> str | None:
    """The TLS alert the server at `host`:`port` sends a connection of `context` that sends nothing after its
    handshake, as "SSLError: ..." text; None when none comes within `wait_s` (it waits for a request: it accepted the
    client) or the server cannot be reached. Over TLS 1.3 the client's handshake ends before the server has checked
    the client's certificate: a client that sends its request at once makes a refusing server close a connection
    holding unread data, and that close (a reset) can overtake the alert. On this connection the alert arrives
    whole."""
    import socket
    import ssl

    try:
        with socket.create_connection((host, port), timeout=wait_s) as raw, \
                context.wrap_socket(raw, server_hostname=host) as tls:
            tls.recv(1)
    except ssl.SSLError as e:
        return f"{type(e).__name__}: {e}"
    except OSError:  # no alert within the wait, or no server there
        return None
    return None
