"""The service's logging setup: structlog events written directly (no stdlib handler on
the hot path), foreign stdlib records in the same JSON format, redaction, level filter."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator
from typing import Any

import pytest
import structlog

from worker.logging import configure_logging, redact


@pytest.fixture
def stream() -> Iterator[io.StringIO]:
    buf = io.StringIO()
    saved = structlog.get_config()
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    try:
        yield buf
    finally:
        structlog.configure(**saved)
        root.handlers[:] = handlers
        root.setLevel(level)


def lines(buf: io.StringIO) -> list[dict[str, Any]]:
    return [json.loads(line) for line in buf.getvalue().splitlines()]


def test_structlog_events_are_json_lines_with_name_level_time(stream: io.StringIO) -> None:
    configure_logging("json", "info", stream=stream)
    structlog.get_logger("worker.registry").info("tool.call", tool="read_file", duration_ms=0.5)
    structlog.get_logger().warning("unnamed")
    [named, unnamed] = lines(stream)
    assert named["event"] == "tool.call" and named["tool"] == "read_file" and named["duration_ms"] == 0.5
    assert named["logger"] == "worker.registry" and named["level"] == "info"
    assert named["timestamp"].endswith("Z")
    assert unnamed["logger"] == __name__ and unnamed["level"] == "warning"


def test_events_below_the_level_are_dropped(stream: io.StringIO) -> None:
    configure_logging("json", "warning", stream=stream)
    structlog.get_logger("w").info("quiet")
    logging.getLogger("uvicorn.error").info("quiet too")
    structlog.get_logger("w").error("loud")
    assert [e["event"] for e in lines(stream)] == ["loud"]


def test_stdlib_records_share_the_format(stream: io.StringIO) -> None:
    configure_logging("json", "info", stream=stream)
    # A name of its own: other tests' libraries may have disabled uvicorn's loggers.
    logging.getLogger("loom.test.foreign").info("Started %s", "server", extra={"color_message": "\x1b[1mStarted"})
    [e] = lines(stream)
    assert e["event"] == "Started server" and e["logger"] == "loom.test.foreign" and e["level"] == "info"
    assert "color_message" not in e


def test_contents_and_secrets_never_reach_the_log(stream: io.StringIO) -> None:
    configure_logging("json", "info", stream=stream)
    structlog.get_logger("w").info(
        "x", content="SECRET FILE BODY", api_token="tok-123", Authorization="Bearer abc", note="n" * 2000
    )
    [e] = lines(stream)
    text = stream.getvalue()
    assert "SECRET FILE BODY" not in text and "tok-123" not in text and "abc" not in text
    assert e["content"] == "[16 chars]" and e["api_token"] == "[redacted]" and e["Authorization"] == "[redacted]"
    assert e["note"].startswith("n" * 512) and e["note"].endswith("[1488 more chars]")


def test_exceptions_are_rendered(stream: io.StringIO) -> None:
    configure_logging("json", "info", stream=stream)
    try:
        raise ZeroDivisionError("boom")
    except ZeroDivisionError:
        structlog.get_logger("w").exception("failed")
    [e] = lines(stream)
    assert "ZeroDivisionError: boom" in e["exception"]


def test_redaction_decision_is_per_key_not_per_value() -> None:
    # The per-key cache must not remember a value: the same key is cut only when long.
    assert redact(None, "info", {"event": "e", "path": "short"})["path"] == "short"
    assert redact(None, "info", {"event": "e", "path": "p" * 600})["path"].endswith("[88 more chars]")
    assert redact(None, "info", {"event": "e", "stdout": b"abc"})["stdout"] == "[3 bytes]"


def test_capture_logs_still_sees_events_after_configuration(stream: io.StringIO) -> None:
    configure_logging("json", "info", stream=stream)
    with structlog.testing.capture_logs() as logs:
        structlog.get_logger("w").info("captured", k=1)
    assert logs == [{"event": "captured", "k": 1, "log_level": "info"}]
    assert stream.getvalue() == ""


def test_a_library_logger_follows_each_new_configuration_and_capture(stream: io.StringIO) -> None:
    """The library's loggers keep the logger structlog made (binding one per event cost
    more than a filtered event itself) only while the configuration stays the same."""
    from sandbox.logs import get_logger

    log = get_logger("worker.registry")
    configure_logging("json", "warning", stream=stream)
    log.info("filtered")
    log.warning("kept", n=1)
    with structlog.testing.capture_logs() as logs:
        log.info("filtered while captured")
        log.warning("captured", k=1)
    log.info("filtered again")
    configure_logging("json", "info", stream=stream)  # a new level: a new wrapper
    log.info("now kept", n=2)
    other = io.StringIO()
    configure_logging("json", "info", stream=other)  # a new stream: a new logger factory
    log.info("elsewhere")
    assert logs == [{"event": "captured", "k": 1, "log_level": "warning"}]
    assert [(e["event"], e.get("n")) for e in lines(stream)] == [("kept", 1), ("now kept", 2)]
    assert [e["event"] for e in lines(other)] == ["elsewhere"]


def test_a_closed_stream_never_raises_into_the_caller(stream: io.StringIO) -> None:
    configure_logging("json", "info", stream=stream)
    stream.close()
    structlog.get_logger("w").info("lost, silently")


def test_without_a_stream_events_follow_the_current_stderr(
    stream: io.StringIO, monkeypatch: pytest.MonkeyPatch
) -> None:
    configure_logging("json", "info")
    monkeypatch.setattr("sys.stderr", stream)  # replaced after configuration, as test runners do
    structlog.get_logger("w").info("here")
    assert [e["event"] for e in lines(stream)] == ["here"]
