"""Partitioning policy: byte ranges of big files, stripes of row-offset partitions, and who owns what.

Partitions never depend on the topology, so cursors saved on one topology resume
on any other. Row-offset partitions (a compressed file, a parquet row group, an
HF shard, a custom source) are cut into `STRIPES` stripes (row r belongs to
stripe (r - 1) % STRIPES), so one such partition still feeds several ranks;
consumer `rank * W + worker` then owns whole groups round robin.
"""

from __future__ import annotations

import math
from dataclasses import replace

from llm.data.inputs.source import Partition

# Byte-range partitions of uncompressed line files: aim at this many partitions in
# all, each between these sizes, so that small corpora still spread over a few ranks.
TARGET_PARTITIONS = 64
MIN_PARTITION_BYTES = 1 << 10
MAX_PARTITION_BYTES = 64 << 20
# Stripes per row-offset partition: fixed, so cursors do not depend on the topology.
STRIPES = 8


def partition_bytes(total: int) -> int:
    """The byte-range size for `total` splittable bytes: about TARGET_PARTITIONS pieces, clamped."""
    size = math.ceil(total / TARGET_PARTITIONS) if total else MIN_PARTITION_BYTES
    return min(MAX_PARTITION_BYTES, max(MIN_PARTITION_BYTES, size))


def byte_ranges(size: int, piece: int) -> list[tuple[int, int]]:
    """[start, end) ranges of at most `piece` bytes covering a file of `size` bytes (one if empty).

    A range owns the lines that *start* inside it, so consecutive ranges cover every
    line once whatever the cut points (`readers.iter_line_range`).
    """
    return [(start, min(start + piece, size)) for start in range(0, max(size, 1), piece)]


def stripe_partitions(parts: list[Partition], stripes: int = STRIPES) -> list[Partition]:
    """Row-offset partitions cut into `stripes` stripes each; byte ranges stay whole."""
    out: list[Partition] = []
    for p in parts:
        if p.seekable or stripes == 1:
            out.append(p)
            continue
        for j in range(stripes):
            out.append(replace(p, key=f"{p.key}/s{j}of{stripes}", stripe=j, stripes=stripes, base=p.key))
    return out


def assign_partitions(parts: list[Partition], consumer: int, consumers: int) -> list[Partition]:
    """The partitions consumer `consumer` (= rank * workers + worker) owns.

    Whole groups (a byte range, or all stripes of one file / shard) go round robin
    when there are at least as many groups as consumers, so nothing is read twice;
    otherwise the stripes themselves do, and a group is read by several consumers,
    each keeping its own stripes. Cursors are per partition, so any assignment can
    resume from any other.
    """
    groups = list(dict.fromkeys(p.group for p in parts))
    if len(groups) >= consumers:
        owned_groups = {g for i, g in enumerate(groups) if i % consumers == consumer}
        return [p for p in parts if p.group in owned_groups]
    return [p for i, p in enumerate(parts) if i % consumers == consumer]


def owned_partitions(parts: list[Partition], rank: int, world_size: int, num_workers: int) -> list[Partition]:
    """Every partition that one of this rank's workers owns."""
    w = max(1, num_workers)
    owned = {p.key for k in range(w) for p in assign_partitions(parts, rank * w + k, world_size * w)}
    return [p for p in parts if p.key in owned]
