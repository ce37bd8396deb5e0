"""The read server: the aiohttp application (:func:`build_app`) served on a Unix domain socket
(mode 0660) and, optionally, a loopback TCP port, as one root task of the daemon
(:meth:`ReadServer.run`), or on its own (``python -m sidecar.readserver``).

The socket is bound, chmod-ed to 0660 and only then listened on, so no client ever connects to
it with looser permissions; a stale socket file left by a crash is replaced, anything else at the
path is an error. On stop the server stops accepting, gives responses in flight
``shutdown_timeout_s``, closes the caches and removes the socket file.

It does not build the metadata store or the object store: the caller owns them.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import stat
from collections.abc import Sequence
from pathlib import Path
from typing import Final

from aiohttp import web

from sidecar.brokerapi import SegmentCopier
from sidecar.config import SidecarConfig
from sidecar.errors import ConfigError
from sidecar.kafka.records import prepare_decoder
from sidecar.metadata.store import RemoteSegmentStore
from sidecar.observability.logging import get_logger
from sidecar.observability.metrics import Metrics
from sidecar.readserver.cache import ChunkCache, MemoryCache
from sidecar.readserver.routes import (
    LIMITS_KEY,
    METRICS_KEY,
    PLUGIN_ACTIVITY_KEY,
    SERVICE_KEY,
    PluginActivity,
    ReadLimits,
    add_routes,
    limits_middleware,
)
from sidecar.readserver.rsm import CACHE_FILES_KEY, COPIER_KEY, CacheFileOffer, add_rsm_routes
from sidecar.readserver.service import ReadService
from sidecar.storage.base import ObjectStore
from sidecar.storage.keys import KeyLayout

__all__ = ["LOOPBACK", "ReadServer", "build_app", "socket_path_for"]

log = get_logger(__name__)

LOOPBACK: Final = "127.0.0.1"
SOCKET_MODE: Final = 0o660
#: sun_path is 108 bytes on Linux, NUL included
_MAX_SOCKET_PATH: Final = 107
#: how long a connect to an existing socket file may take before it counts as a live server
_PROBE_TIMEOUT_S: Final = 1.0


def socket_path_for(config: SidecarConfig) -> Path:
    """The read socket's path (:attr:`SidecarConfig.read_socket_path`)."""
    return config.read_socket_path


def cache_dir_for(config: SidecarConfig) -> Path:
    """The chunk cache's directory (:attr:`SidecarConfig.read_cache_dir`)."""
    return config.read_cache_dir


def build_app(
    service: ReadService,
    *,
    limits: ReadLimits | None = None,
    metrics: Metrics | None = None,
    copier: SegmentCopier | None = None,
    plugin_activity: PluginActivity | None = None,
    cache_files: CacheFileOffer | None = None,
) -> web.Application:
    """The v1 application: routes, limits and JSON errors, with its dependencies as app keys.
    Without ``copier`` the plugin's copy and delete answer 503 ``copy_unavailable``; the
    plugin's requests are noted in ``plugin_activity``; with ``cache_files`` the plugin's
    segment reads of cached data may be answered with the chunk files' paths."""
    app = web.Application(middlewares=[limits_middleware], client_max_size=1024)
    app[SERVICE_KEY] = service
    app[LIMITS_KEY] = limits if limits is not None else ReadLimits()
    if metrics is not None:
        app[METRICS_KEY] = metrics
    if copier is not None:
        app[COPIER_KEY] = copier
    if plugin_activity is not None:
        app[PLUGIN_ACTIVITY_KEY] = plugin_activity
    if cache_files is not None:
        app[CACHE_FILES_KEY] = cache_files
    add_routes(app)
    add_rsm_routes(app)
    return app


def _cache_file_offer(directory: Path, broker_directory: Path | None) -> CacheFileOffer | None:
    """The offer of the chunk cache's files to the broker plugin; None (logged) when the
    plugin could not take their paths (not plain ASCII, or with ``"`` or a backslash)."""
    offer = CacheFileOffer(directory, broker_directory)
    if offer.usable:
        return offer
    log.warning(
        "read_cache_files_not_offered",
        directory=str(broker_directory or directory),
        detail="the broker plugin takes only plain ASCII paths without a quote or a backslash:"
        " it reads the cache's bytes through the socket instead",
    )
    return None


def _identity(path: Path) -> tuple[int, int] | None:
    """The (device, inode) of the file at ``path``, None when there is none."""
    try:
        status = path.lstat()
    except OSError:
        return None
    return status.st_dev, status.st_ino


def _answers(path: Path) -> bool:
    """Whether a process listens on the Unix socket at ``path`` (a full backlog counts: its
    connect does not finish in time). A socket file nobody listens on refuses at once."""
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.settimeout(_PROBE_TIMEOUT_S)
    try:
        probe.connect(os.fspath(path))
    except TimeoutError:
        return True
    except OSError:
        return False
    finally:
        probe.close()
    return True


def _bind_unix_socket(path: Path) -> socket.socket:
    """A Unix stream socket bound at ``path`` with mode 0660, listening."""
    if len(os.fsencode(path)) > _MAX_SOCKET_PATH:
        raise ConfigError(
            f"read_server.socket_path {path} is longer than {_MAX_SOCKET_PATH} bytes,"
            " the limit of a Unix socket path; configure a shorter one"
        )
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(
            f"read_server.socket_path {path}: cannot create its directory: {exc}"
        ) from exc
    try:
        mode = path.lstat().st_mode
    except FileNotFoundError:
        pass
    else:
        if not stat.S_ISSOCK(mode):
            raise ConfigError(f"read_server.socket_path {path} exists and is not a socket")
        if _answers(path):
            raise ConfigError(
                f"read_server.socket_path {path}: another process listens on it (a running"
                " sidecar or read server); stop it, or configure another socket path"
            )
        path.unlink()  # a stale socket from an earlier run
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.bind(os.fspath(path))
        path.chmod(SOCKET_MODE)  # before listen(): nobody can connect yet
        sock.listen(128)
        sock.setblocking(False)
    except OSError as exc:
        sock.close()
        raise ConfigError(f"cannot listen on the read socket {path}: {exc}") from exc
    return sock


class ReadServer:
    """The read socket as a root task; it owns its chunk cache and read service."""

    def __init__(
        self,
        *,
        service: ReadService,
        socket_path: Path,
        tcp_port: int | None = None,
        limits: ReadLimits | None = None,
        metrics: Metrics | None = None,
        shutdown_timeout_s: float = 5.0,
        copier: SegmentCopier | None = None,
        cache_files: CacheFileOffer | None = None,
    ) -> None:
        self.service = service
        self.copier = copier
        self.cache_files = cache_files
        self.socket_path = socket_path
        self.tcp_port = tcp_port
        self._limits = limits if limits is not None else ReadLimits()
        self._metrics = metrics
        self._shutdown_timeout_s = shutdown_timeout_s
        #: set once the server accepts connections
        self.started = asyncio.Event()
        #: the TCP port bound (useful with port 0 in tests), or None
        self.bound_port: int | None = None
        #: when the broker plugin last called
        self.plugin_activity = PluginActivity()

    @classmethod
    def from_config(
        cls,
        config: SidecarConfig,
        *,
        store: RemoteSegmentStore,
        objects: ObjectStore,
        metrics: Metrics | None = None,
        log_dirs: Sequence[Path] | None = None,
        copier: SegmentCopier | None = None,
    ) -> ReadServer:
        """The read server the configuration describes, over the caller's store and objects."""
        read = config.read_server
        chunks = ChunkCache(
            objects=objects,
            directory=cache_dir_for(config),
            max_bytes=read.cache_size_bytes,
            chunk_size=read.chunk_size_bytes,
            readahead_chunks=read.prefetch_chunks,
            fetch_timeout_s=read.fetch_timeout_s,
            max_concurrent_fetches=read.max_concurrent_fetches,
            max_pending_write_bytes=read.cache_max_pending_write_bytes,
            direct_io=read.cache_direct_io,
            metrics=metrics,
        )
        service = ReadService(
            store=store,
            objects=objects,
            layout=KeyLayout(prefix=config.s3.prefix, hash_prefix=config.s3.hash_prefix),
            chunks=chunks,
            log_dirs=config.broker.log_dirs if log_dirs is None else log_dirs,
            fetch_timeout_s=read.fetch_timeout_s,
            indexes=MemoryCache(max_weight=read.index_cache_bytes, metrics=metrics),
            plan_responses=read.sendfile,
        )
        limits = ReadLimits(
            default_response_bytes=min(read.default_response_bytes, read.max_response_bytes),
            max_response_bytes=read.max_response_bytes,
            max_records=read.max_records,
            max_url_bytes=read.max_url_bytes,
            max_header_bytes=read.max_header_bytes,
            max_concurrent_requests=read.max_concurrent_requests,
        )
        return cls(
            service=service,
            copier=copier,
            socket_path=socket_path_for(config),
            tcp_port=read.tcp_port,
            limits=limits,
            metrics=metrics,
            shutdown_timeout_s=read.shutdown_timeout_s,
            cache_files=_cache_file_offer(chunks.directory, read.broker_cache_dir)
            if read.offer_cache_files
            else None,
        )

    async def run(self, stopping: asyncio.Event) -> None:
        """Serve until ``stopping`` is set, then stop accepting, let responses in flight finish
        (within the shutdown timeout), close the caches and remove the socket file."""
        prepare_decoder()  # here, before worker threads decode batches at once
        async with self.service.chunks:
            try:
                await self._serve(stopping)
            finally:
                await self.service.aclose()

    async def _serve(self, stopping: asyncio.Event) -> None:
        app = build_app(
            self.service,
            limits=self._limits,
            metrics=self._metrics,
            copier=self.copier,
            plugin_activity=self.plugin_activity,
            cache_files=self.cache_files,
        )
        runner = web.AppRunner(
            app,
            access_log=None,
            handle_signals=False,
            shutdown_timeout=self._shutdown_timeout_s,
            # the parser's own limits sit above ours, so ours answer with JSON (414, 431)
            max_line_size=max(8190, self._limits.max_url_bytes + 64),
            max_field_size=max(8190, 2 * self._limits.max_header_bytes),
        )
        await runner.setup()
        sock: socket.socket | None = None
        try:
            sock = await asyncio.to_thread(_bind_unix_socket, self.socket_path)
            sock_identity = _identity(self.socket_path)
            await web.SockSite(runner, sock).start()
            if self.tcp_port is not None:
                tcp = web.TCPSite(runner, LOOPBACK, self.tcp_port, reuse_address=True)
                await tcp.start()
                server = getattr(tcp, "_server", None)
                sockets = getattr(server, "sockets", None) or []
                self.bound_port = int(sockets[0].getsockname()[1]) if sockets else self.tcp_port
            log.info(
                "read_server_listening",
                socket=str(self.socket_path),
                tcp_port=self.bound_port,
                cache_dir=str(self.service.chunks.directory),
            )
            self.started.set()
            await stopping.wait()
        finally:
            await runner.cleanup()
            if sock is not None:
                bound = _identity(self.socket_path)
                sock.close()
                if bound is not None and bound == sock_identity:
                    # only our own socket file: a path another server took since is theirs
                    with contextlib.suppress(FileNotFoundError):
                        self.socket_path.unlink()
