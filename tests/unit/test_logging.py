"""Structured logs: JSON lines with bound context, and secrets redacted."""

from __future__ import annotations

import io
import json
import logging

from sidecar.observability.logging import bind_context, configure_logging, get_logger


class TestLogging:
    def teardown_method(self):
        logging.getLogger().handlers.clear()

    def test_json_lines_with_bound_context(self):
        """Off a TTY, each event is one JSON object carrying the bound broker/topic/partition."""
        out = io.StringIO()
        configure_logging(level="INFO", fmt="auto", stream=out)
        log = get_logger("sidecar.test")
        with bind_context(broker_id=1, topic="orders", partition=3):
            log.info("segment_rolled", base_offset=1024)
        log.info("outside")
        first, second = (json.loads(line) for line in out.getvalue().splitlines())
        assert first["event"] == "segment_rolled"
        assert (first["broker_id"], first["topic"], first["partition"]) == (1, "orders", 3)
        assert first["base_offset"] == 1024
        assert first["level"] == "info"
        assert "topic" not in second

    def test_stdlib_logging_goes_through_the_same_pipeline(self):
        """Third-party stdlib log records come out as JSON too."""
        out = io.StringIO()
        configure_logging(level="INFO", fmt="json", stream=out)
        logging.getLogger("some.library").warning("disk %s", "full")
        record = json.loads(out.getvalue())
        assert record["event"] == "disk full"
        assert record["level"] == "warning"

    def test_secrets_are_redacted_everywhere(self):
        """A configured secret is replaced wherever it appears in an event."""
        out = io.StringIO()
        configure_logging(level="INFO", fmt="json", stream=out, secrets=["s3cr3t-value"])
        get_logger("x").error("failed", url="http://user:s3cr3t-value@host/")
        logging.getLogger("lib").error("token=s3cr3t-value")
        text = out.getvalue()
        assert "s3cr3t-value" not in text
        assert text.count("**********") == 2

    def test_secrets_are_redacted_in_nested_values_and_tracebacks(self):
        """Inside dicts and lists, in an exception's message and traceback (ours and a
        library's, whose traceback is rendered as text, not lost), and in any value's text."""
        out = io.StringIO()
        configure_logging(level="INFO", fmt="json", stream=out, secrets=["s3cr3t-value"])
        log = get_logger("x")
        log.warning("nested", failing={"s3": ["key s3cr3t-value"]}, pair=("s3cr3t-value", 1))
        try:
            _refuse()
        except RuntimeError as exc:
            log.exception("ours")
            logging.getLogger("some.library").exception("theirs")
            error = exc
        log.error("as a value", error=error)
        text = out.getvalue()
        assert "s3cr3t-value" not in text
        nested, ours, theirs, value = (json.loads(line) for line in text.splitlines())
        assert nested["failing"] == {"s3": ["key **********"]}
        assert nested["pair"] == ["**********", 1]
        for record in (ours, theirs):
            assert "Traceback (most recent call last)" in record["exception"]
            assert "RuntimeError: refused **********" in record["exception"]
        assert "exc_info" not in theirs
        assert value["error"] == "refused **********"

    def test_secrets_are_redacted_in_their_escaped_forms(self):
        """A secret with a backslash, a quote or a non-ASCII character reads differently in a
        repr (of text or bytes), in JSON or in a URL: each form is redacted too."""
        secret = 'ab"c\\d+/EFGH\u00e9'
        out = io.StringIO()
        configure_logging(level="INFO", fmt="json", stream=out, secrets=[secret])
        log = get_logger("x")
        try:
            _refuse_repr(secret)
        except ValueError:
            log.exception("repr")
        log.error("bytes", value=repr(secret.encode()))
        log.error("json", body=json.dumps({"password": secret}))
        logging.getLogger("lib").error("url %s", "https://h/?p=ab%22c%5Cd%2B%2FEFGH%C3%A9")
        text = out.getvalue()
        assert "EFGH" not in text, text
        assert len(text.splitlines()) == 4

    def test_console_format(self):
        """fmt=console renders a human-readable line, not JSON."""
        out = io.StringIO()
        configure_logging(level="INFO", fmt="console", stream=out)
        get_logger("x").info("hello", topic="t")
        line = out.getvalue()
        assert "hello" in line
        assert "topic" in line
        assert not line.lstrip().startswith("{")


def _refuse() -> None:
    raise RuntimeError("refused s3cr3t-value")


def _refuse_repr(value: str) -> None:
    raise ValueError(f"bad value {value!r}")
