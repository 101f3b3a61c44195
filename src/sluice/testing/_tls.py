"""Certificates for tests of TLS: a throwaway CA, a server certificate it signs, and another CA for "wrong CA" tests.

`TestCA()` makes a CA (EC P-256, valid one day) with the `cryptography` package (pinned in
requirements/constraints.txt); `ca.server_certificate()` signs a certificate for loopback (SANs 127.0.0.1, ::1 and
localhost unless told other names) that a client verifies with `ca.pem`. A second `TestCA()` is an unrelated CA: a
client that trusts only it must refuse the server. Nothing here is a secret worth keeping; the keys live in memory
and in the files a test writes for its server.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
from dataclasses import dataclass
from pathlib import Path

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
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

        key = ec.generate_private_key(ec.SECP256R1())
        sans: list[x509.GeneralName] = []
        for name in names:
            try:
                sans.append(x509.IPAddress(ipaddress.ip_address(name)))
            except ValueError:
                sans.append(x509.DNSName(name))
        now = datetime.datetime.now(datetime.UTC)
        cert = (x509.CertificateBuilder()
                .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, names[0])]))
                .issuer_name(self._cert.subject).public_key(key.public_key())
                .serial_number(x509.random_serial_number())
                .not_valid_before(now - datetime.timedelta(minutes=5))
                .not_valid_after(now + datetime.timedelta(days=1))
                .add_extension(x509.SubjectAlternativeName(sans), critical=False)
                .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
                .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
                .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(self._key.public_key()),
                               critical=False)
                .sign(self._key, hashes.SHA256()))
        key_pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                    serialization.NoEncryption()).decode()
        return ServerCertificate(cert.public_bytes(serialization.Encoding.PEM).decode(), key_pem, self.pem,
                                 tuple(names))
