"""What a write does with a record the store refuses (Kafka Connect's `errors.*` names): fail, as by default, or send
it aside to a dead-letter target within bounds. The options every sink shares, their typed `ErrorPolicy`, and the
bounds' check; the target itself is planned by the sink framework (sluice/sink/_deadletters.py)."""

from __future__ import annotations

from dataclasses import dataclass

from sluice._errors import OptionError
from sluice._options import Option, Options, TypedOptions

TOLERANCES = ("none", "all")

ERROR_OPTIONS: tuple[Option, ...] = (
    Option(
        "errors.tolerance", "choice", "none",
        "none: a record the store refuses for what it holds fails the write, nothing lost. all: it goes to the "
        "dead-letter target (errors.deadletter.format) with its reason and the write goes on, within "
        "errors.max-records and errors.max-ratio (docs/reliability.md, \"When a record is refused\").",
        choices=TOLERANCES,
    ),
    Option(
        "errors.max-records", "int", None,
        "errors.tolerance=all: fail the write once more than this many records were sent aside (per write, or per "
        "micro-batch of a streaming query). Default: no bound.",
        minimum=0,
    ),
    Option(
        "errors.max-ratio", "float", None,
        "errors.tolerance=all: fail the write when more than this fraction of its records (0..1) were sent aside "
        "(per write, or per micro-batch). Default: no bound.",
        minimum=0, maximum=1,
    ),
    Option(
        "errors.record-as", "choice", "json",
        "errors.tolerance=all: how a dead letter holds the refused row: json (one text column, record: any target) or "
        "columns (the write's own columns beside the dead letter's, for a table target: tablestore, postgres, "
        "clickhouse, cassandra, ...).",
        choices=("json", "columns"),
    ),
    Option(
        "errors.meta", "str", None,
        "errors.tolerance=all: the MetaService (SQLite path or postgresql:// URL) where the driver notes each write's "
        "records sent aside, for sluice doctor to list the dead-letter targets with recent records. Default: "
        "$SLUICE_META where it is set, a table-store target's own meta, else not noted.",
    ),
    Option(
        "errors.deadletter.format", "str", None,
        "errors.tolerance=all: the sluice format refused records go to (kafka, tablestore, postgres, s2, ...); "
        "its options are set as errors.deadletter.<option>, e.g. errors.deadletter.table.",
    ),
    Option(
        "errors.deadletter.*", "prefix", None,
        "The dead-letter target's own options, each under errors.deadletter. (e.g. errors.deadletter.topic, "
        "errors.deadletter.kafka.bootstrap.servers).",
    ),
)


@dataclass(frozen=True)
class ErrorPolicy(TypedOptions):
    """The write's errors.* options, validated: `ErrorPolicy.of(opts)`. The dead-letter target's options stay in the
    parsed options (the sink framework plans the target from them)."""

    declared = ERROR_OPTIONS[:3]
    prefix = "errors."

    tolerance: str = "none"
    max_records: int | None = None
    max_ratio: float | None = None

    @property
    def tolerates(self) -> bool:
        return self.tolerance == "all"

    def over_bound(self, refused: int, seen: int) -> str | None:
        """Why `refused` records out of `seen` break a bound, naming the option; None within the bounds."""
        if self.max_records is not None and refused > self.max_records:
            return (f"{refused} records were refused, more than errors.max-records={self.max_records}: this looks "
                    "like a broken deployment, not a few bad records. Fix the cause (the dead-letter target holds "
                    "the refused records and their reasons) or raise errors.max-records.")
        if self.max_ratio is not None and seen and refused / seen > self.max_ratio:
            return (f"{refused} of {seen} records ({refused / seen:.2%}) were refused, more than "
                    f"errors.max-ratio={self.max_ratio}: this looks like a broken deployment, not a few bad records. "
                    "Fix the cause (the dead-letter target holds the refused records and their reasons) or raise "
                    "errors.max-ratio.")
        return None


def check_error_options(opts: Options) -> None:
    """The errors.* options together: a target exactly when records may be sent aside; bounds only then."""
    if opts["errors.tolerance"] == "all":
        if not opts["errors.deadletter.format"]:
            raise OptionError("errors.tolerance=all sends refused records to a dead-letter target, and none is set: "
                              "set errors.deadletter.format (e.g. 'kafka', 'tablestore', 'postgres', 's2') and that "
                              "format's options as errors.deadletter.<option>. Nothing is dropped silently.")
        return
    stray = sorted(k for k in opts.explicit if k.startswith("errors.") and k != "errors.tolerance")
    if stray:
        raise OptionError(f"{stray[0]} only applies with errors.tolerance=all (got errors.tolerance="
                          f"{opts['errors.tolerance']}); set .option('errors.tolerance', 'all') or remove {stray[0]}.")
