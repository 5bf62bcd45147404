"""This machine's cache files of checked data (shard tables, verified-store indexes): magic, header, body, mapped.

A file is its magic line, the length of a JSON header (8 bytes, little-endian), the header, then
a body of columns. It is written whole to a temporary name and renamed over (never truncated in
place), so a reader that maps it keeps the bytes it mapped; what a header promises (sizes,
digests) is each reader's to check.
"""

from __future__ import annotations

import json
import mmap
import os
from pathlib import Path
from typing import Any


def frame(magic: bytes, header: dict, pad_to: int = 1) -> bytes:
    """The magic, the header's length and the header, zero-padded to a multiple of `pad_to` bytes (the body's alignment)."""
    text = json.dumps(header).encode()
    head = magic + len(text).to_bytes(8, "little") + text
    return head + b"\0" * (-len(head) % pad_to)


def unframe(raw: bytes | mmap.mmap, magic: bytes) -> tuple[dict[str, Any], int] | None:
    """(header, where the header ends) of a framed file, or None if it is not one (another magic, a torn header)."""
    try:
        if raw[: len(magic)] != magic:
            return None
        at = len(magic) + 8
        size = int.from_bytes(raw[len(magic) : at], "little")
        header = json.loads(raw[at : at + size])
    except ValueError:  # not JSON, not UTF-8
        return None
    return (header, at + size) if isinstance(header, dict) else None


def mapped(path: Path) -> mmap.mmap | None:
    """The file read-only mapped, or None (absent, unreadable or empty)."""
    try:
        with open(path, "rb") as f:
            return mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    except (OSError, ValueError):  # ValueError: an empty file cannot be mapped
        return None


def replace(path: Path, parts: list[bytes]) -> bool:
    """Write `parts` to `path` atomically (a temporary file renamed over it); False if it could not be written."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_bytes(b"".join(parts))
        os.replace(tmp, path)
    except OSError:
        tmp.unlink(missing_ok=True)
        return False
    return True
