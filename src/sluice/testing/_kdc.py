"""A throwaway MIT Kerberos KDC for tests: a realm on loopback, its principals and keytabs in a private folder.

`LocalKdc()` makes a folder (mode 0700), writes a krb5.conf (clients: the realm's KDC on this loopback port, no DNS,
no reverse lookups, TCP only, tickets in the folder) and a kdc.conf, creates the realm's database with
`kdb5_util create`, and runs `krb5kdc -n` (in the foreground) on a free port, TCP and UDP. `add_principal(name)`
makes a principal with a random key (or a password), `keytab(name)` exports its current keys (`ktadd -norandkey`,
so exporting twice gives the same keys), `kadmin(query)` runs any other kadmin.local query (`cpw -randkey`: the key
changes, older keytabs no longer work; `modprinc -expire`: the principal expires). `env` is what a process needs to
use this realm (KRB5_CONFIG); `krb5_conf` is the file (Java reads it as -Djava.security.krb5.conf). `stop()` ends
the KDC and deletes the folder, keytabs included.

The KDC is Debian's (`krb5-kdc`, with `krb5-admin-server` for kadmin.local and `krb5-user` for kinit):
`make check-kerberos` installs them pinned. Nothing here touches /etc/krb5.conf or the machine's ticket cache.
"""

from __future__ import annotations

import os
import secrets
import shutil
import socket
import subprocess
import time
from pathlib import Path

from sluice.testing._jvm import JvmServer
from sluice.testing._postgres import free_port

INSTALL_HINT = "apt-get install -y krb5-kdc krb5-admin-server krb5-user (or: make check-kerberos)"
# Enough for tests; Java 17's and MIT's defaults both accept these.
ENCTYPES = "aes256-cts-hmac-sha1-96:normal aes128-cts-hmac-sha1-96:normal"


def _tool(name: str) -> str:
    for folder in ("/usr/sbin", "/usr/bin"):
        path = Path(folder) / name
        if path.is_file():
            return str(path)
    found = shutil.which(name)
    if found is None:
        raise RuntimeError(f"LocalKdc needs MIT Kerberos's {name}, which was not found: {INSTALL_HINT}")
    return found


class LocalKdc(JvmServer):
    """Context manager: a fresh realm `realm` served on `host`:`port`. Its folder: krb5.conf, kdc.conf, the database
    (principal*), kdc.log, keytabs/ (keytab()'s files), output.log."""

    server = "KDC"  # also the folder's prefix: no spaces (kadmin.local queries split on them)
    logs = ("kdc.log",)

    def __init__(self, *, realm: str = "SLUICE.TEST", host: str = "127.0.0.1", start_timeout: float = 30) -> None:
        super().__init__(start_timeout)
        self.realm, self.host = realm, host
        self.port = 0

    @property
    def krb5_conf(self) -> Path:
        if self._dir is None:
            raise RuntimeError("this KDC is not started")
        return self._dir / "krb5.conf"

    @property
    def env(self) -> dict[str, str]:
        """Environment variables that point MIT Kerberos's clients at this realm (and its ticket cache at a file of
        the folder)."""
        assert self._dir is not None
        return {"KRB5_CONFIG": str(self._dir / "krb5.conf"), "KRB5_KDC_PROFILE": str(self._dir / "kdc.conf"),
                "KRB5CCNAME": f"FILE:{self._dir}/ccache"}

    def _environment(self) -> dict[str, str]:
        return {**os.environ, **self.env}

    def _check_installed(self) -> None:
        for tool in ("krb5kdc", "kdb5_util", "kadmin.local"):
            _tool(tool)

    def _write_config(self) -> None:
        assert self._dir is not None
        self._dir.chmod(0o700)
        (self._dir / "keytabs").mkdir(mode=0o700)
        self.port = free_port()
        d = self._dir
        # rdns/dns_canonicalize_hostname off: a service's principal is the host name the client was given
        # (HTTP/localhost), not what a reverse lookup of its address says.
        (d / "krb5.conf").write_text(f"""\
[libdefaults]
  default_realm = {self.realm}
  dns_lookup_kdc = false
  dns_lookup_realm = false
  dns_canonicalize_hostname = false
  rdns = false
  udp_preference_limit = 1
  ticket_lifetime = 1h
  forwardable = true
  default_ccache_name = FILE:{d}/ccache

[realms]
  {self.realm} = {{
    kdc = {self.host}:{self.port}
  }}

[domain_realm]
  localhost = {self.realm}
  {self.host} = {self.realm}
""")
        (d / "kdc.conf").write_text(f"""\
[kdcdefaults]
  kdc_listen = {self.host}:{self.port}
  kdc_tcp_listen = {self.host}:{self.port}

[realms]
  {self.realm} = {{
    database_name = {d}/principal
    key_stash_file = {d}/stash
    acl_file = {d}/kadm5.acl
    max_life = 1h
    max_renewable_life = 1h
    supported_enctypes = {ENCTYPES}
  }}

[logging]
  kdc = FILE:{d}/kdc.log
""")
        (d / "kadm5.acl").write_text("")
        self._run([_tool("kdb5_util"), "create", "-s", "-r", self.realm, "-P", secrets.token_urlsafe(24)],
                  "create the realm's database")

    def _run(self, command: list[str], what: str) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(command, capture_output=True, text=True, env=self._environment(), timeout=60,
                              stdin=subprocess.DEVNULL, cwd=self._dir)
        if done.returncode:
            raise RuntimeError(f"could not {what} ({command[0]} exited with {done.returncode}): "
                               f"{(done.stderr or done.stdout).strip()[-2000:]}")
        return done

    def _command(self) -> list[str]:
        return [_tool("krb5kdc"), "-n", "-r", self.realm]

    def _wait_ready(self, timeout: float) -> None:
        assert self._proc is not None
        deadline = time.monotonic() + timeout
        while True:
            if self._proc.poll() is not None:
                raise RuntimeError(f"krb5kdc exited with {self._proc.returncode} while starting:\n{self._log_tail()}")
            try:
                with socket.create_connection((self.host, self.port), timeout=1):
                    return
            except OSError as e:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"krb5kdc did not listen on {self.host}:{self.port} within {timeout:.0f} s "
                                       f"({e}):\n{self._log_tail()}") from None
            time.sleep(0.05)

    def kadmin(self, query: str) -> str:
        """Run a kadmin.local query on the realm's database (RuntimeError with its output when it fails)."""
        if self._dir is None:
            raise RuntimeError("this KDC is not started")
        done = self._run([_tool("kadmin.local"), "-r", self.realm, "-q", query], f"run kadmin.local {query!r}")
        # kadmin.local exits 0 after a failed query: its complaint on stderr is the sign (besides the notice that a
        # principal gets no password policy).
        complaints = [line for line in done.stderr.splitlines()
                      if line.strip() and "defaulting to no policy" not in line]
        if complaints:
            raise RuntimeError(f"kadmin.local {query!r} failed: {' '.join(complaints)[-2000:]}")
        return done.stdout

    def principal(self, name: str) -> str:
        """`name` with this realm appended, unless it names one."""
        return name if "@" in name else f"{name}@{self.realm}"

    def add_principal(self, name: str, *, password: str | None = None) -> str:
        """Make principal `name` (e.g. "alice", "HTTP/localhost") with a random key, or `password`; its full name."""
        full = self.principal(name)
        self.kadmin(f"addprinc -randkey {full}" if password is None else f'addprinc -pw "{password}" {full}')
        return full

    def keytab(self, *names: str) -> Path:
        """A keytab (a file of the folder, mode 0600) with the current keys of principals `names`."""
        assert self._dir is not None
        path = self._dir / "keytabs" / f"{secrets.token_hex(8)}.keytab"
        self.kadmin(f"ktadd -norandkey -k {path} {' '.join(self.principal(n) for n in names)}")
        if not path.is_file():
            raise RuntimeError(f"kadmin.local wrote no keytab for {', '.join(names)}")
        path.chmod(0o600)
        return path
