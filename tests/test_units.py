"""One reading of a size for the whole project: every K/M/G binary, ``GB`` as ``GiB``."""

from __future__ import annotations

import pytest

from oom_sentinel.daemon.core.units import GIB, KIB, MIB, format_bytes, parse_size, size_bytes


@pytest.mark.parametrize(
    ("number", "unit", "expected"),
    [
        ("0", "bytes", 0),
        ("2.00", "GiB", 2 * GIB),
        ("184.73", "MiB", round(184.73 * MIB)),
        ("136.", "GiB", 136 * GIB),
        ("1,234", "kB", 1234 * KIB),
        ("1", "TiB", 1024 * GIB),
        ("8.21", "GB", round(8.21 * GIB)),  # MPS: "Invalid buffer size: 8.21 GB", 1024-based
        ("x", "GiB", None),
        ("1", "parsecs", None),
        ("-1", "GiB", None),
        ("1e30", "B", None),
    ],
)
def test_sizes_from_log_text_are_binary_multiples(
    number: str, unit: str, expected: int | None
) -> None:
    assert size_bytes(number, unit) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("8GiB", 8 * GIB),
        ("8GB", 8 * GIB),  # the same: ComfyUI's --reserve-vram GB and torch's GB are 1024**3
        ("8 gb", 8 * GIB),
        ("8G", 8 * GIB),
        ("8192MiB", 8 * GIB),
        ("400 MB", 400 * MIB),  # ComfyUI's default VRAM reserve, 400 * 1024 * 1024
        ("1.5GiB", round(1.5 * GIB)),
        (".5G", GIB // 2),
        ("1048576", MIB),
        ("1,024 MiB", GIB),
        (" 4096 KiB ", 4 * MIB),
        ("0", 0),
        ("lots", None),
        ("", None),
        ("-1G", None),
        ("8 parsecs", None),
        ("8QiB", None),
        ("8 G B", None),
        ("8GiB and more", None),
    ],
)
def test_a_typed_size_reads_as_one_size_or_none(text: str, expected: int | None) -> None:
    assert parse_size(text) == expected


def test_a_parsed_size_prints_back_as_it_was_typed() -> None:
    assert format_bytes(parse_size("8GB")) == "8.00 GiB"
    assert format_bytes(parse_size("2.00 GiB")) == "2.00 GiB"
