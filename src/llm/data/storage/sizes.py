"""Size strings ("64MB", "1.5GiB", "512kb", "100 MB", "4096") read as bytes: the one parser for cache and chunk sizes,
and the one way sizes are printed (`format_size`).

Hand-written rather than pydantic's ByteSize: ByteSize reads "MB" as 10**6 bytes, while every
size in this library (chunk_bytes, max_cache_size) means 2**20; switching would shrink them.
"""

from __future__ import annotations

import math

_UNITS = (("KB", 1 << 10), ("MB", 1 << 20), ("GB", 1 << 30), ("TB", 1 << 40), ("B", 1))


def parse_bytes(text: str) -> int | None:
    """Bytes in `text` (binary units: KB = 1024, KiB the same; no unit: bytes), or None when it is not a size."""
    upper = text.strip().upper().replace("IB", "B")
    factor = 1
    for suffix, scale in _UNITS:
        if upper.endswith(suffix):
            upper, factor = upper[: -len(suffix)], scale
            break
    try:
        number = float(upper)
        return int(number * factor) if math.isfinite(number) else None
    except (ValueError, OverflowError):
        return None


def format_size(n: float) -> str:
    """Bytes as people read them, in powers of 1000: '512 B', '4.2 KB', '1.5 GB', '2.0 TB'."""
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1000:
            return f"{n:,.0f} {unit}" if unit == "B" else f"{n:,.1f} {unit}"
        n /= 1000
    return f"{n:,.1f} TB"


def parse_cache_size(value: int | str | None) -> int | None:
    """'50GB', '100MB', 1_000_000 or None (no limit)."""
    if value is None:
        return None
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value
    size = parse_bytes(value) if isinstance(value, str) else None
    if size is not None and size > 0:
        return size
    raise ValueError(f"max_cache_size {value!r} is not a size like '50GB' or '500MB' (or None for no limit)")
