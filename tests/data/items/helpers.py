"""Shared helpers of the item tests: a v1 dataset written the old way, equality of nested items."""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import numpy as np

from llm.data.shards.format.checksum import checksum_bytes
from llm.data.shards.format.manifest import Manifest, ShardInfo


def write_v1_items(folder: Path, items: list) -> Path:
    """A format v1 item dataset, byte for byte as the old writer made it (one pickle per item)."""
    folder.mkdir(parents=True, exist_ok=True)
    blobs = [pickle.dumps(x, protocol=pickle.HIGHEST_PROTOCOL) for x in items]
    offsets = np.zeros(len(blobs) + 1, dtype="<u8")
    np.cumsum([len(b) for b in blobs], out=offsets[1:])
    data = b"".join(blobs) + offsets.tobytes()
    name = "shard-19990101000000-abcdef-00000-00000.bin"
    (folder / name).write_bytes(data)
    info = ShardInfo(file=name, bytes=len(data), checksum=checksum_bytes(data), items=len(items))
    Manifest(kind="items", shards=[info], format_version=1).save(folder)
    return folder


def same(a: Any, b: Any) -> bool:
    """Equal values of equal types, recursively (arrays by dtype, shape and bytes; NaN equals NaN)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return list(a) == list(b) and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, np.ndarray):
        return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()
    if isinstance(a, np.generic):
        return a.dtype == b.dtype and a.tobytes() == b.tobytes()
    if isinstance(a, float):
        return a == b or (a != a and b != b)
    if type(a).__module__ == "torch" and type(a).__name__ == "Tensor":
        return a.dtype == b.dtype and a.shape == b.shape and a.view(-1).view(__import__("torch").uint8).equal(
            b.view(-1).view(__import__("torch").uint8)) if a.numel() else a.dtype == b.dtype and a.shape == b.shape
    return a == b
