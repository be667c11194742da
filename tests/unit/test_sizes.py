"""Memory sizes as people write them (mwms/sizes.py): binary units whatever their spelling, plain bytes,
a clear refusal of anything else; and as they read them."""

from __future__ import annotations

import pytest

from mwms.sizes import SizeError, format_size, parse_size

GiB = 2**30


@pytest.mark.parametrize(
    ("text", "size"),
    [
        ("8G", 8 * GiB),
        ("8GiB", 8 * GiB),
        ("8gb", 8 * GiB),
        ("8 Gi", 8 * GiB),
        ("512M", 512 * 2**20),
        ("512MiB", 512 * 2**20),
        ("1.5G", 3 * GiB // 2),
        ("2T", 2 * 2**40),
        ("64k", 64 * 1024),
        ("1073741824", GiB),
        ("1073741824B", GiB),
        (" 8G ", 8 * GiB),
    ],
)
def test_sizes_in_binary_units(text: str, size: int) -> None:
    assert parse_size(text) == size


@pytest.mark.parametrize("text", ["8X", "", "G", "-1G", "8 G B", "1e9", "eight", "8GiBs"])
def test_anything_else_is_refused_saying_how_to_write_a_size(text: str) -> None:
    with pytest.raises(SizeError) as refused:
        parse_size(text, "--memory-per-worker")
    assert str(refused.value).startswith(f"--memory-per-worker {text!r}: give a size such as 8G or 512M")


@pytest.mark.parametrize(
    ("size", "text"),
    [(8 * GiB, "8 GiB"), (1288490188, "1.2 GiB"), (512 * 2**20, "512 MiB"), (1023, "1023 B"), (0, "0 B")],
)
def test_format_size(size: int, text: str) -> None:
    assert format_size(size) == text
