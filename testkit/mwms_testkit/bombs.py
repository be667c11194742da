"""Archive bombs, built in milliseconds: one compressed piece is made once and repeated.

A gzip file may hold many members one after the other, and a zip's entries may share one compressed
body, so a bomb that unpacks to GiB costs a few MB of memory and a fraction of a second to build.
"""

from __future__ import annotations

import gzip
import io
import struct
import tarfile
import zlib
from pathlib import Path

MIB = 1024**2
GIB = 1024**3
PIECE = 64 * MIB


def tar_header(name: str, size: int) -> bytes:
    info = tarfile.TarInfo(name)
    info.size = size
    info.mode = 0o644
    return info.tobuf(format=tarfile.GNU_FORMAT)


def gzip_bomb(path: Path, unpacked: int, piece: int = PIECE) -> Path:
    """A tar.gz of `unpacked // piece` entries of `piece` zeros each (each under any per-entry check)."""
    member = gzip.compress(tar_header("zeros.bin", piece) + bytes(piece), compresslevel=9)
    with path.open("wb") as out:
        for _ in range(unpacked // piece):
            out.write(member)
        out.write(gzip.compress(bytes(1024)))  # the end-of-archive blocks
    return path


def many_entries_bomb(path: Path, entries: int) -> Path:
    """A tar.gz of `entries` one-byte files (`entries` a multiple of 4096)."""
    block = tar_header("f", 1) + b"x" + bytes(511)
    piece = gzip.compress(block * 4096, compresslevel=6)
    with path.open("wb") as out:
        for _ in range(entries // 4096):
            out.write(piece)
        out.write(gzip.compress(bytes(1024)))
    return path


def zip_bomb(path: Path, entries: int, piece: int = PIECE) -> Path:
    """A zip of `entries` entries of `piece` zeros, each stored once (no overlapping tricks needed)."""
    compressor = zlib.compressobj(9, zlib.DEFLATED, -15)
    body = compressor.compress(bytes(piece)) + compressor.flush()
    crc = zlib.crc32(bytes(piece))
    out = io.BytesIO()
    central = io.BytesIO()
    for index in range(entries):
        name = f"zeros-{index}.bin".encode()
        offset = out.tell()
        fields = (20, 0, 8, 0, 0, crc, len(body), piece, len(name))
        out.write(struct.pack("<4s5HIIIHH", b"PK\x03\x04", *fields, 0) + name + body)
        central.write(
            struct.pack("<4s6HIIIHHHHHII", b"PK\x01\x02", 20, *fields, 0, 0, 0, 0, 0o644 << 16, offset) + name
        )
    directory = central.getvalue()
    start = out.tell()
    out.write(directory)
    out.write(struct.pack("<4s4HIIH", b"PK\x05\x06", 0, 0, entries, entries, len(directory), start, 0))
    path.write_bytes(out.getvalue())
    return path


# --- request floods (issue 16): bodies and heads that cost a parser time, not memory ---


def many_parts_body(parts: int, boundary: bytes = b"b") -> bytes:
    """A multipart/form-data body of `parts` empty fields (51 bytes each), then its closing boundary."""
    part = b"--" + boundary + b'\r\nContent-Disposition: form-data; name="x"\r\n\r\n\r\n'
    return part * parts + b"--" + boundary + b"--\r\n"


def hpack_int(value: int, prefix_bits: int) -> bytes:
    """An HPACK integer (RFC 7541 5.1) with a `prefix_bits`-bit prefix and the other bits of the first byte 0."""
    limit = (1 << prefix_bits) - 1
    if value < limit:
        return bytes([value])
    out = [limit]
    value -= limit
    while value >= 128:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def http2_frame(kind: int, flags: int, stream: int, payload: bytes) -> bytes:
    return len(payload).to_bytes(3, "big") + bytes([kind, flags]) + stream.to_bytes(4, "big") + payload


def grpc_call_head(path: bytes, metadata_bytes: int) -> bytes:
    """The start of an HTTP/2 connection and of a gRPC call to `path` whose one metadata value is declared
    `metadata_bytes` long; the value itself follows in CONTINUATION frames (`http2_frame(9, 0, 1, ...)`)."""

    def literal(name: bytes, value: bytes) -> bytes:  # literal without indexing, new name
        return b"\x00" + hpack_int(len(name), 7) + name + hpack_int(len(value), 7) + value

    block = b"\x83\x86"  # :method POST, :scheme http (static table)
    block += b"\x04" + hpack_int(len(path), 7) + path  # :path, name from the static table
    block += literal(b":authority", b"127.0.0.1") + literal(b"content-type", b"application/grpc")
    block += literal(b"te", b"trailers") + b"\x00" + hpack_int(5, 7) + b"x-big" + hpack_int(metadata_bytes, 7)
    preface = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + http2_frame(4, 0, 0, b"")  # and empty SETTINGS
    return preface + http2_frame(1, 0, 1, block)  # HEADERS without END_HEADERS
