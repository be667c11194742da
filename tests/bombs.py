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
