"""The `sluice` command. Subcommands: formats, options, s2 serve, meta, table, postgres, ui, doctor."""

from __future__ import annotations

import argparse
import sys
from typing import Any


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
    write_spec = source.write_spec
    print("Writing:\n\n" + option_table(write_spec.options) if write_spec else "Read only.")
    read_spec = source.read_spec
    if read_spec is not None:
        print("\nReading:\n\n" + option_table(read_spec.options))
    lookup_spec = getattr(source, "lookup_spec", None)  # a source's (sluice.lookup); sinks have none
    if lookup_spec is not None:
        print("\nLookup joins (sluice.lookup):\n\n" + option_table(lookup_spec.options))
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
    _add_meta(sub)
    _add_table(sub)
    _add_postgres(sub)
    _add_ui(sub)
    _add_doctor(sub)
    return parser


def _add_ui(sub: Any) -> None:
    ui = sub.add_parser("ui", help="a web page over the MetaService and the live metrics of running writes")
    ui.add_argument("--meta", default=None,
                    help="database: a SQLite path or postgresql:// URL (default $SLUICE_META, else .sluice/meta.db)")
    ui.add_argument("--host", default="127.0.0.1", help="address to bind (default loopback; others need a token)")
    ui.add_argument("--port", type=int, default=8765, help="port (default 8765; 0 = any free one)")
    ui.add_argument("--advertise", default=None, help="the name executors reach this machine by (for their metrics)")
    ui.add_argument("--running-only", action="store_true", help="hide jobs that ended")
    ui.add_argument("--doctor-postgres", metavar="URL", help="also run sluice doctor on this database (password from "
                    "PGPASSWORD): its findings on the page and as sluice_doctor_* gauges")
    ui.add_argument("--doctor-postgres-options", metavar="FILE", help="the doctor's --postgres-options")
    ui.add_argument("--doctor-kafka", metavar="BOOTSTRAP", help="also run sluice doctor on these Kafka brokers")
    ui.add_argument("--doctor-kafka-options", metavar="FILE", help="the doctor's --kafka-options")
    ui.add_argument("--doctor-s2-basin", metavar="BASIN", help="also run sluice doctor on this S2 basin")
    ui.add_argument("--doctor-every", type=float, default=60.0, metavar="SECONDS",
                    help="seconds between the doctor's rounds (default 60)")
    ui.add_argument("--doctor", action="store_true", help="run sluice doctor on the MetaService alone (implied by "
                    "--doctor-postgres(-options) / --doctor-kafka(-options) / --doctor-s2-basin)")
    ui.add_argument("--dead-after", type=float, default=None, metavar="SECONDS", help="the doctor's --dead-after")
    ui.set_defaults(run=_ui)


def _ui(args: argparse.Namespace) -> int:
    import contextlib
    import os
    import threading

    from sluice.doctor import Doctor, DoctorWatch, Stores
    from sluice.ui import serve_ui

    # The token comes from the environment, never the command line, where `ps` would show it.
    token = os.environ.get("SLUICE_UI_TOKEN") or None
    watch = None
    if args.doctor or args.doctor_postgres or args.doctor_kafka or args.doctor_s2_basin or \
            args.doctor_postgres_options or args.doctor_kafka_options:
        stores = Stores(args.doctor_postgres, args.doctor_kafka, s2_basin=args.doctor_s2_basin,
                        postgres_options=args.doctor_postgres_options, kafka_options=args.doctor_kafka_options)
        watch = DoctorWatch(Doctor(args.meta, stores, args.dead_after), args.doctor_every).start()
    try:
        with serve_ui(args.meta, args.host, args.port, advertise=args.advertise, token=token,
                      include_ended=not args.running_only, doctor=watch) as server:
            shown = f"{server.url}/?token=..." if token else f"{server.url}/"
            print(f"sluice ui at {shown} (Prometheus: {server.url}/metrics); Ctrl-C ends it", flush=True)
            with contextlib.suppress(KeyboardInterrupt):
                threading.Event().wait()
    finally:
        if watch is not None:
            watch.stop()
    return 0


def _add_doctor(sub: Any) -> None:
    doctor = sub.add_parser("doctor", help="what pipelines left in each store (slots, staged rows, open transactions, "
                            "writer claims), whose it is, whether it is safe to remove; --fix removes it")
    doctor.add_argument("--meta", default=None, help="database: a SQLite path or postgresql:// URL (default "
                        "$SLUICE_META, else .sluice/meta.db)")
    doctor.add_argument("--postgres", metavar="URL", help="postgresql://user@host:port/dbname to examine; the "
                        "password comes from PGPASSWORD (never on the command line, where ps shows it)")
    doctor.add_argument("--postgres-options", metavar="FILE", help="a JSON or Java-properties file, on this "
                        "machine, of format(\"postgres\")'s connection options as a job passes them (sslmode, "
                        "ssl.ca-pem, ssl.cert-pem, ssl.key-pem, password, host/port/dbname/user or url); a job's "
                        "other options in it are left aside")
    doctor.add_argument("--kafka", metavar="BOOTSTRAP", help="Kafka bootstrap servers to examine")
    doctor.add_argument("--kafka-options", metavar="FILE", help="a JSON or Java-properties file, on this machine, "
                        "of format(\"sluice_kafka\")'s kafka.* options as a job passes them "
                        "(kafka.bootstrap.servers, kafka.security.protocol, kafka.ssl.*, kafka.sasl.*)")
    doctor.add_argument("--kafka-open-after", type=float, default=60.0, metavar="SECONDS",
                        help="report transactions open at least this long (default 60)")
    doctor.add_argument("--s2-basin", metavar="BASIN", help="S2 basin to examine (token from S2_ACCESS_TOKEN, "
                        "endpoints from S2_ACCOUNT_ENDPOINT / S2_BASIN_ENDPOINT)")
    doctor.add_argument("--s2-prefix", default="", metavar="PREFIX", help="only the basin's streams with this prefix")
    doctor.add_argument("--dead-letters-since", type=float, default=86400.0, metavar="SECONDS",
                        help="list the dead-letter targets (errors.tolerance=all) that received records this recently, "
                        "as writes noted them in the MetaService (default 86400: a day)")
    doctor.add_argument("--dead-after", type=float, default=None, metavar="SECONDS",
                        help="treat a job recorded running as dead after this long without a sign of life (unless "
                        "its pid runs on this host); default: never")
    doctor.add_argument("--fix", action="store_true", help="remove what belongs to stopped or dead jobs, asking first")
    doctor.add_argument("--yes", action="store_true", help="with --fix: do not ask about the items safe to remove "
                        "(anything else is still asked about)")
    doctor.set_defaults(run=_doctor)


def _doctor(args: argparse.Namespace) -> int:
    import time

    from sluice.doctor import Doctor, Stores

    doctor = Doctor(args.meta, Stores(args.postgres, args.kafka, args.kafka_open_after, args.s2_basin, args.s2_prefix,
                                      args.dead_letters_since, args.postgres_options, args.kafka_options),
                    args.dead_after)
    findings = doctor.examine()
    now = time.time()
    for finding in findings:
        print(finding.line(now))
    safe = sum(f.verdict.safe for f in findings)
    print(f"{len(findings)} item(s), {safe} safe to remove" + ("" if args.fix or not safe else
                                                              "; sluice doctor --fix removes them"))
    if not args.fix:
        return 0

    def ask(question: str) -> bool:
        try:
            return input(f"{question} [y/N] ").strip().lower() in ("y", "yes")
        except (EOFError, OSError):  # no terminal: nothing is removed without --yes
            print()
            return False

    failed = 0
    for action in doctor.fix(findings, ask, yes=args.yes):
        failed += action.what.startswith("refused")
        print(f"{'done' if action.done else 'not done'}: {action.finding.kind} {action.finding.name}: {action.what}")
    return 1 if failed else 0


def _add_postgres(sub: Any) -> None:
    postgres = sub.add_parser("postgres", help="change capture: list and drop sluice's replication slots")
    postgres.add_argument("--url", required=True, help="postgresql://user@host:port/dbname; the password comes from "
                          "PGPASSWORD (never on the command line, where ps shows it)")
    cmds = postgres.add_subparsers(dest="postgres_command", required=True)
    slots = cmds.add_parser("slots", help="sluice's logical replication slots and the WAL each holds back")
    slots.add_argument("--prefix", default="sluice_", help="slot name prefix (default sluice_; '' for all)")
    slots.set_defaults(run=_postgres_slots)
    drop = cmds.add_parser("drop-slot", help="drop a slot and the publication sluice created with its name")
    drop.add_argument("name")
    drop.add_argument("--keep-publication", action="store_true")
    drop.add_argument("--force", action="store_true", help="drop it even while a running query holds it")
    drop.set_defaults(run=_postgres_drop)


def _pg_connection(args: argparse.Namespace) -> Any:
    from urllib.parse import urlsplit

    from sluice import OptionError
    from sluice.connectors.postgres import Connection
    from sluice.connectors.postgres.changes import CHANGES_SPEC

    if urlsplit(args.url).password:
        raise OptionError("--url carries a password, which ps shows to every user of this machine; "
                          "put it in PGPASSWORD instead")
    return Connection.from_options(CHANGES_SPEC.parse({"url": args.url, "table": "-"}))


def _postgres_slots(args: argparse.Namespace) -> int:
    from sluice.connectors.postgres.changes import list_slots

    for slot in list_slots(_pg_connection(args), args.prefix):
        print(f"{slot.name}  database={slot.database}  query={slot.query or 'none'}  confirmed={slot.confirmed}  "
              f"retained_wal_bytes={slot.retained_bytes}  wal_status={slot.wal_status}"
              + (f"  inactive_since={slot.inactive_since}" if slot.inactive_since else ""))
    return 0


def _postgres_drop(args: argparse.Namespace) -> int:
    from sluice.connectors.postgres.changes import drop_slot

    drop_slot(_pg_connection(args), args.name, publication=not args.keep_publication, force=args.force)
    print(f"dropped slot {args.name}" + ("" if args.keep_publication else " (and its publication, if sluice's)"))
    return 0


def _add_meta(sub: Any) -> None:
    meta = sub.add_parser("meta", help="the MetaService: jobs, tables, lineage, consistent versions")
    meta.add_argument("--meta", default=None,
                      help="database: a SQLite path or postgresql:// URL (default $SLUICE_META, else .sluice/meta.db)")
    cmds = meta.add_subparsers(dest="meta_command", required=True)
    cmds.add_parser("jobs", help="every job with its status and tables").set_defaults(run=_meta_jobs)
    cmds.add_parser("tables", help="every table with its last completed barrier").set_defaults(run=_meta_tables)
    lineage = cmds.add_parser("lineage", help="table -> [job] -> table edges of running jobs")
    lineage.add_argument("--png", metavar="FILE", help="also draw it: tables with their last barrier, and jobs")
    lineage.add_argument("--all", action="store_true", help="include jobs that have ended")
    lineage.set_defaults(run=_meta_lineage)
    consistent = cmds.add_parser("consistent-version", help="the newest barrier all given tables completed")
    consistent.add_argument("tables", nargs="+")
    consistent.set_defaults(run=_meta_consistent)
    release = cmds.add_parser("release-job", help="end a job that died without finishing (frees its tables)")
    release.add_argument("job_id")
    release.set_defaults(run=_meta_release)


def _add_table(sub: Any) -> None:
    table = sub.add_parser("table", help="table-store maintenance: compact, vacuum")
    table.add_argument("--warehouse", default=None, help="folder or s3://bucket/prefix (default $SLUICE_WAREHOUSE, "
                       "else .sluice/warehouse); S3 settings from the AWS_* environment variables")
    table.add_argument("--meta", default=None, help="MetaService database (default $SLUICE_META, else .sluice/meta.db)")
    cmds = table.add_subparsers(dest="table_command", required=True)
    compact = cmds.add_parser("compact", help="rewrite a table's small files into few large ones (refused while "
                              "the table's writer runs: it compacts by itself)")
    compact.add_argument("name")
    compact.add_argument("--target-bytes", type=int, default=128 * 1024 * 1024)
    compact.set_defaults(run=_table_compact)
    vacuum = cmds.add_parser("vacuum", help="delete the data files, log entries and change data "
                                                    "no version a consistent read may open needs")
    vacuum.add_argument("name")
    vacuum.add_argument("--dry-run", action="store_true")
    vacuum.set_defaults(run=_table_vacuum)


def _table_compact(args: argparse.Namespace) -> int:
    from sluice.tablestore import compact

    metrics = compact(args.name, warehouse=args.warehouse, meta=_meta(args), target_bytes=args.target_bytes)
    print(f"compacted {args.name}: {metrics['numFilesRemoved']} files into {metrics['numFilesAdded']}")
    return 0


def _table_vacuum(args: argparse.Namespace) -> int:
    from sluice.tablestore import vacuum

    files = vacuum(args.name, warehouse=args.warehouse, meta=_meta(args), dry_run=args.dry_run)
    print(f"{'would delete' if args.dry_run else 'deleted'} {len(files)} file(s) of {args.name}")
    return 0


def _meta(args: argparse.Namespace) -> Any:
    from sluice.meta import MetaService

    return MetaService(args.meta)


def _meta_jobs(args: argparse.Namespace) -> int:
    for job in _meta(args).jobs():
        print(f"{job.job_id}  {job.status:<8}  {job.name}  sources={list(job.sources)}  sinks={list(job.sinks)}  "
              f"host={job.host} pid={job.pid}")
    return 0


def _meta_tables(args: argparse.Namespace) -> int:
    for table, last in _meta(args).tables().items():
        print(f"{table}  " + (f"barrier={last[0]} version={last[1]}" if last else "no barrier yet"))
    return 0


def _meta_lineage(args: argparse.Namespace) -> int:
    meta = _meta(args)
    for job in meta.jobs():
        if job.status == "running" or args.all:
            ended = "" if job.status == "running" else f"  ({job.status})"
            print(f"{', '.join(job.sources) or '(outside)'} -> [{job.name}] -> {', '.join(job.sinks)}{ended}")
    if args.png:
        from sluice.meta._picture import draw_lineage

        print(f"drew {draw_lineage(meta, args.png, include_ended=args.all)}")
    return 0


def _meta_consistent(args: argparse.Namespace) -> int:
    found = _meta(args).consistent_version(args.tables)
    print(f"barrier {found.barrier}")
    for table, version in found.versions.items():
        print(f"  {table}: version {version}")
    return 0


def _meta_release(args: argparse.Namespace) -> int:
    job = _meta(args).release_job(args.job_id)
    print(f"released {job.job_id} ({job.name}): its tables {list(job.sinks)} may be written by another job")
    return 0


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
