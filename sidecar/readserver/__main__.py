"""``python -m sidecar.readserver [-c FILE] [--set KEY=VALUE ...]``: the read server alone.

It serves what the state dir's metadata store and the bucket hold, with no Kafka connection: for
reading tiered data while the broker (or the daemon) is down, or from a host that only has the
state dir and bucket access. It never writes the metadata store; a daemon running on the same
state dir keeps it current and this server picks changes up within a second. Give it its own
``read_server.socket_path`` and ``read_server.cache_dir`` when the daemon's read server runs too
(one process per cache dir). SIGTERM or SIGINT stops it.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Sequence
from pathlib import Path

from sidecar._aio import capture_signals, failures, freeze_startup_heap, guard
from sidecar.config import SidecarConfig, load_config, secret_values
from sidecar.errors import ConfigError, SidecarError
from sidecar.metadata.store import RemoteSegmentStore
from sidecar.observability.logging import configure_logging, get_logger
from sidecar.observability.loopwatch import LoopWatchdog
from sidecar.observability.metrics import Metrics
from sidecar.readserver.app import ReadServer
from sidecar.storage import open_store

log = get_logger("sidecar.readserver")


async def serve(config: SidecarConfig) -> None:
    """Run the read server on the configured store and bucket until SIGTERM/SIGINT."""
    stopping = asyncio.Event()
    with capture_signals(stopping):
        store = await asyncio.to_thread(RemoteSegmentStore, config.state_dir)
        try:
            async with open_store(config.s3) as objects:
                metrics = Metrics()
                server = ReadServer.from_config(
                    config, store=store, objects=objects, metrics=metrics
                )
                watchdog = LoopWatchdog(histogram=metrics.event_loop_lag)
                freezer = asyncio.create_task(_freeze_when_serving(server))
                try:
                    async with asyncio.TaskGroup() as tg:
                        tg.create_task(
                            guard(server.run(stopping), name="read server", stopping=stopping)
                        )
                        # how long the loop is held (logged above 100 ms)
                        tg.create_task(
                            guard(watchdog.run(stopping), name="loop watchdog", stopping=stopping)
                        )
                finally:
                    freezer.cancel()
        finally:
            store.close()


async def _freeze_when_serving(server: ReadServer) -> None:
    """Once the server accepts connections, move every object alive then (imports, botocore's
    S3 service model: tens of thousands of dicts and lists) out of the cyclic GC's walks, as the
    daemon does when it turns ready (``sidecar.app.freeze_startup_heap``): otherwise every full
    collection walks them again, and each S3 request's garbage triggers collections (the
    collector was about 14% of this process's CPU during a cold sequential read)."""
    await server.started.wait()
    freeze_startup_heap()


def main(argv: Sequence[str] | None = None) -> int:
    """Parse the arguments, load the configuration and serve; returns the exit code."""
    parser = argparse.ArgumentParser(prog="python -m sidecar.readserver", description=__doc__)
    parser.add_argument("-c", "--config", type=str, default=None, help="TOML configuration file")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="K=V")
    args = parser.parse_args(argv)
    try:
        overrides: dict[str, str] = {}
        for position, item in enumerate(args.overrides, 1):
            key, sep, value = item.partition("=")
            if not sep:
                # the item is not echoed: a mistyped KEY:VALUE may carry a secret
                raise ConfigError(
                    f"--set takes KEY=VALUE; item {position} has no '=' before its value"
                )
            overrides[key.strip()] = value
        config = load_config(
            None if args.config is None else Path(args.config), overrides=overrides
        )
        configure_logging(
            level=config.logging.level,
            fmt=config.logging.format,
            secrets=secret_values(config),
        )
        if sys.platform != "win32":
            import uvloop

            uvloop.run(serve(config))  # as the daemon runs
        else:  # pragma: no cover
            asyncio.run(serve(config))
    except SidecarError as exc:
        print(f"sidecar.readserver: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except BaseExceptionGroup as group:
        # the root tasks' failures (guard() logged each traceback): one line each
        leaves = failures(group)
        if not leaves or not all(isinstance(exc, SidecarError) for exc in leaves):
            raise
        for leaf in leaves:
            print(f"sidecar.readserver: error: {leaf}", file=sys.stderr)
        codes = {leaf.exit_code for leaf in leaves if isinstance(leaf, SidecarError)}
        return codes.pop() if len(codes) == 1 else 1
    except KeyboardInterrupt:
        return 130
    log.info("read_server_stopped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
