"""Peers' dataset folders (LitData, MosaicML MDS) opened read-only by StreamingDataset, no re-preparing."""

from __future__ import annotations

import json
from pathlib import Path

from llm.data.shards.interop.base import ForeignManifest, ForeignSource

__all__ = ["ForeignManifest", "ForeignSource", "detect_format", "open_foreign", "open_peer"]


_TAIL = 64 << 10  # bytes of index.json read to recognise our own manifest without reading 10^5 shard entries


def _read_index(folder: Path) -> dict | None:
    path = folder / "index.json"
    if not folder.is_dir() or not path.is_file():
        return None
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None  # our own loader names the problem
    return data if isinstance(data, dict) else None


def detect_format(folder: str | Path) -> str | None:
    """'litdata', 'mds', or None (our own format, or no dataset at all)."""
    path = Path(folder) / "index.json"
    try:
        with open(path, "rb") as f:  # ours ends with format_version and a few small keys: the tail says
            f.seek(max(0, f.seek(0, 2) - _TAIL))
            if b'"format_version"' in f.read() or b'"format_version"' in path.read_bytes():
                return None  # ours: Manifest.load reads it
    except OSError:
        return None  # our own loader names the problem
    from llm.data.shards.interop.litdata import (
        is_litdata_index,  # only for peers' folders (5-10 ms)
    )
    from llm.data.shards.interop.mds import is_mds_index

    data = _read_index(Path(folder))
    if data is None or "format_version" in data:
        return None
    if is_litdata_index(data):
        return "litdata"
    if is_mds_index(data):
        return "mds"
    return None


def open_foreign(folder: str | Path) -> ForeignSource | None:
    """The opened peer folder, or None when `folder` is ours (or not a dataset: Manifest.load says why)."""
    folder = Path(folder)
    kind = detect_format(folder)
    if kind is None:
        return None
    data = _read_index(folder)
    if kind == "litdata":
        from llm.data.shards.interop.litdata import open_litdata

        return open_litdata(folder, data)
    from llm.data.shards.interop.mds import open_mds

    return open_mds(folder, data)


def open_peer(dataset: str | Path) -> ForeignSource | None:
    """The peer folder a CLI argument names, or None: ours, remote (s3://, local:) or not a dataset."""
    from llm.data.storage.paths import parse_location

    location = parse_location(str(dataset))
    return None if location.is_remote else open_foreign(location.local_path())
