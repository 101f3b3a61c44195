"""The test KDC (sluice.testing.LocalKdc): MIT's kinit signs in with a keytab it exported and with a password, and is
refused a wrong password, a keytab whose key was changed since and a principal that has expired; stop() removes the
folder with the keytabs. One KDC for the module (a start takes well under a second)."""

import os
import subprocess

import pytest

from sluice.testing._kdc import LocalKdc


@pytest.fixture(scope="module")
def kdc():
    with LocalKdc() as server:
        yield server


def kinit(kdc: LocalKdc, *args: str, password: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["kinit", *args], env={**os.environ, **kdc.env}, input=password, capture_output=True,
                          text=True, timeout=30)


def test_a_keytab_signs_in_and_a_changed_key_refuses_it(kdc):
    alice = kdc.add_principal("alice")
    keytab = kdc.keytab("alice")
    assert oct(keytab.stat().st_mode & 0o777) == "0o600"
    assert kinit(kdc, "-k", "-t", str(keytab), alice).returncode == 0
    listed = subprocess.run(["klist"], env={**os.environ, **kdc.env}, capture_output=True, text=True, check=True)
    assert f"Default principal: {alice}" in listed.stdout and f"krbtgt/{kdc.realm}@{kdc.realm}" in listed.stdout
    kdc.kadmin(f"cpw -randkey {alice}")  # the key in the keytab is no longer the principal's
    refused = kinit(kdc, "-k", "-t", str(keytab), alice)
    assert refused.returncode != 0 and "Password incorrect" in refused.stderr
    assert kinit(kdc, "-k", "-t", str(kdc.keytab("alice")), alice).returncode == 0  # a fresh export: the new key


def test_a_password_signs_in_a_wrong_one_and_an_expired_principal_do_not(kdc):
    bob = kdc.add_principal("bob", password="right-one")
    assert kinit(kdc, bob, password="right-one\n").returncode == 0
    wrong = kinit(kdc, bob, password="wrong-one\n")
    assert wrong.returncode != 0 and "Password incorrect" in wrong.stderr
    kdc.kadmin(f'modprinc -expire "2020-01-01 00:00:00 UTC" {bob}')
    expired = kinit(kdc, bob, password="right-one\n")
    assert expired.returncode != 0 and "expired" in expired.stderr


def test_a_failed_query_raises_and_stop_removes_the_keytabs():
    with LocalKdc() as server:
        with pytest.raises(RuntimeError, match="does not exist"):
            server.kadmin("cpw -randkey nobody")
        server.add_principal("carol")
        keytab = server.keytab("carol")
        folder = server.folder
        assert folder is not None and oct(folder.stat().st_mode & 0o777) == "0o700"
    assert not keytab.exists() and not folder.exists()
