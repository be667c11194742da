"""The ingest process's pipe protocol: length-prefixed frames, a group of batches one way, its outcome back.

The coordinator (server/live/ingest_process.py) writes the process's configuration as one JSON line first
(the database URL may hold a password: never on a command line), then one request frame per group; the
process (server/ingest_worker.py) answers one reply frame per request, in order.

The process's first frame is READY, once it has imported what it needs and opened the database (so the
coordinator tells a process that died starting from one that died storing a group). A frame is a
4-byte big-endian length, then that many bytes. A request holds a 4-byte header length, the
header (JSON: the group's number and, per batch, [agent id, task id, kind, payload length]), then the
batches' payloads (serialized LogBatch / MetricBatch) one after the other, so no batch is converted or
copied item by item on either side of the pipe. A reply is JSON: the group's number, an outcome per batch
([acked seq, rejected, reason, changed], or {"error": ...} for a batch stored nothing), the agents to wake,
the write lock's hold, the metric updates made in the process (server/observability/metric_relay.py),
and "error" when the whole group failed.

Errors cross as their class name and message: a DomainError comes back as the same class (its stream
ends the way it would have in-process), a transient database error as an OperationalError (the streams
end and their agents resend), anything else as IngestItemError (the batch is refused with the message).
"""

from __future__ import annotations

import json
import struct
from collections.abc import Sequence
from typing import Any

from sqlalchemy.exc import OperationalError

from mwms.server import errors as domain_errors
from mwms.server.errors import DomainError
from mwms.server.live.ingest_store import KINDS, RawBatch, StoredGroup
from mwms.server.poison import is_transient
from mwms.server.services.observing.telemetry import StoreOutcome

LENGTH = struct.Struct(">I")
# A group holds at most MAX_ITEMS_PER_TRANSACTION items of at most the agents' message size each; a frame
# past this is a broken pipe, not a group.
MAX_FRAME_BYTES = 1 << 30


READY = b"ready"


class IngestItemError(RuntimeError):
    """A batch the ingest process could not decode or apply (not the database's trouble): refused."""


class FrameError(ValueError):
    """A frame that breaks the protocol (a length past MAX_FRAME_BYTES, a header that does not parse)."""


def frame(body: bytes) -> bytes:
    """`body` with its length in front."""
    return LENGTH.pack(len(body)) + body


def frame_length(prefix: bytes) -> int:
    """The length a frame's first 4 bytes announce."""
    (length,) = LENGTH.unpack(prefix)
    if length > MAX_FRAME_BYTES:
        raise FrameError(f"a frame of {length} bytes is past the protocol's {MAX_FRAME_BYTES}")
    return length


def encode_request(number: int, batches: Sequence[RawBatch]) -> bytes:
    """The request frame of group `number` (length prefix included)."""
    header = json.dumps(
        {"group": number, "batches": [[b.agent_id, b.task_id, b.kind, len(b.payload)] for b in batches]},
        separators=(",", ":"),
    ).encode()
    return frame(b"".join([LENGTH.pack(len(header)), header, *(b.payload for b in batches)]))


def decode_request(body: bytes) -> tuple[int, list[RawBatch]]:
    """A request frame's body (without its length prefix): the group's number and its batches."""
    try:
        (header_length,) = LENGTH.unpack_from(body)
        header = json.loads(body[LENGTH.size : LENGTH.size + header_length])
        offset = LENGTH.size + header_length
        batches = []
        for agent_id, task_id, kind, length in header["batches"]:
            if kind not in KINDS:
                raise FrameError(f"no telemetry kind {kind!r}")
            payload = body[offset : offset + length]
            offset += length
            batches.append(RawBatch(str(agent_id), str(task_id), kind, payload, 0))
        return int(header["group"]), batches
    except (struct.error, ValueError, KeyError, TypeError) as error:
        raise FrameError(f"a request frame that does not parse: {error}") from error


def _error_out(error: BaseException) -> dict[str, Any]:
    kind = "domain" if isinstance(error, DomainError) else "transient" if is_transient(error) else "item"
    text = str(getattr(error, "orig", None) or error) or type(error).__name__
    return {"error": kind, "type": type(error).__name__, "message": text[:2000]}


def _error_in(record: dict[str, Any]) -> Exception:
    message = str(record.get("message", ""))
    if record.get("error") == "domain":
        cls = getattr(domain_errors, str(record.get("type")), None)
        if isinstance(cls, type) and issubclass(cls, DomainError):
            return cls(message)
        return DomainError(message)
    if record.get("error") == "transient":
        return OperationalError("a telemetry transaction in the ingest process", None, RuntimeError(message))
    return IngestItemError(f"{record.get('type', 'Error')}: {message}")


def encode_reply(
    number: int,
    stored: StoredGroup | None,
    metrics: list[Any],
    failure: BaseException | None = None,
) -> bytes:
    """The reply frame of group `number`: its outcomes, or the `failure` of the whole group."""
    reply: dict[str, Any] = {"group": number, "metrics": metrics}
    if failure is not None or stored is None:
        reply["failed"] = _error_out(failure or RuntimeError("no outcome"))
    else:
        reply["outcomes"] = [
            _error_out(o) if isinstance(o, Exception) else [o.acked_seq, o.rejected, o.reason, o.changed]
            for o in stored.outcomes
        ]
        reply["targets"] = sorted(stored.targets)
        reply["held_s"] = stored.held_s
    return frame(json.dumps(reply, separators=(",", ":")).encode())


def decode_reply(body: bytes) -> tuple[int, StoredGroup | Exception, list[Any]]:
    """A reply frame's body: the group's number, its outcome (or what failed it), the metric records."""
    try:
        reply = json.loads(body)
        number = int(reply["group"])
        metrics = list(reply.get("metrics") or [])
        if "failed" in reply:
            return number, _error_in(reply["failed"]), metrics
        outcomes: list[StoreOutcome | Exception] = [
            _error_in(o)
            if isinstance(o, dict)
            else StoreOutcome(acked_seq=int(o[0]), rejected=int(o[1]), reason=str(o[2]), changed=bool(o[3]))
            for o in reply["outcomes"]
        ]
        stored = StoredGroup(
            outcomes=outcomes, targets={str(t) for t in reply["targets"]}, held_s=float(reply["held_s"])
        )
        return number, stored, metrics
    except (ValueError, KeyError, TypeError, IndexError) as error:
        raise FrameError(f"a reply frame that does not parse: {error}") from error
