"""Encryption at rest for encrypted basins (`stream_cipher`), with the key the client sends per request.

As S2 does it: a record's headers and body are encrypted together (the stored record carries only the
ciphertext), command records stay plain, the stream's `basin/stream` name is the associated data (a record
copied to another stream does not decrypt), and the key (32 bytes, base64 in `s2-encryption-key`) is never
stored. Stored layout: cipher id (1 byte), nonce, ciphertext with tag.
"""

from __future__ import annotations

import base64
import os
from typing import Any

from sluice.s2local import _proto as pb
from sluice.s2local._errors import S2Error
from sluice.s2local._wire import is_command_record

CIPHERS = ("aes-256-gcm", "aegis-256")
_ID = {"aes-256-gcm": 1, "aegis-256": 2}
KEY_BYTES = 32


def check_cipher(name: Any) -> str:
    if name not in CIPHERS:
        raise S2Error("invalid", f"stream_cipher must be one of {', '.join(CIPHERS)}, got {name!r}")
    if name == "aegis-256":
        _aegis()  # refuse at configuration time where the library is missing, not at the first append
    return name


def _aegis() -> Any:
    try:
        import pyaegis
    except ImportError:
        raise S2Error("invalid", "stream_cipher aegis-256 needs the pyaegis library on this server: "
                                 "pip install 'sluice[aegis]' (or use aes-256-gcm)") from None
    return pyaegis.Aegis256()


class RecordCipher:
    def __init__(self, cipher: str, header: str | None, basin: str, stream: str) -> None:
        # A missing, non-base64 or wrong-length s2-encryption-key is S2's bad_header (400), on append and read alike
        # (s2-lite: EncryptionSpecResolutionError -> ErrorCode::BadHeader).
        if not header:
            raise S2Error("bad_header", f"stream {stream!r} of basin {basin!r} is encrypted ({cipher}): send its "
                                        "key in the s2-encryption-key header (base64 of 32 bytes)")
        try:
            key = base64.b64decode(header, validate=True)
        except ValueError:
            key = b""
        if len(key) != KEY_BYTES:
            raise S2Error("bad_header", f"s2-encryption-key must be base64 of {KEY_BYTES} bytes")
        self.cipher = cipher
        self.aad = f"{basin}/{stream}".encode()
        if cipher == "aes-256-gcm":
            from cryptography.hazmat.primitives.ciphers.aead import AESGCM

            aes = AESGCM(key)
            self._nonce_bytes = 12
            self._seal = lambda nonce, data: aes.encrypt(nonce, data, self.aad)
            self._open = lambda nonce, data: aes.decrypt(nonce, data, self.aad)
        else:
            aegis = _aegis()
            self._nonce_bytes = aegis.NONCE_SIZE
            self._seal = lambda nonce, data: aegis.encrypt(key, nonce, data, self.aad)
            self._open = lambda nonce, data: aegis.decrypt(key, nonce, data, self.aad)

    def encrypt_input(self, inp: Any) -> Any:
        """The AppendInput with every data record's headers and body sealed into its body."""
        out = pb.AppendInput()
        out.CopyFrom(inp)
        for record in out.records:
            if is_command_record(record):
                continue
            plain = pb.AppendRecord(headers=record.headers, body=record.body).SerializeToString()
            nonce = os.urandom(self._nonce_bytes)
            del record.headers[:]
            record.body = bytes([_ID[self.cipher]]) + nonce + self._seal(nonce, plain)
        return out

    def decrypt_framed(self, framed: list[bytes]) -> list[bytes]:
        """Stored records (each framed as a ReadBatch field) with their headers and body opened."""
        out = []
        for item in framed:
            batch = pb.ReadBatch.FromString(item)
            record = batch.records[0]
            if not is_command_record(record):
                blob = record.body
                # S2: a record that does not authenticate under the key is decryption_failed (400); one stored
                # with another algorithm, or malformed, is a storage error (500).
                if not blob or blob[0] != _ID[self.cipher]:
                    raise S2Error("storage", f"record {record.seq_num} was not written with {self.cipher}")
                nonce, sealed = blob[1:1 + self._nonce_bytes], blob[1 + self._nonce_bytes:]
                try:
                    opened = self._open(nonce, sealed)
                except Exception:
                    raise S2Error("decryption_failed", "record decryption failed: the s2-encryption-key is not "
                                                       "this stream's key") from None
                try:
                    plain = pb.AppendRecord.FromString(opened)
                except Exception:
                    raise S2Error("storage", f"record {record.seq_num} is malformed once decrypted") from None
                del record.headers[:]
                record.headers.extend(plain.headers)
                record.body = plain.body
            out.append(batch.SerializeToString())
        return out
