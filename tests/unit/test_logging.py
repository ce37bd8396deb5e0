"""Structured logs: JSON lines with bound context, and secrets redacted."""

from __future__ import annotations

import io
import json
import logging
from urllib.parse import parse_qs, urlsplit

import pytest

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

    def test_credentials_no_setting_holds_are_masked(self):
        """A session token of the AWS credential chain (IRSA), which no setting holds, is
        masked where botocore prints it when debugging: the signer's canonical request, a
        presigned URL, a request's header dict; so are signatures, a JAAS line's password,
        a URL's password and a value under a credential's name."""
        import botocore.config
        import botocore.session

        token = "FwoGZXIvYXdzE+Tok3nQq/Xy=="
        out = io.StringIO()
        configure_logging(level="DEBUG", fmt="json", stream=out)
        client = botocore.session.get_session().create_client(
            "s3",
            region_name="us-east-1",
            endpoint_url="http://127.0.0.1:9",
            aws_access_key_id="AKIDEXAMPLE",
            aws_secret_access_key="wJalrXUtnFEMIbPxRfiCYEXAMPLEKEY",
            aws_session_token=token,
            config=botocore.config.Config(signature_version="s3v4"),
        )
        url = client.generate_presigned_url("get_object", Params={"Bucket": "b", "Key": "k"})
        log = get_logger("x")
        log.warning("presigned", url=url)
        logging.getLogger("botocore.auth").debug(
            "CanonicalRequest:\n%s", f"GET\n/b/k\n\nx-amz-security-token:{token}\n\nhost"
        )
        logging.getLogger("botocore.endpoint").debug(
            "Sending http request: %s",
            f"headers={{'X-Amz-Security-Token': b'{token}', 'Authorization':"
            " b'AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20260101/us-east-1/s3/aws4_request,"
            " SignedHeaders=host, Signature=fe5f80f77d5fa3beca038a248ff027'}",
        )
        log.warning(
            "clients",
            jaas="org.apache.kafka.common.security.plain.PlainLoginModule required"
            ' username="u" password="pa ss\\"wQrd7";',
            proxy="http://proxyuser:pr0xy-pass@proxy:3128/",
            kwargs={"sasl_plain_password": "kafka-pass", "linger_ms": 5},
        )
        text = out.getvalue()
        assert "X-Amz-Security-Token=**********" in text  # the signer's log was there
        for leaked in (
            "Tok3nQq",
            "Tok3nQq%2FXy",
            "fe5f80f77d5fa3beca038a248ff027",
            "pa ss",
            "wQrd7",
            "pr0xy-pass",
            "kafka-pass",
        ):
            assert leaked not in text, leaked
        signature = parse_qs(urlsplit(url).query)["X-Amz-Signature"][0]
        assert signature not in text
        clients = json.loads(text.splitlines()[-1])
        assert clients["kwargs"] == {"sasl_plain_password": "**********", "linger_ms": 5}
        assert clients["proxy"] == "http://proxyuser:**********@proxy:3128/"

    @pytest.mark.timeout(20)
    def test_masking_long_runs_of_word_characters_takes_linear_time(self):
        """A long line of word characters (a hex dump, a repeated name) is masked in time
        proportional to its length: a pattern that backtracked over every start of a run held
        the event loop for hours on a line of a few tens of KB (the timeout catches that)."""
        out = io.StringIO()
        configure_logging(level="INFO", fmt="json", stream=out)
        dump = "0123456789abcdef" * 4096
        names = "x-token." * 8192
        schemes = "a." * 32768
        get_logger("x").warning(
            "long",
            dump=dump,
            names=names,
            url=f"{schemes}http://u:pa55word@h/",
            query=f"{names}=s3cr3t-value&{dump}",
        )
        record = json.loads(out.getvalue())
        assert record["dump"] == dump
        assert record["names"] == names
        assert record["url"] == f"{schemes}http://u:**********@h/"
        assert record["query"] == f"{names}=**********&{dump}"

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
