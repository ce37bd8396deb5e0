"""The ``sidecar`` command line: argument parsing and exit codes, nothing else.

Subcommands: ``version``, ``run``, ``config check``, ``status``, ``quarantine list|clear``,
``inspect``, ``scrub``, ``delete-partition`` (and more, see ``build_parser``). Heavy modules are
imported inside the subcommand that needs them, so ``sidecar --help`` stays fast.

One error path serves every command (:func:`main`): a known failure prints one line on stderr,
``sidecar: error: <what>`` (with where and what to do in the message), and exits with a
documented code:

====  ==============================================================================
 0    success
 1    the command ran and found a problem, or a dependency (Kafka, S3, a file) failed
 2    usage or configuration error (bad flag, invalid config, unknown ``SIDECAR_*`` key)
 3    a required tool is missing (java, mvn, weed)
 130  interrupted (Ctrl-C)
 143  terminated (SIGTERM), after the same cleanup as Ctrl-C
====  ==============================================================================

``--debug`` (before the subcommand) prints the traceback as well. A closed stdout (``sidecar
inspect … | head``) ends the command quietly with exit 0.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import signal
import sys
import threading
import time
import traceback
import urllib.parse
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from sidecar import __version__
from sidecar.errors import CommandError, ConfigError, SidecarError

if TYPE_CHECKING:
    from sidecar.config import SidecarConfig

__all__ = ["main"]


def _parse_set(items: Sequence[str]) -> dict[str, str]:
    overrides: dict[str, str] = {}
    for position, item in enumerate(items, 1):
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            # the item is not echoed: a mistyped KEY:VALUE may carry a secret
            raise ConfigError(
                f"--set takes KEY=VALUE with a dotted key; item {position} has no '=' before"
                " its value"
                if not sep
                else f"--set takes KEY=VALUE; item {position} has no key"
            )
        overrides[key.strip()] = value
    return overrides


def _add_config_args(parser: argparse.ArgumentParser, *, positional: bool = False) -> None:
    parser.add_argument(
        "-c", "--config", dest="file", type=Path, default=None, help="TOML configuration file"
    )
    if positional:
        # `config check FILE` predates -c; both spellings stay accepted
        parser.add_argument(
            "positional_file", nargs="?", type=Path, default=None, help=argparse.SUPPRESS
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


def _start_offset(text: str) -> int:
    """``--offset``: a non-negative offset, or Kafka's specials -2/beginning and -1/end."""
    words = {"beginning": -2, "earliest": -2, "end": -1, "latest": -1}
    if text.strip().lower() in words:
        return words[text.strip().lower()]
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an offset") from None
    if value < -2:
        raise argparse.ArgumentTypeError(
            f"{value} is not an offset: give 0 or more, -2 (beginning) or -1 (end)"
        )
    return value


def _positive_int(text: str) -> int:
    """``--count``, ``--max-messages``: 1 or more (0 or less would print nothing and exit 0,
    which reads as success)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} is not 1 or more")
    return value


def _http_url(text: str) -> str:
    """``--url``: an ``http://`` or ``https://`` URL; anything else is a usage error, not a
    failed connection."""
    parts = urllib.parse.urlsplit(text)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not an http(s) URL (e.g. http://127.0.0.1:9400)"
        )
    return text


def _add_log_level_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--log-level",
        default="WARNING",
        choices=("DEBUG", "INFO", "WARNING", "ERROR"),
        type=str.upper,
        help="log level on stderr (default WARNING: the report on stdout says what happened)",
    )


def _add_bootstrap_arg(parser: argparse.ArgumentParser, *, help_text: str) -> None:
    """``--bootstrap-server`` as Kafka's tools spell it; ``--bootstrap-servers`` is an alias."""
    parser.add_argument(
        "--bootstrap-server",
        "--bootstrap-servers",
        dest="bootstrap_servers",
        default=None,
        metavar="HOST:PORT[,HOST:PORT]",
        help=help_text,
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="sidecar",
        description="Tiered-storage sidecar for Apache Kafka: uploads rolled segments to S3, "
        "publishes KIP-405 metadata, serves tiered reads.",
    )
    parser.add_argument(
        "--version", action="version", version=f"kafka-tiered-sidecar {__version__}"
    )
    parser.add_argument(
        "--debug",
        action="store_true",
        help="on an error, print the traceback too (default: one line on stderr)",
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
    _add_bootstrap_arg(run, help_text="= kafka.bootstrap_servers (comma-separated)")
    run.add_argument(
        "--log-level",
        default=None,
        choices=("DEBUG", "INFO", "WARNING", "ERROR"),
        type=_log_level,
        help="= logging.level",
    )
    run.add_argument(
        "--log-format", default=None, choices=("auto", "json", "console"), help="= logging.format"
    )

    config = sub.add_parser("config", help="configuration tools")
    config_sub = config.add_subparsers(dest="config_command", metavar="SUBCOMMAND", required=True)
    check = config_sub.add_parser(
        "check", help="validate a config file and print the effective config (secrets masked)"
    )
    _add_config_args(check, positional=True)
    check.add_argument("--json", action="store_true", help="print JSON instead of TOML")
    check.add_argument(
        "--effective",
        action="store_true",
        help="print the whole effective config (the default output; accepted for clarity)",
    )
    config_sub.add_parser("docs", help="print the configuration reference (Markdown)")

    status = sub.add_parser(
        "status", help="per partition: local and tiered segments, copy lag, last error"
    )
    _add_config_args(status)
    status.add_argument("--json", action="store_true", help="print the status document")
    status.add_argument("--all", action="store_true", help="also partitions not tiered")
    status.add_argument(
        "--url",
        type=_http_url,
        default=None,
        help="status URL (default: from metrics.host and metrics.port)",
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
    broker.add_argument(
        "--check",
        action="store_true",
        help="ask the running broker (DescribeConfigs) whether it has these properties; exit 1"
        " when one is missing or differs",
    )
    broker.add_argument(
        "--broker-id",
        type=int,
        default=None,
        help="with --check: the broker to ask (default broker.broker_id, or the log dirs'"
        " meta.properties)",
    )
    broker.add_argument("--json", action="store_true", help="with --check: a JSON document")

    metadata = sub.add_parser("metadata", help="remote log metadata tools")
    metadata_sub = metadata.add_subparsers(
        dest="metadata_command", metavar="SUBCOMMAND", required=True
    )
    decode = metadata_sub.add_parser(
        "decode", help="decode __remote_log_metadata values to JSON lines"
    )
    # --hex VALUE, or the topic: from --bootstrap-server, else from the cluster of -c FILE
    # (with its [kafka] security settings: SASL, TLS)
    source = decode.add_mutually_exclusive_group()
    source.add_argument(
        "--hex",
        dest="hex_values",
        action="append",
        metavar="VALUE",
        help="a record value in hex (repeatable)",
    )
    source.add_argument(
        "--bootstrap-server",
        "--bootstrap-servers",
        dest="bootstrap_server",
        help="read the topic from this broker",
    )
    _add_config_args(decode)
    decode.add_argument(
        "--topic", default=None, help="metadata topic (default: remote_log_metadata.topic)"
    )
    decode.add_argument(
        "--max-messages",
        type=_positive_int,
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

    # --- the archive audit on Spark (needs the `spark` extra)
    spark = sub.add_parser("spark", help="Spark jobs over the tiered archive")
    spark_sub = spark.add_subparsers(dest="spark_command", metavar="SUBCOMMAND", required=True)
    from sidecar.spark.verify import add_arguments as add_verify_arguments

    add_verify_arguments(
        spark_sub.add_parser(
            "verify", help="check every tiered segment's CRCs, checksums and offsets on Spark"
        )
    )

    # --- orphan scrub and partition deletion
    scrub = sub.add_parser(
        "scrub", help="delete unreferenced objects and stale multipart uploads from the bucket"
    )
    _add_config_args(scrub)
    scrub_mode = scrub.add_mutually_exclusive_group()
    scrub_mode.add_argument(
        "--dry-run", action="store_true", help="report, delete nothing (the default)"
    )
    scrub_mode.add_argument(
        "--execute", action="store_true", help="delete the orphans and abort the stale uploads"
    )
    scrub.add_argument("--json", action="store_true", help="print the report as JSON")
    _add_log_level_arg(scrub)
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
    delete_partition.add_argument(
        "--force",
        action="store_true",
        help="mark a partition that still exists in the cluster, or that the topic does not have",
    )
    delete_partition.add_argument(
        "--yes", "-y", action="store_true", help="do not ask for confirmation"
    )
    delete_partition.add_argument(
        "--dry-run",
        action="store_true",
        help="check and show what would be published; publish nothing",
    )
    _add_log_level_arg(delete_partition)

    read = sub.add_parser("read", help="print tiered records from the read socket (like kcat)")
    _add_config_args(read)
    where = read.add_mutually_exclusive_group()
    where.add_argument("--socket", type=Path, default=None, help="the read socket's path")
    where.add_argument(
        "--url", type=_http_url, default=None, help="the loopback TCP URL of the read server"
    )
    read.add_argument("--topic", required=True)
    read.add_argument("--partition", type=int, required=True)
    start = read.add_mutually_exclusive_group(required=True)
    start.add_argument(
        "--offset",
        type=_start_offset,
        default=None,
        help="first offset to print; -2 or 'beginning' = the first tiered offset, -1 or 'end' ="
        " the end of the tiered data (as Kafka's ListOffsets and kcat -o)",
    )
    start.add_argument(
        "--timestamp",
        type=int,
        default=None,
        help="start at the first record at or after (ms); -2 earliest, -3 max timestamp",
    )
    read.add_argument(
        "--count",
        type=_positive_int,
        default=None,
        help="stop after this many records (default: to the end of the tiered data)",
    )
    read.add_argument("--json", action="store_true", help="one JSON object per record (kcat -J)")
    read.add_argument(
        "--isolation",
        choices=("read_uncommitted", "read_committed"),
        default="read_uncommitted",
        help="a consumer's isolation.level: read_committed leaves out aborted transactions"
        " (default read_uncommitted, as Kafka's consumers)",
    )
    return parser


def _log_level(text: str) -> str:
    """A level as logging spells it, any case; WARN is WARNING, as in Python's logging."""
    level = text.upper()
    return "WARNING" if level == "WARN" else level


def _run_overrides(args: argparse.Namespace) -> dict[str, str]:
    overrides = _parse_set(args.overrides)
    if args.log_dirs:
        overrides["broker.log_dirs"] = ",".join(str(p) for p in args.log_dirs)
    if args.bootstrap_servers:
        overrides["kafka.bootstrap_servers"] = args.bootstrap_servers
    if args.log_level:
        overrides["logging.level"] = args.log_level
    if args.log_format:
        overrides["logging.format"] = args.log_format
    return overrides


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``sidecar`` console script; returns the process exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    # --debug is accepted anywhere before a `--`, not only before the subcommand
    cut = argv.index("--") if "--" in argv else len(argv)
    debug = "--debug" in argv[:cut]
    argv = [a for i, a in enumerate(argv) if not (i < cut and a == "--debug")]
    parser = build_parser()
    args = parser.parse_args(argv)
    args.debug = debug
    if args.command != "run":
        from sidecar.observability.logging import configure_logging

        # a one-shot command's stdout is its output (a table, JSON): warnings of the code it
        # runs go to stderr (structlog unconfigured would print them on stdout); commands
        # that load a config set this up again with its secrets
        configure_logging(level="INFO" if debug else "WARNING", stream=sys.stderr)
        if not debug:
            # they report Kafka failures in their own error line; aiokafka's retry chatter
            # would only repeat it
            logging.getLogger("aiokafka").setLevel(logging.CRITICAL)
    try:
        # the daemon handles SIGTERM itself
        with _sigterm_as_interrupt(enabled=args.command != "run"):
            return _dispatch(args)
    except BrokenPipeError:
        return _closed_pipe()
    except _Terminated:
        return 128 + signal.SIGTERM
    except KeyboardInterrupt:
        return 130
    except Exception as exc:  # noqa: BLE001 - the one place every failure becomes one line
        message, code = describe_failure(exc)
        if debug:
            traceback.print_exception(exc, file=sys.stderr)
        elif code == 1 and not isinstance(exc, SidecarError | OSError):
            message += " (run with --debug for the traceback)"
        _print_error(message)
        return code


class _Terminated(KeyboardInterrupt):
    """SIGTERM of a one-shot command, raised where the command is, as Ctrl-C is: its
    ``finally`` blocks and context managers run (the scrub's temporary store is removed,
    clients are closed) before the process exits 143."""


def _terminate(signum: int, frame: object) -> None:
    raise _Terminated


@contextlib.contextmanager
def _sigterm_as_interrupt(*, enabled: bool) -> Iterator[None]:
    """While a one-shot command runs, SIGTERM raises :class:`_Terminated` instead of ending
    the process at once (its default action), which would skip every cleanup."""
    if not enabled or threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, _terminate)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _print_error(message: str) -> None:
    with contextlib.suppress(BrokenPipeError):  # stderr closed too: nothing left to tell
        print(f"sidecar: error: {message}", file=sys.stderr)


def _closed_pipe() -> int:
    """The reader of stdout went away (``| head``): stop quietly, as Unix tools do."""
    # Python flushes stdout at exit and would report the broken pipe again; point the file
    # descriptor at /dev/null so that flush succeeds
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):  # stdout is not a real file (tests)
        pass
    return 0


def describe_failure(exc: BaseException) -> tuple[str, int]:
    """One line (what, where, what to do) and the exit code for a failure that ends a command."""
    if isinstance(exc, SidecarError):
        return str(exc), exc.exit_code
    kafka_error = _kafka_failure(exc)
    if kafka_error is not None:
        return kafka_error, 1
    if isinstance(exc, ModuleNotFoundError) and exc.name is not None:
        root = exc.name.split(".")[0]
        if root in ("pyspark", "pyarrow"):
            return (
                f"this command needs {root}: install the spark extra"
                " (pip install 'kafka-tiered-sidecar[spark]')",
                3,
            )
    if isinstance(exc, PermissionError):
        return f"permission denied: {exc.filename or exc}", 1
    if isinstance(exc, FileNotFoundError):
        return f"no such file or directory: {exc.filename or exc}", 1
    if isinstance(exc, TimeoutError) and not str(exc):  # an OSError too, but asyncio's has no text
        return "timed out waiting for Kafka or S3 (check the address and that it answers)", 1
    if isinstance(exc, OSError):
        where = f"{exc.filename}: " if exc.filename else ""
        return f"{where}{exc.strerror or str(exc) or type(exc).__name__}", 1
    return f"unexpected {type(exc).__name__}: {exc}", 1


def _kafka_failure(exc: BaseException) -> str | None:
    """A one-line message for aiokafka's errors, which name no address of their own."""
    module = type(exc).__module__ or ""
    if not module.startswith("aiokafka"):
        return None
    name = type(exc).__name__
    text = str(exc) or name
    if name in ("KafkaConnectionError", "NodeNotReadyError", "KafkaTimeoutError"):
        return (
            f"cannot reach Kafka: {text}; check --bootstrap-server / kafka.bootstrap_servers"
            " and kafka.security_protocol"
        )
    if "Authentication" in name or "Authorization" in name or "Sasl" in name:
        return f"Kafka refused the client: {text}; check the [kafka] SASL/TLS settings and ACLs"
    return f"Kafka error {name}: {text}"


def _load_config(path: Path | None, *, overrides: dict[str, str]) -> SidecarConfig:
    """The configuration, its secrets added to what the logging set up in :func:`main`
    redacts (a library's error or debug line may carry one)."""
    from sidecar import config as cfg
    from sidecar.observability.logging import redact_secrets

    config = cfg.load_config(path, overrides=overrides)
    redact_secrets(cfg.secret_values(config))
    return config


def _dispatch(args: argparse.Namespace) -> int:
    from sidecar import config as cfg

    if args.command == "version":
        print(f"kafka-tiered-sidecar {__version__}")
        return 0
    if args.command == "config" and args.config_command == "docs":
        print(cfg.reference_markdown(), end="")
        return 0
    if args.command == "config":
        return _config_check(args)
    if args.command == "run":
        config = _load_config(args.file, overrides=_run_overrides(args))
        from sidecar.app import run_daemon

        return run_daemon(config)
    if args.command == "status":
        return _status(args)
    if args.command == "quarantine":
        from sidecar.tiering import _cli as tiering_cli

        config = _load_config(args.file, overrides=_parse_set(args.overrides))
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

        if not args.check and (args.json or args.broker_id is not None):
            # without --check the output is properties text: --json would promise JSON
            flag = "--json" if args.json else "--broker-id"
            raise ConfigError(f"{flag} goes with --check (the properties print as text)")
        config = _load_config(args.file, overrides=_parse_set(args.overrides))
        return broker_config_command(
            config,
            plugin_jar=args.plugin_jar or DEFAULT_PLUGIN_JAR,
            listener=args.listener,
            tcp=args.tcp,
            out=sys.stdout,
            check=args.check,
            broker_id=args.broker_id,
            as_json=args.json,
        )
    if args.command == "metadata":
        from sidecar.metadata_cli import decode_command

        decode_config: cfg.SidecarConfig | None = None
        if not args.hex_values:
            if args.bootstrap_server is None and args.file is None:
                raise ConfigError(
                    "give --hex VALUE, --bootstrap-server HOST:PORT, or -c FILE (the cluster and"
                    " security settings of a sidecar config)"
                )
            overrides = _parse_set(args.overrides)
            if args.bootstrap_server is not None:
                overrides["kafka.bootstrap_servers"] = args.bootstrap_server
            decode_config = _load_config(args.file, overrides=overrides)
        return decode_command(
            hex_values=args.hex_values,
            config=decode_config,
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
    if args.command in ("scrub", "delete-partition"):
        from sidecar.retention import _cli as retention_cli

        config = _load_config(args.file, overrides=_parse_set(args.overrides))
        level = "DEBUG" if args.debug else args.log_level
        if args.command == "scrub":
            return retention_cli.scrub_command(
                config,
                dry_run=not args.execute,
                as_json=args.json,
                out=sys.stdout,
                log_level=level,
            )
        return retention_cli.delete_partition_command(
            config,
            topic=args.topic,
            partition=args.partition,
            topic_id=args.topic_id,
            out=sys.stdout,
            force=args.force,
            yes=args.yes,
            dry_run=args.dry_run,
            log_level=level,
        )
    if args.command == "read":
        from sidecar.readserver._cli import read_command

        socket_path = args.socket
        if socket_path is None and args.url is None:
            from sidecar.readserver.app import socket_path_for

            config = _load_config(args.file, overrides=_parse_set(args.overrides))
            socket_path = socket_path_for(config)
            if not socket_path.exists():
                origin = f"the config {args.file}" if args.file else "the default state_dir"
                raise CommandError(
                    f"no read socket at {socket_path} (from {origin}): is `sidecar run` running"
                    " here? Pass -c with the daemon's config file, or --socket PATH / --url URL"
                )
        elif socket_path is not None and not socket_path.exists():
            raise CommandError(f"no read socket at {socket_path}: is `sidecar run` running here?")
        offset, timestamp = args.offset, args.timestamp
        if offset is not None and offset < 0:  # -2/-1 are ListOffsets specials, as timestamps
            offset, timestamp = None, offset
        return read_command(
            socket_path=socket_path,
            url=args.url,
            topic=args.topic,
            partition=args.partition,
            offset=offset,
            timestamp=timestamp,
            count=args.count,
            as_json=args.json,
            out=sys.stdout,
            err=sys.stderr,
            isolation=args.isolation,
        )
    raise AssertionError(f"unhandled command {args.command}")  # pragma: no cover


def _config_check(args: argparse.Namespace) -> int:
    """Validate without side effects; warnings on stderr; print the effective config."""
    from sidecar import config as cfg

    if args.file is not None and args.positional_file is not None:
        raise ConfigError("give the config file once: -c FILE or FILE")
    path = args.file or args.positional_file
    config = _load_config(path, overrides=_parse_set(args.overrides))
    for warning in cfg.check_warnings(config):
        print(f"sidecar: warning: {warning}", file=sys.stderr)
    data = cfg.masked(config)
    print(json.dumps(data, indent=2) if args.json else cfg.to_toml(data), end="")
    if args.json:
        print()
    return 0


def _status(args: argparse.Namespace) -> int:
    import http.client
    import urllib.error
    import urllib.request

    from sidecar import config as cfg
    from sidecar.status import render_status

    url = args.url
    if url is None:
        config = _load_config(args.file, overrides=_parse_set(args.overrides))
        url = f"http://{config.metrics.host}:{config.metrics.port}/v1/status"
    if not url.startswith(("http://", "https://")):
        raise ConfigError(f"--url must be an http(s) URL, not {url!r}")
    not_status = (
        f"sidecar: error: {url} did not answer with a status document (is it the"
        " daemon's /v1/status?)"
    )
    try:
        with urllib.request.urlopen(url, timeout=10) as response:  # noqa: S310 - checked above
            document = json.load(response)
    except urllib.error.HTTPError as exc:
        body = " ".join(exc.read().decode(errors="replace").split())  # an HTML page: one line
        print(f"sidecar: error: {url} answered {exc.code}: {body[:300]}", file=sys.stderr)
        return 1
    except (OSError, http.client.HTTPException) as exc:
        # HTTPException: something answered that does not speak HTTP (a Kafka port, say)
        print(f"sidecar: error: cannot reach the running sidecar at {url}: {exc}", file=sys.stderr)
        return 1
    except ValueError:  # not JSON (a web page, /metrics), or not UTF-8
        print(not_status, file=sys.stderr)
        return 1
    if not isinstance(document, dict) or not isinstance(document.get("partitions"), list):
        print(not_status, file=sys.stderr)
        return 1
    code = 0 if document.get("ready") else 1  # a sidecar that is not ready is a finding
    if args.json:
        if not args.all:
            document = {
                **document,
                "partitions": [r for r in document["partitions"] if r.get("selected")],
            }
        print(json.dumps(document, indent=2))
        return code
    print(render_status_header(document))
    config_args = ["-c", str(args.file)] if args.file is not None else []
    for override in args.overrides or ():
        key, _, _ = override.partition("=")
        if cfg.is_secret_key(key):  # the hint is printed; the environment still has the secret
            override = f"{key.strip()}=..."
        config_args += ["--set", override]
    rendered = render_status(
        document["partitions"], all_partitions=args.all, config_args=config_args
    )
    print(rendered, end="")
    return code


def render_status_header(document: dict[str, object]) -> str:
    """``broker 1  ready  kafka ok, metadata ok, s3 FAILING (reason)``: one line for people,
    and a second one on the broker plugin when a partition is broker-driven."""
    checks = document.get("checks")
    failing = document.get("failing")
    reasons = failing if isinstance(failing, dict) else {}
    parts = []
    if isinstance(checks, dict):
        for name, ok in checks.items():
            reason = f" ({reasons[name]})" if name in reasons else ""
            parts.append(f"{name} {'ok' if ok else 'FAILING'}{reason}")
    state = "ready" if document.get("ready") else "NOT READY"
    header = f"broker {document.get('broker_id')}  {state}  " + ", ".join(parts)
    rows = document.get("partitions")
    driven = isinstance(rows, list) and any(
        isinstance(r, dict) and r.get("mode") in ("broker-driven", "copy-disabled") for r in rows
    )
    plugin = document.get("broker_plugin")
    if driven and isinstance(plugin, dict):
        last = plugin.get("last_request_at")
        if plugin.get("loaded_by_broker") is False:
            rsm = plugin.get("broker_rsm_class")
            runs = f"loads {rsm}" if rsm else "has no RemoteStorageManager"
            header += (
                f"\nbroker plugin: not loaded (the broker {runs}; add the properties `sidecar"
                " broker-config` prints for it to tier through this sidecar)"
            )
        elif isinstance(last, (int, float)):
            ago = max(0.0, time.time() - last)
            header += f"\nbroker plugin: last request {ago:.0f} s ago"
        elif plugin.get("loaded_by_broker") is True:
            header += (
                "\nbroker plugin: no request since the sidecar started; the broker loads it and"
                " calls on its next copy pass (remote.log.manager.task.interval.ms) or remote read"
            )
        else:
            header += (
                "\nbroker plugin: no request since the sidecar started (a broker-driven topic's"
                " broker copies and reads through it; does the broker have the properties"
                " `sidecar broker-config` prints?)"
            )
    return header
