"""`python -m sluice.s2local`: the server process (what `sluice s2 serve` and LocalS2 run)."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from sluice.s2local._server import TOKEN_ENV, run_server


def add_serve_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=4243, help="port (0 = any free port; default 4243)")
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--data-dir", type=Path, default=Path(".sluice/s2"), help="where data lives (durable)")
    where.add_argument("--in-memory", action="store_true", help="keep everything in memory (tests)")
    parser.add_argument("--token-file", type=Path,
                        help=f"require 'authorization: Bearer TOKEN', TOKEN read from this file (or set {TOKEN_ENV})")
    parser.add_argument("--token", help="the token itself (discouraged: every `ps` listing shows it; use "
                                        f"--token-file or {TOKEN_ENV})")
    parser.add_argument("--certfile", type=Path, help="serve HTTPS with this certificate (PEM; with --keyfile)")
    parser.add_argument("--keyfile", type=Path, help="the private key of --certfile (PEM)")
    parser.add_argument("--ready-file", type=Path, help=argparse.SUPPRESS)


def serve_from_args(args: argparse.Namespace) -> int:
    token = os.environ.get(TOKEN_ENV) or None
    if args.token_file is not None:
        token = args.token_file.read_text().strip() or None
        if token is None:
            raise SystemExit(f"--token-file {args.token_file} is empty")
    if args.token:
        print(f"WARNING: --token puts the token in every process listing; use --token-file or {TOKEN_ENV}.",
              file=sys.stderr, flush=True)
        token = args.token
    if (args.certfile is None) != (args.keyfile is None):
        raise SystemExit("--certfile and --keyfile go together")
    run_server(args.host, args.port, None if args.in_memory else args.data_dir, token, args.ready_file,
               args.certfile, args.keyfile)
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m sluice.s2local", description="local S2-compatible server")
    add_serve_arguments(parser)
    return serve_from_args(parser.parse_args())


if __name__ == "__main__":
    raise SystemExit(main())
