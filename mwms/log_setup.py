"""Logging of the two daemons (`mwms server`, `mwms agent`): one handler on stderr, one line per record.

Formats (`--log-format`):
- text: ``2026-12-02 09:18:48,123 INFO mwms.server: message``. A message or traceback that spans lines
  is folded into its line: newlines are written as ``\\n``, other control characters as ``\\xNN``, so a
  line reader (journald, a terminal) sees one record per line and no escape sequence reaches a terminal.
- json: one JSON object per line, ASCII only: ``time`` (ISO 8601, UTC, milliseconds, ``Z``), ``level``,
  ``logger``, ``message``, then the record's extra fields (``log.info(..., extra={"job_id": ...})``) as
  keys of their own, ``exc_info`` (the whole traceback, one string) and ``stack_info`` when present. An
  extra field named like one of the first four is written as ``extra_<name>``; a value JSON cannot hold
  is written as its str().

Every logger goes through that handler: ours, uvicorn's (the coordinator starts it with log_config=None),
gRPC's Python logger, asyncio's, warnings (logging.captureWarnings) and uncaught exceptions in the main
thread or any other (sys.excepthook, threading.excepthook).

Standard library only, on purpose: the agent and `mwms --help` import it without the server's extras, and
the format is this small module's contract, not a library's defaults.
"""

from __future__ import annotations

import json
import logging
import math
import re
import sys
import threading
from datetime import datetime, timezone
from types import TracebackType
from typing import IO, Any

FORMATS = ("text", "json")
LEVELS = ("debug", "info", "warning", "error")
DEFAULT_FORMAT = "text"
DEFAULT_LEVEL = "info"
TEXT_LAYOUT = "%(asctime)s %(levelname)s %(name)s: %(message)s"

# Attributes every LogRecord has: anything else on a record came from `extra=`.
_RECORD_ATTRIBUTES = frozenset(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {
    "message",
    "asctime",
    "taskName",
    "color_message",  # uvicorn's copy of its message with terminal colours, for its own formatter
}
_FIRST_FIELDS = ("time", "level", "logger", "message")
# C0 and C1 controls, DEL, and the Unicode line and paragraph separators some readers break lines on.
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]")
_ESCAPES = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}
# Marks the handler configure_logging installed, so a second call replaces it instead of adding one.
_OURS = "_mwms_log_setup"


def parse_format(value: str) -> str:
    """`value` as a log format (text or json, any case); ValueError saying what it must be otherwise."""
    chosen = value.strip().lower()
    if chosen not in FORMATS:
        raise ValueError(f"log format {value!r} is not one of {', '.join(FORMATS)}")
    return chosen


def parse_level(value: str) -> str:
    """`value` as a log level (debug, info, warning or error, any case); ValueError otherwise."""
    chosen = value.strip().lower()
    if chosen not in LEVELS:
        raise ValueError(f"log level {value!r} is not one of {', '.join(LEVELS)}")
    return chosen


def fold(text: str) -> str:
    """`text` on one line: newlines as \\n, tabs as \\t, other control characters as \\xNN or \\uNNNN."""
    return _CONTROL.sub(_escape, text)


def _escape(match: re.Match[str]) -> str:
    character = match.group()
    code = ord(character)
    return _ESCAPES.get(character) or (f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}")


class OneLineFormatter(logging.Formatter):
    """The text format: TEXT_LAYOUT, with the message and any traceback folded into one line."""

    def __init__(self) -> None:
        super().__init__(TEXT_LAYOUT)

    def format(self, record: logging.LogRecord) -> str:
        return fold(super().format(record))


class JsonFormatter(logging.Formatter):
    """The json format: one object per record (see the module docstring for its fields)."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": utc_time(record.created),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key, value in vars(record).items():
            if key in _RECORD_ATTRIBUTES or key.startswith("_"):
                continue
            entry[f"extra_{key}" if key in _FIRST_FIELDS else key] = _jsonable(value)
        if record.exc_info:
            if not record.exc_text:  # cached on the record, as logging.Formatter does
                record.exc_text = self.formatException(record.exc_info)
        if record.exc_text:
            entry["exc_info"] = record.exc_text
        if record.stack_info:
            entry["stack_info"] = self.formatStack(record.stack_info)
        try:
            return json.dumps(entry, default=str, allow_nan=False)
        except (TypeError, ValueError):  # NaN deep in a value, keys that are not strings: say it anyway
            return json.dumps({key: _jsonable(value, deep=False) for key, value in entry.items()})


def utc_time(created: float) -> str:
    """A record's time as ISO 8601 in UTC with milliseconds: 2026-12-02T09:18:48.123Z."""
    moment = datetime.fromtimestamp(created, tz=timezone.utc)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _jsonable(value: Any, deep: bool = True) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)  # NaN and Infinity are not JSON
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    return value if deep else str(value)


def formatter_for(log_format: str) -> logging.Formatter:
    """The formatter of `log_format` (one of FORMATS)."""
    return JsonFormatter() if parse_format(log_format) == "json" else OneLineFormatter()


def configure_logging(
    log_format: str = DEFAULT_FORMAT, level: str = DEFAULT_LEVEL, stream: IO[str] | None = None
) -> logging.Handler:
    """Sends every record of this process at `level` or above to `stream` (stderr) in `log_format`.

    Called once by each daemon before it logs; a second call replaces what the first installed.
    """
    handler = logging.StreamHandler(stream if stream is not None else sys.stderr)
    handler.setFormatter(formatter_for(log_format))
    setattr(handler, _OURS, True)
    root = logging.getLogger()
    for previous in [h for h in root.handlers if getattr(h, _OURS, False)]:
        root.removeHandler(previous)
    root.addHandler(handler)
    root.setLevel(parse_level(level).upper())
    # Loggers that libraries may have given handlers of their own write through ours instead.
    # A dictConfig run before (uvicorn's own) may have disabled them or set levels of their own.
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access", "grpc", "asyncio", "py.warnings"):
        library = logging.getLogger(name)
        library.handlers = [h for h in library.handlers if isinstance(h, logging.NullHandler)]
        library.propagate = True
        library.disabled = False
        library.setLevel(logging.NOTSET)
    # Off, then on: if an earlier call captured and something put warnings.showwarning back since
    # (warnings.catch_warnings does), logging still believes it captures and a plain True does nothing.
    logging.captureWarnings(False)
    logging.captureWarnings(True)
    sys.excepthook = _log_uncaught
    threading.excepthook = _log_uncaught_in_thread
    return handler


def _log_uncaught(kind: type[BaseException], error: BaseException, traceback: TracebackType | None) -> None:
    if issubclass(kind, KeyboardInterrupt):
        sys.__excepthook__(kind, error, traceback)
        return
    logging.getLogger("mwms").critical("uncaught exception", exc_info=(kind, error, traceback))


def _log_uncaught_in_thread(args: threading.ExceptHookArgs) -> None:
    if args.exc_type is SystemExit:
        return  # as threading's own hook: a thread that exits is no error
    name = args.thread.name if args.thread is not None else "?"
    error = args.exc_value if args.exc_value is not None else args.exc_type()
    logging.getLogger("mwms").error(
        "uncaught exception in thread %s", name, exc_info=(args.exc_type, error, args.exc_traceback)
    )
