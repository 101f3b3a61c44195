"""TLS of format("postgres"): which sslmode a connection uses, the CA it trusts, and what a TLS failure means.

libpq's own default (sslmode=prefer) tries TLS without checking the certificate and falls back to plaintext
without saying: sluice never leaves the choice to it. The connection string always carries an explicit sslmode:
verify-full unless told otherwise (`ssl.ca-pem`'s CA, else the system's), except on loopback or a Unix socket, where
the traffic never leaves the machine and `disable` is the default; plaintext to another host only when asked
(`sslmode=disable`). The CA travels as PEM text inside the options; libpq wants a
file, so each process that connects writes it to its own temp folder (executors have no file of the driver's).
"""

from __future__ import annotations

import hashlib
import ipaddress
import os
import tempfile
from pathlib import Path

from sluice.connector import Option, OptionError, Options

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
)

# URL parameters that name a file on the driver: an executor may have no such file, so they are refused.
_FILE_PARAMS = ("sslrootcert", "sslcert", "sslkey", "sslcrl", "sslcrldir", "passfile")


def resolve(opts: Options, params: dict[str, str], host: str) -> tuple[str, str | None]:
    """(sslmode, CA PEM or None) from the options and the url's parameters, checked on the driver."""
    for name in _FILE_PARAMS:
        if name in params and not (name == "sslrootcert" and params[name] == "system"):
            raise OptionError(f"option 'url' sets {name}, a file on the driver that executors may not have; give the "
                              "CA's PEM text in option 'ssl.ca-pem' instead (client certificates are not supported)")
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
        mode = "verify-full" if ca or params.get("sslrootcert") == "system" or not _is_loopback(host) else "disable"
    params.pop("sslrootcert", None)
    return mode, ca


def libpq_params(mode: str, ca_pem: str | None) -> dict[str, str]:
    """The connection parameters of TLS for this process: sslmode, and sslrootcert (a file of this machine)."""
    if mode == "disable":
        return {"sslmode": "disable"}
    if ca_pem:
        return {"sslmode": mode, "sslrootcert": str(ca_file(ca_pem))}
    # libpq refuses sslrootcert=system with a mode weaker than verify-full
    return {"sslmode": mode, "sslrootcert": "system"} if mode == "verify-full" else {"sslmode": mode}


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


def explain_failure(text: str, mode: str) -> str | None:
    """What a TLS failure means and what to do, or None when `text` is no TLS failure (libpq's words)."""
    low = text.lower()
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
