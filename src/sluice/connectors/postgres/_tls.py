"""TLS of format("postgres"): which sslmode a connection uses, the CA it trusts, and what a TLS failure means.

libpq's own default (sslmode=prefer) tries TLS without checking the certificate and falls back to plaintext
without saying: sluice never leaves the choice to it. The connection string always carries an explicit sslmode:
verify-full unless told otherwise (`ssl.ca-pem`'s CA, else the system's), except on loopback or a Unix socket, where
the traffic never leaves the machine and `disable` is the default; plaintext to another host only when asked
(`sslmode=disable`). The CA travels as PEM text inside the options; libpq wants a
file, so each process that connects writes it to its own temp folder (executors have no file of the driver's).

A client certificate (`ssl.cert-pem` and `ssl.key-pem`, mutual TLS: pg_hba's `cert` method or `clientcert=verify-full`)
travels the same way. libpq reads a key only from a file (sslkey; there is no in-memory form), so each process writes
it once into a folder of its own (mkdtemp: mode 0700, a random name), the key file 0600, named by a hash of the key:
only this user can read it (as ~/.postgresql/postgresql.key would be), nothing else shares or guesses the folder,
and only its path enters the connection string (never the key: not on a command line, not in the environment).
"""

from __future__ import annotations

import atexit
import hashlib
import ipaddress
import os
import shutil
import tempfile
import threading
from pathlib import Path

from sluice.connector import Option, OptionError, Options, refused_certificate
from sluice.connector import client_certificate as client_certificate_of

MODES = ("verify-full", "verify-ca", "require", "disable")

TLS_OPTIONS = (
    Option("sslmode", "choice", None,
           "TLS: verify-full (certificate and host name checked; the default when ssl.ca-pem is set), verify-ca "
           "(certificate only), require (encrypted, unchecked), disable (plaintext). libpq's prefer and allow, "
           "which fall back to plaintext silently, are refused. Unset: verify-full, except to loopback or a Unix "
           "socket (disable).", choices=MODES),
    Option("ssl.ca-pem", "str", None,
           "PEM text of the CA that signed the server's certificate (text, not a path: executors write it to a "
           "file of their own for libpq); unset with TLS on: the system's CAs (sslrootcert=system)."),
    Option("ssl.cert-pem", "str", None,
           "PEM text of this client's certificate, for servers that demand one (pg_hba's cert method or "
           "clientcert=verify-full); with ssl.key-pem. Each process gives libpq a file of its own."),
    Option("ssl.key-pem", "str", None,
           "PEM text of the client certificate's private key (unencrypted PKCS#8 or PKCS#1); with ssl.cert-pem. "
           "Never shown; each process writes it to a file only it can read (0600, in a private temp folder).",
           secret=True),
)

# URL parameters that name a file on the driver: an executor may have no such file, so they are refused.
_FILE_PARAMS = ("sslrootcert", "sslcert", "sslkey", "sslcrl", "sslcrldir", "passfile")


def resolve(opts: Options, params: dict[str, str], host: str) -> tuple[str, str | None]:
    """(sslmode, CA PEM or None) from the options and the url's parameters, checked on the driver."""
    for name in _FILE_PARAMS:
        if name in params and not (name == "sslrootcert" and params[name] == "system"):
            raise OptionError(f"option 'url' sets {name}, a file on the driver that executors may not have; give the "
                              "PEM text in options 'ssl.ca-pem' (the CA), 'ssl.cert-pem' and 'ssl.key-pem' (a client "
                              "certificate) instead")
    in_url = params.pop("sslmode", None)
    if in_url is not None and in_url not in MODES:
        raise OptionError(f"sslmode={in_url} in option 'url': it falls back to plaintext without saying (or is not an "
                          f"sslmode); use one of {', '.join(MODES)}")
    mode = opts["sslmode"]
    if mode and in_url and mode != in_url:
        raise OptionError(f"option 'sslmode' is {mode} but the url says sslmode={in_url}; set one of them")
    mode = mode or in_url
    ca = opts["ssl.ca-pem"]
    if ca is not None and "-----BEGIN CERTIFICATE-----" not in ca:
        raise OptionError("option 'ssl.ca-pem' must be the CA's certificate as PEM text (-----BEGIN CERTIFICATE-----"
                          "...), not a path: executors cannot read the driver's files")
    if mode == "disable" and ca:
        raise OptionError("option 'ssl.ca-pem' is set with sslmode=disable: remove one (TLS or plaintext?)")
    if mode is None:  # verification on by default: plaintext only on this machine, or when asked
        asked = ca or opts["ssl.cert-pem"] or params.get("sslrootcert") == "system"  # TLS, said or implied
        mode = "verify-full" if asked or not _is_loopback(host) else "disable"
    params.pop("sslrootcert", None)
    return mode, ca


def client_certificate(opts: Options, mode: str) -> tuple[str | None, str | None]:
    """(certificate PEM, key PEM), both or neither (the SDK's check), and TLS on with them."""
    given = client_certificate_of(opts)
    if given is None:
        return None, None
    if mode == "disable":
        raise OptionError("options 'ssl.cert-pem'/'ssl.key-pem' are set with sslmode=disable: a client certificate "
                          "needs TLS (remove sslmode=disable, or the certificate)")
    return given.cert_pem, given.key_pem


def libpq_params(mode: str, ca_pem: str | None, cert_pem: str | None = None,
                 key_pem: str | None = None) -> dict[str, str]:
    """The connection parameters of TLS for this process: sslmode, sslrootcert, and sslcert/sslkey (a client
    certificate), each a file of this machine."""
    if mode == "disable":
        return {"sslmode": "disable"}
    if ca_pem:
        params = {"sslmode": mode, "sslrootcert": str(ca_file(ca_pem))}
    elif mode == "verify-full":  # libpq refuses sslrootcert=system with a mode weaker than verify-full
        params = {"sslmode": mode, "sslrootcert": "system"}
    else:
        params = {"sslmode": mode}
    if cert_pem and key_pem:
        params["sslcert"] = str(_private_file("cert", cert_pem))
        params["sslkey"] = str(_private_file("key", key_pem))
    return params


def ca_file(pem: str) -> Path:
    """The CA as a file in this machine's temp folder, named by its content (written once, atomically)."""
    path = Path(tempfile.gettempdir()) / f"sluice-pg-ca-{hashlib.sha256(pem.encode()).hexdigest()[:20]}.pem"
    if not path.is_file():
        fd, staging = tempfile.mkstemp(prefix=path.name + ".", dir=path.parent)
        with os.fdopen(fd, "w") as out:
            out.write(pem)
        os.chmod(staging, 0o644)
        os.replace(staging, path)
    return path


_PRIVATE: dict[int, Path] = {}  # process id -> its folder (a forked child makes its own)
_PRIVATE_LOCK = threading.Lock()


def _private_file(kind: str, pem: str) -> Path:
    """`pem` as a file readable by this user only (0600), in this process's own folder (0700), named by its hash."""
    with _PRIVATE_LOCK:
        folder = _PRIVATE.get(os.getpid())
        if folder is None:
            folder = _PRIVATE[os.getpid()] = Path(tempfile.mkdtemp(prefix="sluice-pg-client-"))
            atexit.register(shutil.rmtree, folder, True)
        path = folder / f"{kind}-{hashlib.sha256(pem.encode()).hexdigest()[:20]}.pem"
        if not path.is_file():
            staging = folder / (path.name + ".new")
            fd = os.open(staging, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w") as out:
                out.write(pem)
            os.replace(staging, path)
        return path


def explain_failure(text: str, mode: str) -> str | None:
    """What a TLS failure means and what to do, or None when `text` is no TLS failure (libpq's words)."""
    low = text.lower()
    if (refused := refused_certificate(text)) is not None:
        return f"TLS ({mode}): the server refused the client certificate (ssl.cert-pem): {refused[1]} ({text})"
    if "requires a valid client certificate" in low:
        return (f"the server requires a client certificate ({text}); set ssl.cert-pem and ssl.key-pem to one its CA "
                "signed")
    if "certificate authentication failed" in low:
        return (f"the server refused the client certificate for this user ({text}): its common name (CN) must be "
                "the user name (or one the server's pg_ident map allows)")
    if "does not match host name" in low or ("certificate" in low and "ssl" in low):
        return (f"TLS ({mode}) refused the server's certificate: {text}. Check that ssl.ca-pem holds the CA that "
                "signed it and that the host is a name the certificate lists")
    if "no encryption" in low:
        return (f"the server takes only TLS connections ({text}); set ssl.ca-pem to its CA (sslmode=verify-full "
                "follows)")
    if "server does not support ssl" in low:
        return (f"sslmode={mode} asks for TLS, but the server does not offer it; sluice does not fall back to "
                "plaintext: enable ssl on the server, or set sslmode=disable to connect in plaintext on a network you "
                "trust (without sslmode, verify-full is the default off loopback)")
    return None


def _is_loopback(host: str) -> bool:
    if host == "localhost" or host.startswith("/"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
