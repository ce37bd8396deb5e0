"""Structured logging with structlog: JSON lines in production, readable output on a TTY.

Context (broker id, topic, partition, segment) is bound through contextvars with
:func:`bind_context`, so it follows a coroutine and survives ``asyncio.to_thread``. Third-party
stdlib logging (aiokafka, botocore) goes through the same processors; a library that repeats
itself in a loop (aiokafka logs every reconnect attempt during a Kafka outage, ten a second) is
let through once per message per 30 s, with a count of what was suppressed. A last-line defence
redacts configured secret values from every event, whatever field they end up in, and the
values of credentials that are not configured but that libraries print when they debug: a
session token of the AWS credential chain in a signed request's headers or a presigned URL, a
signature, a password in a JAAS line or in a URL.
"""

from __future__ import annotations

import json
import logging
import re
import sys
import time
import urllib.parse
from collections.abc import Iterable, Iterator, MutableMapping
from contextlib import contextmanager
from typing import Any, Literal, TextIO

import structlog

__all__ = ["bind_context", "configure_logging", "get_logger", "redact_secrets"]

_REDACTED = "**********"


def _written_forms(secret: str) -> set[str]:
    """``secret`` as text may show it: as is, and escaped as ``repr`` (of the text or its
    UTF-8 bytes), JSON and URL encoding write it, where a backslash, quote or non-ASCII
    character changes it."""
    return {
        secret,
        repr(secret)[1:-1],
        repr(secret.encode())[2:-1],
        json.dumps(secret)[1:-1],
        json.dumps(secret, ensure_ascii=False)[1:-1],
        urllib.parse.quote(secret, safe=""),
    }


#: names of credential-bearing fields: ``X-Amz-Security-Token``, ``X-Amz-Signature``,
#: ``X-Amz-Credential``, ``aws_secret_access_key``, ``sasl_plain_password``, ``ssl.key.password``.
#: A name is a whole run of ``[\w.-]`` (it starts where no such character precedes it, and is
#: taken possessively) that holds one of the words: every run is read a bounded number of
#: times, so a line costs time in proportion to its length (a name free to start anywhere in
#: a run backtracks over the rest of the run from every start: seconds for a line of a few KB
#: of word characters, a hex dump say, held on the event loop).
_CREDENTIAL_NAME = (
    r"(?<![\w.-])(?=[\w.-]*?(?:password|passwd|secret|token|signature|credential))[\w.-]*+"
)
_VALUE = r"""(?:"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'|[^\s&'",;\\]+)"""
#: ``name=value`` (a query, a JAAS line, ``Signature=`` in an Authorization header),
#: ``'name': b'value'`` and ``"name": "value"`` (a header dict's repr, JSON), ``name:value``
#: (a header line of a canonical request, as botocore's signer logs it) and ``name:\nvalue``
#: (its ``Signature:`` line)
_CREDENTIAL_FIELD = re.compile(
    rf"""(?i)(?P<name>{_CREDENTIAL_NAME})"""
    rf"""(?P<sep>\s*=\s*|['"]\s*:\s*b?(?=['"])|:\n?(?=[^\s'"]))(?P<value>{_VALUE})"""
)
_CREDENTIAL_KEY = re.compile(rf"(?i){_CREDENTIAL_NAME}")
#: the password of ``scheme://user:password@host`` (found from its ``://``: a scheme matched
#: from every start in a run of scheme characters backtracks as the names did)
_URL_PASSWORD = re.compile(r"(?P<head>://[^/\s:@]*+):(?P<value>[^/\s@]++)@")


def _mask_credentials(text: str) -> str:
    """``text`` with the values of credential-bearing fields and URL passwords masked."""
    text = _CREDENTIAL_FIELD.sub(rf"\g<name>\g<sep>{_REDACTED}", text)
    return _URL_PASSWORD.sub(rf"\g<head>:{_REDACTED}@", text)


class _SecretRedactor:
    """Replace any configured secret value that appears in an event's values, nested ones
    (dicts, lists) too, and mask credentials no setting holds (:func:`_mask_credentials`). It
    runs last, after exceptions are rendered to text, so tracebacks and exception messages
    are redacted as well."""

    def __init__(self, secrets: Iterable[str]) -> None:
        self._secrets: list[str] = []
        self.add(secrets)

    def add(self, secrets: Iterable[str]) -> None:
        """Redact these values too, from the next event on."""
        forms = {form for s in secrets if len(s) >= 4 for form in _written_forms(s)}
        self._secrets = sorted(forms | set(self._secrets), key=len, reverse=True)

    def __call__(
        self, logger: Any, method_name: str, event_dict: MutableMapping[str, Any]
    ) -> MutableMapping[str, Any]:
        for key, value in list(event_dict.items()):
            event_dict[key] = self._redact_field(key, value)
        return event_dict

    def _redact_field(self, key: Any, value: Any) -> Any:
        """A text value under a credential's name (``sasl_plain_password``) is masked whole."""
        credential = isinstance(key, str) and _CREDENTIAL_KEY.fullmatch(key) is not None
        if credential and isinstance(value, str | bytes):
            return _REDACTED
        return self._redact(value)

    def _redact(self, value: Any) -> Any:
        if isinstance(value, str):
            for secret in self._secrets:
                if secret in value:
                    value = value.replace(secret, _REDACTED)
            return _mask_credentials(value)
        if isinstance(value, dict):
            return {self._redact(k): self._redact_field(k, v) for k, v in value.items()}
        if isinstance(value, list | tuple | set | frozenset):
            return [self._redact(v) for v in value]
        if value is None or isinstance(value, bool | int | float):
            return value
        # of no JSON type (an exception, a path): its text, which may hold a secret
        return self._redact(str(value))


class _RepeatFilter(logging.Filter):
    """Third-party records: one per (logger, message template) per ``interval_s``."""

    def __init__(self, interval_s: float = 30.0) -> None:
        super().__init__()
        self._interval_s = interval_s
        self._seen: dict[tuple[str, str], tuple[float, int]] = {}  # key → (emitted at, dropped)

    def filter(self, record: logging.LogRecord) -> bool:
        if record.name.startswith("sidecar") or record.levelno >= logging.CRITICAL:
            return True
        key = (record.name, str(record.msg))
        now = time.monotonic()
        last = self._seen.get(key)
        if last is not None and now - last[0] < self._interval_s:
            self._seen[key] = (last[0], last[1] + 1)
            return False
        if len(self._seen) > 1000:  # forget quiet messages; the map stays small
            self._seen = {k: v for k, v in self._seen.items() if now - v[0] < self._interval_s}
        self._seen[key] = (now, 0)
        if last is not None and last[1]:
            record.msg = f"{record.msg} (and {last[1]} similar in {self._interval_s:.0f} s)"
        return True


def configure_logging(
    *,
    level: str = "INFO",
    fmt: Literal["auto", "json", "console"] = "auto",
    stream: TextIO | None = None,
    secrets: Iterable[str] = (),
) -> None:
    """Configure structlog and the stdlib root logger once, at process start."""
    out = stream if stream is not None else sys.stderr
    use_console = fmt == "console" or (fmt == "auto" and out.isatty())
    # exceptions become text before the last processors (third-party records' too, whose
    # exc_info JSON would otherwise show as a tuple's repr), so the redactor sees tracebacks
    shared: list[Any] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
        structlog.stdlib.add_logger_name,
        structlog.processors.StackInfoRenderer(),
        structlog.processors.format_exc_info,
    ]
    renderer: Any = (
        structlog.dev.ConsoleRenderer(colors=out.isatty())
        if use_console
        else structlog.processors.JSONRenderer(default=str)
    )
    structlog.configure(
        processors=[*shared, structlog.stdlib.ProcessorFormatter.wrap_for_formatter],
        logger_factory=structlog.stdlib.LoggerFactory(),
        wrapper_class=structlog.stdlib.BoundLogger,
        cache_logger_on_first_use=False,
    )
    formatter = structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=shared,
        processors=[
            structlog.stdlib.ProcessorFormatter.remove_processors_meta,
            _SecretRedactor(secrets),
            renderer,
        ],
    )
    handler = logging.StreamHandler(out)
    handler.setFormatter(formatter)
    handler.addFilter(_RepeatFilter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    # chatty libraries stay at WARNING unless we debug
    for noisy in ("aiokafka", "botocore", "aiobotocore", "watchdog", "asyncio"):
        logging.getLogger(noisy).setLevel(logging.DEBUG if level == "DEBUG" else logging.WARNING)


def redact_secrets(secrets: Iterable[str]) -> None:
    """Add ``secrets`` to what the configured logging redacts: for a command that set up its
    logging before it loaded the configuration that holds them."""
    for handler in logging.getLogger().handlers:
        formatter = handler.formatter
        if isinstance(formatter, structlog.stdlib.ProcessorFormatter):
            for processor in formatter.processors:
                if isinstance(processor, _SecretRedactor):
                    processor.add(secrets)


def get_logger(name: str) -> Any:
    """A structlog logger named after the module (``get_logger(__name__)``)."""
    return structlog.stdlib.get_logger(name)


@contextmanager
def bind_context(**values: Any) -> Iterator[None]:
    """Bind key-values (broker_id, topic, partition, segment) to every log line in this block."""
    with structlog.contextvars.bound_contextvars(**values):
        yield
