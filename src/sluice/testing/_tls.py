"""Certificates for tests of TLS: a throwaway CA, a server certificate it signs, and another CA for "wrong CA" tests.

`TestCA()` makes a CA (EC P-256, valid one day) with the `cryptography` package (pinned in
requirements/constraints.txt); `ca.server_certificate()` signs a certificate for loopback (SANs 127.0.0.1, ::1 and
localhost unless told other names) that a client verifies with `ca.pem`. A second `TestCA()` is an unrelated CA: a
client that trusts only it must refuse the server. `ca.client_certificate(name)` signs a client's certificate (the
subject's common name `name`: PostgreSQL's `cert` authentication maps it to the user), `expired=True` one whose
validity ended yesterday, for servers that demand client certificates (mutual TLS). Nothing here is a secret worth
keeping; the keys live in memory and in the files a test writes for its server.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from cryptography.x509 import ObjectIdentifier, SubjectAlternativeName

LOOPBACK_NAMES = ("127.0.0.1", "::1", "localhost")


@dataclass(frozen=True)
class ServerCertificate:
    """A server's certificate and key as PEM text, and the CA that signed it (`ca_pem`, what a client trusts)."""

    cert_pem: str
    key_pem: str
    ca_pem: str
    names: tuple[str, ...]

    def write(self, folder: Path, stem: str = "server") -> tuple[Path, Path]:
        """The certificate (with the CA after it: the chain) and the key as `<stem>.crt` and `<stem>.key` under
        `folder`, the key readable by its owner only (PostgreSQL refuses a key others can read)."""
        cert, key = folder / f"{stem}.crt", folder / f"{stem}.key"
        cert.write_text(self.cert_pem + self.ca_pem)
        fd = os.open(key, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as out:
            out.write(self.key_pem)
        return cert, key

    def pkcs12(self, password: str) -> bytes:
        """The key and the certificate chain as a PKCS#12 key store (what a Java server reads), under `password`."""
        from cryptography.hazmat.primitives import serialization
        from cryptography.hazmat.primitives.asymmetric import dsa, ec, ed448, ed25519, rsa
        from cryptography.hazmat.primitives.serialization import pkcs12
        from cryptography.x509 import load_pem_x509_certificate

        key = serialization.load_pem_private_key(self.key_pem.encode(), None)
        # The kinds of key PKCS#12 holds (the CA makes P-256 ones); pkcs12 refuses others with a TypeError too.
        if not isinstance(key, rsa.RSAPrivateKey | dsa.DSAPrivateKey | ec.EllipticCurvePrivateKey
                          | ed25519.Ed25519PrivateKey | ed448.Ed448PrivateKey):
            raise TypeError(f"a PKCS#12 key store cannot hold a {type(key).__name__}")
        return pkcs12.serialize_key_and_certificates(
            b"server", key,
            load_pem_x509_certificate(self.cert_pem.encode()), [load_pem_x509_certificate(self.ca_pem.encode())],
            serialization.BestAvailableEncryption(password.encode()))


@dataclass(frozen=True)
class ClientCertificate:
    """A client's certificate and key as PEM text (what sluice's ssl.cert-pem / ssl.key-pem take), and its CA."""

    cert_pem: str
    key_pem: str = field(repr=False)
    ca_pem: str
    name: str

    def write(self, folder: Path, stem: str = "client") -> tuple[Path, Path]:
        """The certificate and the key (owner-only) as `<stem>.crt` and `<stem>.key` under `folder`."""
        return ServerCertificate(self.cert_pem, self.key_pem, self.ca_pem, (self.name,)).write(folder, stem)


class TestCA:
    """A certificate authority for one test run; `.pem` is its certificate (what clients trust)."""

    __test__ = False  # not a pytest test class

    def __init__(self, name: str = "sluice test CA") -> None:
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import NameOID

        self._key = ec.generate_private_key(ec.SECP256R1())
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
        now = datetime.datetime.now(datetime.UTC)
        self._cert = (x509.CertificateBuilder().subject_name(subject).issuer_name(subject)
                      .public_key(self._key.public_key()).serial_number(x509.random_serial_number())
                      .not_valid_before(now - datetime.timedelta(minutes=5))
                      .not_valid_after(now + datetime.timedelta(days=1))
                      .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
                      .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                                   content_commitment=False, key_encipherment=False,
                                                   data_encipherment=False, key_agreement=False,
                                                   encipher_only=False, decipher_only=False), critical=True)
                      .add_extension(x509.SubjectKeyIdentifier.from_public_key(self._key.public_key()),
                                     critical=False)
                      .sign(self._key, hashes.SHA256()))
        self.pem = self._cert.public_bytes(serialization.Encoding.PEM).decode()

    def server_certificate(self, names: tuple[str, ...] = LOOPBACK_NAMES) -> ServerCertificate:
        """A server certificate signed by this CA, valid for `names` (IP addresses and DNS names)."""
        from cryptography import x509
        from cryptography.x509.oid import ExtendedKeyUsageOID

        sans: list[x509.GeneralName] = []
        for name in names:
            try:
                sans.append(x509.IPAddress(ipaddress.ip_address(name)))
            except ValueError:
                sans.append(x509.DNSName(name))
        cert_pem, key_pem = self._sign(names[0], ExtendedKeyUsageOID.SERVER_AUTH, x509.SubjectAlternativeName(sans))
        return ServerCertificate(cert_pem, key_pem, self.pem, tuple(names))

    def client_certificate(self, name: str, *, expired: bool = False) -> ClientCertificate:
        """A client certificate signed by this CA for the subject CN=`name`; `expired`: valid from two days ago to
        yesterday (a server must refuse it)."""
        from cryptography.x509.oid import ExtendedKeyUsageOID

        cert_pem, key_pem = self._sign(name, ExtendedKeyUsageOID.CLIENT_AUTH, None, expired=expired)
        return ClientCertificate(cert_pem, key_pem, self.pem, name)

    def _sign(self, common_name: str, usage: ObjectIdentifier, sans: SubjectAlternativeName | None, *,
              expired: bool = False) -> tuple[str, str]:
        """(certificate, PKCS#8 key) as PEM text: a new P-256 key for CN=`common_name`, extended key usage `usage`,
        the subject alternative names `sans` (or none), signed by this CA."""
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import NameOID

        key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.UTC)
        start, end = ((now - datetime.timedelta(days=2), now - datetime.timedelta(days=1)) if expired
                      else (now - datetime.timedelta(minutes=5), now + datetime.timedelta(days=1)))
        builder = (x509.CertificateBuilder()
                   .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]))
                   .issuer_name(self._cert.subject).public_key(key.public_key())
                   .serial_number(x509.random_serial_number())
                   .not_valid_before(start).not_valid_after(end)
                   .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
                   .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
                   .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(self._key.public_key()),
                                  critical=False))
        if sans is not None:
            builder = builder.add_extension(sans, critical=False)
        cert = builder.sign(self._key, hashes.SHA256())
        key_pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                    serialization.NoEncryption()).decode()
        return cert.public_bytes(serialization.Encoding.PEM).decode(), key_pem
