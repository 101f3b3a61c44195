"""Generate docs/options.md from the option declarations. `python -m sluice.docgen --write`."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from sluice._options import option_table
from sluice.engine import SINK_OPTIONS
from sluice.engine._refusals import ERROR_OPTIONS

OPTIONS_DOC = Path(__file__).resolve().parents[2] / "docs" / "options.md"  # src/sluice/docgen.py


def render_options_doc() -> str:
    from sluice.spark._registry import BUILTIN_FORMATS, data_source_class

    parts = [
        "# Options",
        "",
        "Generated from the option declarations by `make docs`; a test fails when this file is stale.",
        "Every option is validated before any write: unknown keys are errors that name the closest match.",
        "",
        "## Sink options shared by every sluice sink",
        "",
        option_table(SINK_OPTIONS),
        "",
        "## When a record is refused: options shared by every sluice sink",
        "",
        "What each connector counts as a refused record, and the guarantees: "
        "[docs/reliability.md](reliability.md#when-a-record-is-refused).",
        "",
        option_table(ERROR_OPTIONS),
        "",
    ]
    shared = {o.name for o in SINK_OPTIONS + ERROR_OPTIONS}
    for name in sorted(BUILTIN_FORMATS):
        source = data_source_class(name)
        write_spec = source.write_spec
        parts += [f"## format(\"{name}\")", ""]
        if write_spec is None:
            parts += ["Read only.", ""]
        else:
            own = [o for o in write_spec.options if o.name not in shared]
            parts += ["Writing:", "", option_table(own) if own else "Only the shared sink options.", ""]
        read_spec = source.read_spec
        if read_spec is not None:
            parts += ["Reading (`spark.read` / `spark.readStream`):", "", option_table(read_spec.options), ""]
    return "\n".join(parts)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--write", action="store_true", help="rewrite docs/options.md")
    args = parser.parse_args(argv)
    text = render_options_doc()
    if args.write:
        OPTIONS_DOC.write_text(text)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
