"""Encrypted basins (stream_cipher) through the official s2-sdk: the key travels per request, records are
stored encrypted, a wrong key fails with S2's 400 decryption_failed and a missing one with 400 bad_header."""

import os

import pytest
import s2_sdk
from s2_sdk import AppendInput, BasinConfig, CommandRecord, Encryption, ReadLimit, Record, SeqNum

from sluice.s2local import LocalS2
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
                with pytest.raises(s2_sdk.S2ServerError) as change:
                    other = Encryption.AEGIS_256 if cipher == Encryption.AES_256_GCM else Encryption.AES_256_GCM
                    await s2.reconfigure_basin("secret-basin", config=BasinConfig(stream_cipher=other))
                assert change.value.status_code == 422

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
