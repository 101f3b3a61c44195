"""The `sluice` command. Subcommands: formats, options, s2 serve."""

from __future__ import annotations

import argparse
import sys


def _formats(_: argparse.Namespace) -> int:
    from sluice.spark._registry import BUILTIN_FORMATS

    for name in sorted(BUILTIN_FORMATS):
        print(name)
    return 0


def _options(args: argparse.Namespace) -> int:
    from sluice._options import option_table
    from sluice.engine import SINK_OPTIONS
    from sluice.spark._registry import data_source_class

    if not args.format:
        print(option_table(SINK_OPTIONS))
        return 0
    source = data_source_class(args.format)
    print("Writing:\n\n" + option_table(source.option_spec().options))
    read_spec = source.read_option_spec()
    if read_spec is not None:
        print("\nReading:\n\n" + option_table(read_spec.options))
    return 0


def build_parser() -> argparse.ArgumentParser:
    from sluice import __version__

    parser = argparse.ArgumentParser(prog="sluice", description="Connectors for PySpark.")
    parser.add_argument("--version", action="version", version=f"sluice {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("formats", help="list the formats sluice.register() adds").set_defaults(run=_formats)
    options = sub.add_parser("options", help="print the options of a format (default: the shared sink options)")
    options.add_argument("format", nargs="?")
    options.set_defaults(run=_options)

    from sluice.s2local.__main__ import add_serve_arguments, serve_from_args

    s2 = sub.add_parser("s2", help="the local S2-compatible server").add_subparsers(dest="s2_command", required=True)
    serve = s2.add_parser("serve", help="serve S2's API on this machine (default 127.0.0.1:4243, data in .sluice/s2)")
    add_serve_arguments(serve)
    serve.set_defaults(run=serve_from_args)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from sluice import SluiceError

    try:
        return args.run(args)
    except SluiceError as error:
        print(f"sluice: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
