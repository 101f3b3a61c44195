"""Encrypted basins (stream_cipher) through the official s2-sdk: the key travels per request, records are
stored encrypted, a wrong key fails with S2's 400 decryption_failed and a missing one with 400 bad_header."""

import json
import os
import sqlite3

import pytest
import s2_sdk
from s2_sdk import AppendInput, BasinConfig, CommandRecord, Encryption, ReadLimit, Record, SeqNum

from sluice.s2local import LocalS2
from sluice.s2local._storage import Storage
from tests.s2local.conftest import run

SECRET = b"plaintext-that-must-not-be-on-disk"


@pytest.mark.parametrize("cipher", [Encryption.AES_256_GCM, Encryption.AEGIS_256])
def test_records_are_encrypted_at_rest_and_need_the_key(tmp_path, cipher):
    key, wrong = os.urandom(32), os.urandom(32)
    data = tmp_path / "s2"
    with LocalS2(data) as server:
        async def scenario():
            async with s2_sdk.S2("t", endpoints=server.endpoints) as s2:
                await s2.create_basin("secret-basin", config=BasinConfig(stream_cipher=cipher))
                basin = s2.basin("secret-basin")
                await basin.create_stream("s")
                stream = basin.stream("s", encryption_key=key)
                await stream.append(AppendInput(records=[Record(body=SECRET, headers=[(b"h", b"header-secret")])]))
                session = stream.append_session()
                async with session:
                    await (await session.submit(AppendInput(records=[Record(body=SECRET + b"-2")])))
                await stream.append(AppendInput(records=[CommandRecord.fence("f")], fencing_token=""))
                got = (await stream.read(start=SeqNum(0))).records
                assert [r.body for r in got[:2]] == [SECRET, SECRET + b"-2"]
                assert got[0].headers == [(b"h", b"header-secret")]
                assert got[2].is_command_record()
                streamed = [r async for b in stream.read_session(start=SeqNum(0), limit=ReadLimit(count=2))
                            for r in b.records]
                assert [r.body for r in streamed] == [SECRET, SECRET + b"-2"]
                with pytest.raises(s2_sdk.S2ServerError) as bad_key:
                    await basin.stream("s", encryption_key=wrong).read(start=SeqNum(0))
                assert (bad_key.value.status_code, bad_key.value.code) == (400, "decryption_failed")
                with pytest.raises(s2_sdk.S2ServerError) as no_key:
                    await basin.stream("s").append(AppendInput(records=[Record(body=b"x")]))
                assert (no_key.value.status_code, no_key.value.code) == (400, "bad_header")
                assert "s2-encryption-key" in str(no_key.value)
                assert (await basin.stream("s").check_tail()).seq_num == 3  # a tail check needs no key
                # The basin's cipher may change (BasinReconfiguration.stream_cipher); "s" keeps the one it has.
                other = Encryption.AEGIS_256 if cipher == Encryption.AES_256_GCM else Encryption.AES_256_GCM
                await s2.reconfigure_basin("secret-basin", config=BasinConfig(stream_cipher=other))
                assert [s.cipher for s in (await basin.list_streams()).items] == [cipher]
                assert (await stream.read(start=SeqNum(0))).records[0].body == SECRET

        run(scenario())
    stored = b"".join(f.read_bytes() for f in data.iterdir() if f.is_file())
    assert b"header-secret" not in stored and SECRET not in stored and key not in stored
    assert len(stored) > 0


def test_plain_basins_store_plaintext(tmp_path):
    """Negative control for the at-rest check above: without a cipher the plaintext is in the data files."""
    data = tmp_path / "s2"
    with LocalS2(data) as server:
        async def scenario():
            async with s2_sdk.S2("t", endpoints=server.endpoints) as s2:
                await s2.create_basin("plain-basin")
                await s2.basin("plain-basin").create_stream("s")
                await s2.basin("plain-basin").stream("s").append(AppendInput(records=[Record(body=SECRET)]))

        run(scenario())
    assert SECRET in b"".join(f.read_bytes() for f in data.iterdir() if f.is_file())


def test_stream_cipher_is_fixed_when_the_stream_is_created(tmp_path):
    """BasinConfig.stream_cipher is the "Encryption algorithm to apply to newly created streams in the basin": a
    stream keeps the cipher (StreamInfo.cipher) it was created with when its basin's cipher changes later, also
    after the server restarts on the same data. A plain stream stays plain: no key, its records readable."""
    key = os.urandom(32)
    aes, aegis = Encryption.AES_256_GCM, Encryption.AEGIS_256
    data = tmp_path / "s2"
    with LocalS2(data) as server:
        async def before_restart():
            async with s2_sdk.S2("t", endpoints=server.endpoints) as s2:
                await s2.create_basin("cipher-basin")
                basin = s2.basin("cipher-basin")
                await basin.create_stream("plain")
                await basin.stream("plain").append(AppendInput(records=[Record(body=b"plain-1")]))
                await s2.reconfigure_basin("cipher-basin", config=BasinConfig(stream_cipher=aes))
                assert (await basin.create_stream("aes")).cipher == aes
                await basin.stream("aes", encryption_key=key).append(AppendInput(records=[Record(body=b"aes-1")]))
                # Read without a key: "plain" was created before the basin had a cipher.
                assert (await basin.stream("plain").read(start=SeqNum(0))).records[0].body == b"plain-1"
                await s2.reconfigure_basin("cipher-basin", config=BasinConfig(stream_cipher=aegis))
                assert (await basin.create_stream("aegis")).cipher == aegis

        run(before_restart())
    with LocalS2(data) as server:
        async def after_restart():
            async with s2_sdk.S2("t", endpoints=server.endpoints, retry=s2_sdk.Retry(max_attempts=1)) as s2:
                basin = s2.basin("cipher-basin")
                listed = {s.name: s.cipher for s in (await basin.list_streams()).items}
                assert listed == {"plain": None, "aes": aes, "aegis": aegis}
                assert (await basin.ensure_stream("plain")).stream.cipher is None
                plain = basin.stream("plain")
                await plain.append(AppendInput(records=[Record(body=b"plain-2")]))
                assert [r.body for r in (await plain.read(start=SeqNum(0))).records] == [b"plain-1", b"plain-2"]
                assert (await basin.stream("aes", encryption_key=key).read(start=SeqNum(0))).records[0].body == \
                    b"aes-1"
                with pytest.raises(s2_sdk.S2ServerError) as no_key:
                    await basin.stream("aes").read(start=SeqNum(0))
                assert (no_key.value.status_code, no_key.value.code) == (400, "bad_header")

        run(after_restart())


def test_data_written_before_streams_kept_their_cipher_opens(tmp_path):
    """A data directory from before streams recorded their cipher (no streams.cipher column) opens; each stream
    gets its basin's stream_cipher, which was how such a stream's records were sealed (it could not change)."""
    db = sqlite3.connect(tmp_path / "s2.sqlite3")
    db.executescript("""
        CREATE TABLE basins (name TEXT PRIMARY KEY, config TEXT NOT NULL, created_at TEXT NOT NULL, request_token TEXT);
        CREATE TABLE streams (
            id INTEGER PRIMARY KEY, basin TEXT NOT NULL, name TEXT NOT NULL, config TEXT NOT NULL,
            created_at TEXT NOT NULL, request_token TEXT,
            next_seq INTEGER NOT NULL DEFAULT 0, last_ts INTEGER NOT NULL DEFAULT 0,
            fencing_token TEXT NOT NULL DEFAULT '', trim_point INTEGER NOT NULL DEFAULT 0, UNIQUE (basin, name));
    """)
    sealed = json.dumps({"stream_cipher": "aes-256-gcm"})
    db.execute("INSERT INTO basins VALUES ('sealed-basin', ?, 'now', NULL)", (sealed,))
    db.execute("INSERT INTO basins VALUES ('plain-basin', '{}', 'now', NULL)")
    db.execute("INSERT INTO streams (basin, name, config, created_at) VALUES ('sealed-basin', 's', '{}', 'now')")
    db.execute("INSERT INTO streams (basin, name, config, created_at) VALUES ('plain-basin', 's', '{}', 'now')")
    db.commit()
    db.close()
    storage = Storage(tmp_path)
    try:
        _, streams = storage.load()
    finally:
        storage.close()
    assert sorted((row[1], row[-1]) for row in streams) == [("plain-basin", None), ("sealed-basin", "aes-256-gcm")]
