"""Shard checksums: xxh3-64 over the stored bytes, fast enough to verify on first read."""

from __future__ import annotations

from pathlib import Path

import xxhash

PREFIX = "xxh3_64:"


def checksum_bytes(data: bytes | memoryview) -> str:
    return PREFIX + xxhash.xxh3_64_hexdigest(data)


def checksum_parts(parts: list[memoryview]) -> str:
    """`checksum_bytes` of the parts joined, without joining them."""
    h = xxhash.xxh3_64()
    for part in parts:
        h.update(part)
    return PREFIX + h.hexdigest()


def checksum_file(path: Path, block: int = 8 << 20) -> str:
    h = xxhash.xxh3_64()
    with open(path, "rb") as f:
        while chunk := f.read(block):
            h.update(chunk)
    return PREFIX + h.hexdigest()
