"""The ``sidecar`` command line: argument parsing and exit codes, nothing else.

Subcommands: ``version``, ``run``, ``config check``, ``status``, ``quarantine list|clear``,
``inspect``, ``scrub``, ``delete-partition`` (and more, see ``build_parser``). Each maps a
SidecarError to its ``exit_code`` (ConfigError → 2) and prints one clear line on stderr. Heavy
modules are imported inside the subcommand that needs them, so ``sidecar --help`` stays fast.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from sidecar import __version__
from sidecar.errors import ConfigError, SidecarError

__all__ = ["main"]


def _parse_set(items: Sequence[str]) -> dict[str, str]:
    overrides: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"--set takes KEY=VALUE with a dotted key, got {item!r}")
        overrides[key.strip()] = value
    return overrides


def _add_config_args(parser: argparse.ArgumentParser, *, file_required: bool = False) -> None:
    if file_required:
        parser.add_argument("file", type=Path, help="TOML configuration file")
    else:
        parser.add_argument(
            "-c", "--config", dest="file", type=Path, default=None, help="TOML configuration file"
        )
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override one setting by dotted path, e.g. s3.bucket=tiered "
        "(beats the file and SIDECAR_* variables)",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="sidecar",
        description="Tiered-storage sidecar for Apache Kafka: uploads rolled segments to S3, "
        "publishes KIP-405 metadata, serves tiered reads.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    sub.add_parser("version", help="print the version and exit")

    run = sub.add_parser("run", help="run the daemon until SIGTERM")
    _add_config_args(run)
    run.add_argument(
        "--log-dir",
        dest="log_dirs",
        action="append",
        default=None,
        type=Path,
        help="a broker log dir to watch (repeat for JBOD); = broker.log_dirs",
    )
    run.add_argument("--bootstrap-servers", default=None, help="= kafka.bootstrap_servers")
    run.add_argument("--log-level", default=None, help="= logging.level")
    run.add_argument(
        "--log-format", default=None, choices=("auto", "json", "console"), help="= logging.format"
    )

    config = sub.add_parser("config", help="configuration tools")
    config_sub = config.add_subparsers(dest="config_command", metavar="SUBCOMMAND", required=True)
    check = config_sub.add_parser(
        "check", help="validate a config file and print the effective config (secrets masked)"
    )
    _add_config_args(check, file_required=True)
    check.add_argument("--json", action="store_true", help="print JSON instead of TOML")
    config_sub.add_parser("docs", help="print the configuration reference (Markdown)")

    status = sub.add_parser(
        "status", help="per partition: local and tiered segments, copy lag, last error"
    )
    _add_config_args(status)
    status.add_argument("--json", action="store_true", help="print the status document")
    status.add_argument("--all", action="store_true", help="also partitions not tiered")
    status.add_argument(
        "--url", default=None, help="status URL (default: from metrics.host and metrics.port)"
    )

    quarantine = sub.add_parser(
        "quarantine", help="segments with corrupt bytes, which are not tiered: list or clear"
    )
    quarantine_sub = quarantine.add_subparsers(
        dest="quarantine_command", metavar="SUBCOMMAND", required=True
    )
    quarantine_list = quarantine_sub.add_parser(
        "list", help="list the quarantined segments (read from the state dir)"
    )
    _add_config_args(quarantine_list)
    quarantine_list.add_argument("--json", action="store_true", help="print JSON")
    quarantine_clear = quarantine_sub.add_parser(
        "clear",
        help="release quarantined segments: a running sidecar reads and checks them again"
        " within seconds (still corrupt: quarantined again; otherwise tiered)",
    )
    _add_config_args(quarantine_clear)
    quarantine_clear.add_argument("--topic", required=True)
    quarantine_clear.add_argument("--partition", type=int, required=True)
    quarantine_clear.add_argument(
        "--offset",
        type=int,
        default=None,
        help="only the segment with this base offset (default: every one of the partition)",
    )
    quarantine_clear.add_argument(
        "--topic-id",
        default=None,
        help="only entries of this topic id (default: every topic that had this name)",
    )

    broker = sub.add_parser(
        "broker-config",
        help="print the broker properties for broker-driven tiering through this sidecar",
    )
    _add_config_args(broker)
    broker.add_argument(
        "--plugin-jar",
        type=Path,
        default=None,
        help="where the broker finds the plugin jar"
        " (default /opt/kafka-tiered-sidecar/plugin/kafka-tiered-sidecar-plugin.jar)",
    )
    broker.add_argument(
        "--listener",
        default="PLAINTEXT",
        help="the broker listener its metadata manager's clients use (default PLAINTEXT)",
    )
    broker.add_argument(
        "--tcp", action="store_true", help="the plugin uses read_server.tcp_port, not the socket"
    )

    metadata = sub.add_parser("metadata", help="remote log metadata tools")
    metadata_sub = metadata.add_subparsers(
        dest="metadata_command", metavar="SUBCOMMAND", required=True
    )
    decode = metadata_sub.add_parser(
        "decode", help="decode __remote_log_metadata values to JSON lines"
    )
    source = decode.add_mutually_exclusive_group(required=True)
    source.add_argument(
        "--hex",
        dest="hex_values",
        action="append",
        metavar="VALUE",
        help="a record value in hex (repeatable)",
    )
    source.add_argument("--bootstrap-server", help="read the topic from this broker")
    decode.add_argument("--topic", default="__remote_log_metadata", help="metadata topic")
    decode.add_argument(
        "--max-messages",
        type=int,
        default=None,
        help="stop after this many records (default: read to the end)",
    )

    inspect = sub.add_parser(
        "inspect", help="show partitions and segments of a log dir, partition dir or segment"
    )
    inspect.add_argument("path", type=Path, help="a log dir, a partition dir or a .log file")
    inspect.add_argument("--json", action="store_true", help="machine-readable output")
    inspect.add_argument(
        "--verify",
        action="store_true",
        help="check every batch CRC and the indexes; exit 1 on problems",
    )
    inspect.add_argument("--records", action="store_true", help="dump decoded records")

    # --- the archive audit on Spark (issue 8; needs the `spark` extra)
    spark = sub.add_parser("spark", help="Spark jobs over the tiered archive")
    spark_sub = spark.add_subparsers(dest="spark_command", metavar="SUBCOMMAND", required=True)
    from sidecar.spark.verify import add_arguments as add_verify_arguments

    add_verify_arguments(
        spark_sub.add_parser(
            "verify", help="check every tiered segment's CRCs, checksums and offsets on Spark"
        )
    )

    # --- orphan scrub and partition deletion (issue 6)
    scrub = sub.add_parser(
        "scrub", help="delete unreferenced objects and stale multipart uploads from the bucket"
    )
    _add_config_args(scrub)
    scrub.add_argument("--dry-run", action="store_true", help="report, delete nothing")
    scrub.add_argument("--json", action="store_true", help="print the report as JSON")
    delete_partition = sub.add_parser(
        "delete-partition",
        help="mark a partition's tiered data for deletion (KIP-405 DELETE_PARTITION_MARKED)",
    )
    _add_config_args(delete_partition)
    delete_partition.add_argument("--topic", required=True)
    delete_partition.add_argument("--partition", type=int, required=True)
    delete_partition.add_argument(
        "--topic-id", default=None, help="the topic id, for a topic that no longer exists"
    )

    read = sub.add_parser("read", help="print tiered records from the read socket (like kcat)")
    _add_config_args(read)
    where = read.add_mutually_exclusive_group()
    where.add_argument("--socket", type=Path, default=None, help="the read socket's path")
    where.add_argument("--url", default=None, help="the loopback TCP URL of the read server")
    read.add_argument("--topic", required=True)
    read.add_argument("--partition", type=int, required=True)
    start = read.add_mutually_exclusive_group(required=True)
    start.add_argument("--offset", type=int, default=None, help="first offset to print")
    start.add_argument(
        "--timestamp",
        type=int,
        default=None,
        help="start at the first record at or after (ms); -2 earliest, -3 max timestamp",
    )
    read.add_argument("--count", type=int, default=None, help="stop after this many records")
    read.add_argument("--json", action="store_true", help="one JSON object per record (kcat -J)")
    read.add_argument(
        "--isolation",
        choices=("read_uncommitted", "read_committed"),
        default="read_uncommitted",
        help="a consumer's isolation.level: read_committed leaves out aborted transactions"
        " (default read_uncommitted, as Kafka's consumers)",
    )
    return parser


def _run_overrides(args: argparse.Namespace) -> dict[str, str]:
    overrides = _parse_set(args.overrides)
    if args.log_dirs:
        overrides["broker.log_dirs"] = ",".join(str(p) for p in args.log_dirs)
    if args.bootstrap_servers:
        overrides["kafka.bootstrap_servers"] = args.bootstrap_servers
    if args.log_level:
        overrides["logging.level"] = args.log_level.upper()
    if args.log_format:
        overrides["logging.format"] = args.log_format
    return overrides


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``sidecar`` console script; returns the process exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return _dispatch(args)
    except SidecarError as exc:
        print(f"sidecar: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        return 130


def _dispatch(args: argparse.Namespace) -> int:
    from sidecar import config as cfg

    if args.command == "version":
        print(f"kafka-tiered-sidecar {__version__}")
        return 0
    if args.command == "config" and args.config_command == "docs":
        print(cfg.reference_markdown(), end="")
        return 0
    if args.command == "config":
        config = cfg.load_config(args.file, overrides=_parse_set(args.overrides))
        data = cfg.masked(config)
        print(json.dumps(data, indent=2) if args.json else cfg.to_toml(data), end="")
        if args.json:
            print()
        return 0
    if args.command == "run":
        config = cfg.load_config(args.file, overrides=_run_overrides(args))
        from sidecar.app import run_daemon

        return run_daemon(config)
    if args.command == "status":
        return _status(args)
    if args.command == "quarantine":
        from sidecar.tiering import _cli as tiering_cli

        config = cfg.load_config(args.file, overrides=_parse_set(args.overrides))
        if args.quarantine_command == "list":
            return tiering_cli.quarantine_list_command(config, as_json=args.json, out=sys.stdout)
        return tiering_cli.quarantine_clear_command(
            config,
            topic=args.topic,
            partition=args.partition,
            offset=args.offset,
            topic_id=args.topic_id,
            out=sys.stdout,
            err=sys.stderr,
        )
    if args.command == "broker-config":
        from sidecar.broker_config import DEFAULT_PLUGIN_JAR, broker_config_command

        config = cfg.load_config(args.file, overrides=_parse_set(args.overrides))
        return broker_config_command(
            config,
            plugin_jar=args.plugin_jar or DEFAULT_PLUGIN_JAR,
            listener=args.listener,
            tcp=args.tcp,
            out=sys.stdout,
        )
    if args.command == "metadata":
        from sidecar.metadata_cli import decode_command

        return decode_command(
            hex_values=args.hex_values,
            bootstrap_server=args.bootstrap_server,
            topic=args.topic,
            max_messages=args.max_messages,
            out=sys.stdout,
        )
    if args.command == "spark":
        from sidecar.spark.verify import verify_command

        return verify_command(args)
    if args.command == "inspect":
        from sidecar.kafka.inspect import run_inspect

        return run_inspect(
            args.path, as_json=args.json, verify=args.verify, records=args.records, out=sys.stdout
        )
    if args.command in ("scrub", "delete-partition"):  # issue 6
        from sidecar.retention import _cli as retention_cli

        config = cfg.load_config(args.file, overrides=_parse_set(args.overrides))
        if args.command == "scrub":
            return retention_cli.scrub_command(
                config, dry_run=args.dry_run, as_json=args.json, out=sys.stdout
            )
        return retention_cli.delete_partition_command(
            config,
            topic=args.topic,
            partition=args.partition,
            topic_id=args.topic_id,
            out=sys.stdout,
        )
    if args.command == "read":
        from sidecar.readserver._cli import read_command

        socket_path = args.socket
        if socket_path is None and args.url is None:
            from sidecar.readserver.app import socket_path_for

            config = cfg.load_config(args.file, overrides=_parse_set(args.overrides))
            socket_path = socket_path_for(config)
        return read_command(
            socket_path=socket_path,
            url=args.url,
            topic=args.topic,
            partition=args.partition,
            offset=args.offset,
            timestamp=args.timestamp,
            count=args.count,
            as_json=args.json,
            out=sys.stdout,
            err=sys.stderr,
            isolation=args.isolation,
        )
    raise AssertionError(f"unhandled command {args.command}")  # pragma: no cover


def _status(args: argparse.Namespace) -> int:
    import urllib.error
    import urllib.request

    from sidecar import config as cfg
    from sidecar.status import render_status

    url = args.url
    if url is None:
        config = cfg.load_config(args.file, overrides=_parse_set(args.overrides))
        url = f"http://{config.metrics.host}:{config.metrics.port}/v1/status"
    if not url.startswith(("http://", "https://")):
        raise ConfigError(f"--url must be an http(s) URL, not {url!r}")
    try:
        with urllib.request.urlopen(url, timeout=10) as response:  # noqa: S310 - checked above
            document = json.load(response)
    except urllib.error.HTTPError as exc:
        print(
            f"sidecar: {url} answered {exc.code}: {exc.read().decode(errors='replace')}",
            file=sys.stderr,
        )
        return 1
    except OSError as exc:
        print(f"sidecar: cannot reach the running sidecar at {url}: {exc}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(document, indent=2))
        return 0
    print(f"broker {document['broker_id']}  ready={document['ready']}  {document['checks']}")
    print(render_status(document["partitions"], all_partitions=args.all), end="")
    return 0
