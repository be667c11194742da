"""/api/v1/bundles: program archives, stored once per sha256.

The body is parsed as it streams in, never spooled whole first: an upload whose Content-Length is over
the limit is refused before a byte of it is read, and one without (chunked) is cut off at the limit.
Parsing the multipart body, writing and checking the archive run in the archive workers' pool, never on
the event loop (gRPC heartbeats and every request share it) nor on the threads heartbeats use; the
multipart body may have a few small parts only (MAX_MULTIPART_PARTS, MAX_PART_HEADER_BYTES), so a body
of 800,000 tiny parts is refused at its 17th part instead of costing half a minute of parsing.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from python_multipart.exceptions import FormParserError
from python_multipart.multipart import MultipartParser, parse_options_header

from mwms.archive import ArchiveWorkers, archive_workers
from mwms.server.api.deps import WiringDep
from mwms.server.api.errors import closing_on_refusal
from mwms.server.errors import InvalidInput
from mwms.server.limits import MAX_MULTIPART_PARTS, MAX_PART_HEADER_BYTES
from mwms.server.schemas import BundleOut, ErrorOut
from mwms.server.services.storage.bundles import check_bundle, record_bundle, share_bundle
from mwms.server.services.storage.uploads import UploadSpool, check_body_size

router = APIRouter(prefix="/api/v1/bundles", tags=["bundles"])

# Received body bytes are handed to the pool (parsed, written) in pieces of about this size.
WRITE_BATCH = 1024 * 1024
FILE_FIELD = "file"
RAW_ARCHIVE_TYPES = {"application/gzip", "application/x-gzip", "application/zip", "application/octet-stream"}
WRONG_BODY = (
    "send the archive as the multipart/form-data field 'file', or as the whole body with "
    "Content-Type application/gzip or application/zip"
)
REQUEST_BODY = {
    "required": True,
    "content": {
        "multipart/form-data": {
            "schema": {
                "type": "object",
                "required": [FILE_FIELD],
                "properties": {
                    FILE_FIELD: {
                        "type": "string",
                        "format": "binary",
                        "description": ".tar.gz or .zip of the program",
                    }
                },
            }
        },
        # The raw body (the archive with Content-Type application/gzip, application/zip or
        # application/octet-stream) is taken too, but is told in the description only: given two
        # content types, openapi-python-client 0.29 generates a client that does not import.
    },
}


@router.post(
    "",
    status_code=201,
    response_model=BundleOut,
    responses={
        200: {"model": BundleOut},
        400: {
            "model": ErrorOut,
            "description": "the body is not a .tar.gz or .zip archive, breaks an archive limit, or is a "
            "malformed multipart body",
        },
        413: {"model": ErrorOut, "description": "the upload is over MWMS_MAX_UPLOAD_BYTES"},
    },
    openapi_extra={"requestBody": REQUEST_BODY},
)
async def upload_bundle(wiring: WiringDep, request: Request) -> JSONResponse:
    """Stores a program bundle (multipart field `file`, or the archive as the whole body with Content-Type
    application/octet-stream, application/gzip or application/zip); 201 when new, 200 when
    the same content was already stored; 413 over the upload limit, refused before the body is read
    when its Content-Length says so."""
    settings = wiring.settings
    limit = settings.max_upload_bytes
    declared = _content_length(request)
    if declared is not None:
        with closing_on_refusal(request):
            check_body_size(declared, limit)
    workers = archive_workers(settings.archive_workers)
    spool = await workers.run(UploadSpool, settings.bundle_dir, limit)
    try:
        with closing_on_refusal(request):
            filename = await _receive_archive(request, spool, workers)
            spooled, digest, size, archive_format = await workers.run(
                check_bundle, spool, settings.archive_limits
            )
        # Before the Bundle row exists, and outside the writer lock: see server/services/storage/shared_files.py.
        await workers.run(share_bundle, wiring.db, settings.bundle_dir, spooled, digest)
    except BaseException:
        spool.discard()
        raise

    def store() -> BundleOut:
        try:
            with wiring.db.write() as session:
                bundle, created = record_bundle(
                    session, settings.bundle_dir, spooled, digest, size, archive_format, filename
                )
                return BundleOut(
                    digest=bundle.digest, size=bundle.size, format=bundle.archive_format, created=created
                )
        finally:
            spooled.unlink(missing_ok=True)  # moved into place unless something failed

    out = await asyncio.to_thread(store)
    return JSONResponse(status_code=201 if out.created else 200, content=out.model_dump())


def _content_length(request: Request) -> int | None:
    value = request.headers.get("content-length")
    if value is None:
        return None
    if not value.isdigit():
        raise InvalidInput(f"the Content-Length header {value[:40]!r} is not a number of bytes")
    return int(value)


async def _receive_archive(request: Request, spool: UploadSpool, workers: ArchiveWorkers) -> str:
    """Streams the archive in the body into `spool`; returns the uploaded file's name ("" when none)."""
    content_type, options = parse_options_header(request.headers.get("content-type", ""))
    kind = content_type.decode("latin-1").lower()
    if kind in RAW_ARCHIVE_TYPES:
        await _receive(request, _Passthrough(), spool, workers)
        return ""
    if kind != "multipart/form-data" or not options.get(b"boundary"):
        raise InvalidInput(WRONG_BODY)
    form = _FilePart(options[b"boundary"])
    await _receive(request, form, spool, workers)
    if not form.complete:
        raise InvalidInput(f"the upload has no complete '{FILE_FIELD}' part; {WRONG_BODY}")
    return Path(form.filename).name[:255]


async def _receive(
    request: Request, body: _Passthrough | _FilePart, spool: UploadSpool, workers: ArchiveWorkers
) -> None:
    """Hands the body to `body` in the pool, in batches, which writes the archive's bytes to `spool`;
    stops at the limit. The event loop only collects the chunks."""
    received = 0
    batch: list[bytes] = []
    batched = 0
    async for chunk in request.stream():
        received += len(chunk)
        check_body_size(received, spool.max_bytes)
        batch.append(chunk)
        batched += len(chunk)
        if batched >= WRITE_BATCH:
            await workers.run(body.take, batch, spool)
            batch, batched = [], 0
    await workers.run(body.finish, batch, spool)


class _Passthrough:
    """A raw archive body: every byte is the archive's."""

    def take(self, chunks: list[bytes], spool: UploadSpool) -> None:
        spool.write(b"".join(chunks))

    def finish(self, chunks: list[bytes], spool: UploadSpool) -> None:
        self.take(chunks, spool)


class _FilePart:
    """A streaming multipart parse that keeps the bytes of the one `file` part and drops the rest; runs
    in the pool, one batch at a time."""

    def __init__(self, boundary: bytes) -> None:
        self.pending = bytearray()
        self.filename = ""
        self.complete = False
        self._parts = 0
        self._header_bytes = 0
        self._header_field = bytearray()
        self._header_value = bytearray()
        self._disposition = b""
        self._in_file = False
        self._seen_file = False
        self.parser = MultipartParser(
            boundary,
            {
                "on_part_begin": self._part_begin,
                "on_header_field": lambda data, start, end: self._header_piece(
                    self._header_field, data[start:end]
                ),
                "on_header_value": lambda data, start, end: self._header_piece(
                    self._header_value, data[start:end]
                ),
                "on_header_end": self._header_end,
                "on_headers_finished": self._headers_finished,
                "on_part_data": self._part_data,
                "on_part_end": self._part_end,
            },
        )

    def take(self, chunks: list[bytes], spool: UploadSpool) -> None:
        """Parses `chunks`, the next pieces of the body, and writes the file part's bytes among them."""
        try:
            for chunk in chunks:
                self.parser.write(chunk)
        except FormParserError as error:
            raise InvalidInput(f"the multipart body is malformed ({error}); {WRONG_BODY}") from None
        if self.pending:
            spool.write(bytes(self.pending))
            self.pending.clear()

    def finish(self, chunks: list[bytes], spool: UploadSpool) -> None:
        """Parses the last pieces of the body; InvalidInput when the body ends inside a part."""
        self.take(chunks, spool)
        try:
            self.parser.finalize()
        except FormParserError as error:
            raise InvalidInput(f"the multipart body is malformed ({error}); {WRONG_BODY}") from None

    def _part_begin(self) -> None:
        self._parts += 1
        if self._parts > MAX_MULTIPART_PARTS:
            raise InvalidInput(
                f"the multipart body has more than {MAX_MULTIPART_PARTS} parts; {WRONG_BODY}, "
                "with no more than a few other fields"
            )
        self._header_bytes = 0
        self._disposition = b""
        self._in_file = False

    def _header_piece(self, into: bytearray, piece: bytes) -> None:
        self._header_bytes += len(piece)
        if self._header_bytes > MAX_PART_HEADER_BYTES:
            raise InvalidInput(
                f"a part of the multipart body has over {MAX_PART_HEADER_BYTES} bytes of headers; "
                f"{WRONG_BODY}, with its usual Content-Disposition and Content-Type headers only"
            )
        into.extend(piece)

    def _header_end(self) -> None:
        if bytes(self._header_field).lower() == b"content-disposition":
            self._disposition = bytes(self._header_value)
        self._header_field.clear()
        self._header_value.clear()

    def _headers_finished(self) -> None:
        _, params = parse_options_header(self._disposition)
        if params.get(b"name", b"").decode("utf-8", "replace") != FILE_FIELD:
            return
        if self._seen_file:
            raise InvalidInput(f"the upload has more than one '{FILE_FIELD}' part: send one archive")
        self._seen_file = self._in_file = True
        self.filename = params.get(b"filename", b"").decode("utf-8", "replace")

    def _part_data(self, data: bytes, start: int, end: int) -> None:
        if self._in_file:
            self.pending += data[start:end]

    def _part_end(self) -> None:
        if self._in_file:
            self.complete = True
            self._in_file = False
