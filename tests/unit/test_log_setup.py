"""mwms/log_setup.py: one line per record in both formats, JSON that parses with its fields, and every
logger of the process (uvicorn's, gRPC's, warnings, uncaught exceptions) going through the one handler."""

from __future__ import annotations

import io
import json
import logging
import re
import sys
import threading
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest

from mwms import log_setup

ISO_UTC = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z")


def record_of(message: str = "job %s failed", *args: object, **extra: object) -> logging.LogRecord:
    """A record as logger.info(message, *args, extra=extra) makes it, with the exception being handled."""
    logger = logging.getLogger("mwms.test")
    exc_info = sys.exc_info()
    record = logger.makeRecord(
        logger.name, logging.ERROR, __file__, 1, message, args, exc_info if exc_info[0] else None, extra=extra
    )
    return record


def failing_record(**extra: object) -> logging.LogRecord:
    try:
        raise RuntimeError("the database went away\nsecond line of the error")
    except RuntimeError:
        return record_of("job %s failed", "0123456789ab", **extra)


def test_a_json_line_has_its_fields_its_extras_and_the_traceback_as_one_string():
    line = log_setup.JsonFormatter().format(failing_record(job_id="0123456789ab", attempt=2, state="FAILED"))

    assert "\n" not in line and line.isascii()
    entry = json.loads(line)
    assert list(entry)[:4] == ["time", "level", "logger", "message"]
    assert ISO_UTC.fullmatch(entry["time"]), entry["time"]
    assert (entry["level"], entry["logger"]) == ("ERROR", "mwms.test")
    assert entry["message"] == "job 0123456789ab failed"
    assert (entry["job_id"], entry["attempt"], entry["state"]) == ("0123456789ab", 2, "FAILED")
    assert entry["exc_info"].startswith("Traceback (most recent call last):")
    assert entry["exc_info"].endswith("RuntimeError: the database went away\nsecond line of the error")


def test_json_keeps_what_it_cannot_hold_as_text_and_never_lets_an_extra_replace_a_field():
    record = record_of("plain", time="yesterday", level=3, path=Path("/tmp/x"), ratio=float("nan"))
    entry = json.loads(log_setup.JsonFormatter().format(record))

    assert entry["level"] == "ERROR" and ISO_UTC.fullmatch(entry["time"])
    assert entry["extra_time"] == "yesterday" and entry["extra_level"] == 3
    assert entry["path"] == "/tmp/x" and entry["ratio"] == "nan"
    assert "exc_info" not in entry


def test_text_folds_the_traceback_and_control_characters_into_the_line():
    record = failing_record()
    record.msg = "job %s failed: \x1b[31mred\x1b[0m\ttab"
    line = log_setup.OneLineFormatter().format(record)

    assert "\n" not in line and "\x1b" not in line
    assert re.match(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} ERROR mwms.test: job 0123456789ab failed: ", line)
    assert "\\x1b[31mred\\x1b[0m\\ttab\\nTraceback (most recent call last):\\n" in line
    assert line.endswith("RuntimeError: the database went away\\nsecond line of the error")


def test_fold_escapes_every_line_break_a_reader_might_split_on():
    assert log_setup.fold("a\r\nb\u2028c\x85d\x7f") == "a\\r\\nb\\u2028c\\x85d\\x7f"
    assert log_setup.fold("plain text, ünïcode kept") == "plain text, ünïcode kept"


@pytest.mark.parametrize(
    ("parse", "given", "expected"),
    [
        (log_setup.parse_format, " JSON ", "json"),
        (log_setup.parse_format, "text", "text"),
        (log_setup.parse_level, "WARNING", "warning"),
        (log_setup.parse_level, "debug", "debug"),
    ],
)
def test_formats_and_levels_are_read_in_any_case(parse, given, expected):
    assert parse(given) == expected


def test_an_unknown_format_or_level_says_what_it_must_be():
    with pytest.raises(ValueError, match=r"log format 'xml' is not one of text, json"):
        log_setup.parse_format("xml")
    with pytest.raises(ValueError, match=r"log level 'verbose' is not one of debug, info, warning, error"):
        log_setup.parse_level("verbose")


@pytest.fixture
def configured() -> Iterator[io.StringIO]:
    """configure_logging("json", "info") into a buffer; everything it changed is put back afterwards."""
    root = logging.getLogger()
    saved = (root.level, sys.excepthook, threading.excepthook)
    stream = io.StringIO()
    handler = log_setup.configure_logging("json", "info", stream=stream)
    try:
        yield stream
    finally:
        root.removeHandler(handler)
        root.setLevel(saved[0])
        sys.excepthook, threading.excepthook = saved[1], saved[2]
        logging.captureWarnings(False)


def lines_of(stream: io.StringIO) -> list[dict[str, object]]:
    return [json.loads(line) for line in stream.getvalue().split("\n") if line]


def test_uvicorn_grpc_and_warnings_go_through_the_one_handler_at_its_level(configured):
    logging.getLogger("uvicorn.error").info("Started server process [1]")
    logging.getLogger("grpc._server").warning("Exception calling application")
    logging.getLogger("mwms.server").debug("below the level: not written")
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.warn("a deprecated thing", DeprecationWarning, stacklevel=1)

    seen = {(line["logger"], line["level"]) for line in lines_of(configured)}
    assert seen == {("uvicorn.error", "INFO"), ("grpc._server", "WARNING"), ("py.warnings", "WARNING")}


def test_a_second_configuration_replaces_the_first(configured):
    again = io.StringIO()
    handler = log_setup.configure_logging("text", "warning", stream=again)
    try:
        logging.getLogger("mwms.server").warning("once")
        assert configured.getvalue() == ""
        assert again.getvalue().count("\n") == 1 and "WARNING mwms.server: once" in again.getvalue()
    finally:
        logging.getLogger().removeHandler(handler)


def test_an_uncaught_exception_in_a_thread_is_one_json_record(configured):
    def crash() -> None:
        raise ValueError("boom\nwith a second line")

    thread = threading.Thread(target=crash, name="reader")
    thread.start()
    thread.join()

    (entry,) = lines_of(configured)
    assert entry["level"] == "ERROR" and entry["message"] == "uncaught exception in thread reader"
    assert str(entry["exc_info"]).endswith("ValueError: boom\nwith a second line")
