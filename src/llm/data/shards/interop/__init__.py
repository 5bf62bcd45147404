"""Peers' datasets (LitData, MosaicML MDS folders, Megatron prefixes, OLMo token files) opened read-only, no re-preparing."""

from __future__ import annotations

import json
from pathlib import Path

from llm.data.shards.interop.base import ForeignManifest, ForeignSource

__all__ = ["ForeignManifest", "ForeignSource", "detect_format", "open_foreign", "open_in_place", "open_peer",
           "open_remote_peer"]


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
    """'litdata', 'mds', 'megatron', or None (our own format, or no dataset at all)."""
    from llm.data.shards.interop.megatron import is_megatron

    if is_megatron(folder):  # PREFIX.idx, or a folder of .idx files without an index.json
        return "megatron"
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
    if kind == "megatron":
        from llm.data.shards.interop.megatron import open_megatron

        return open_megatron(folder)
    data = _read_index(folder)
    if kind == "litdata":
        from llm.data.shards.interop.litdata import open_litdata

        return open_litdata(folder, data)
    from llm.data.shards.interop.mds import open_mds

    return open_mds(folder, data)


def open_in_place(dataset: object, storage_options: dict | None = None, cache_dir: str | Path | None = None) -> ForeignSource | None:
    """An `olmo:` spec (interop/olmo.py) opened, its remote files copied first; None for anything else."""
    from llm.data.shards.interop.olmo import is_olmo_spec, open_olmo

    if not is_olmo_spec(dataset):
        return None
    from llm.data.shards.interop.fetch import is_remote_olmo, open_remote_olmo

    if is_remote_olmo(dataset):
        return open_remote_olmo(str(dataset), storage_options, cache_dir)
    return open_olmo(str(dataset))


def open_remote_peer(location: object, storage_options: dict | None = None,
                     cache_dir: str | Path | None = None) -> ForeignSource | None:
    """A remote location without our index.json that is a Megatron prefix or folder (copied, then opened), or None."""
    from llm.data.shards.interop.fetch import open_remote_megatron

    return open_remote_megatron(location, storage_options, cache_dir)  # type: ignore[arg-type]


def open_peer(dataset: str | Path) -> ForeignSource | None:
    """The peer dataset a CLI argument names, or None: ours, remote (s3://, local:) or not a dataset."""
    from llm.data.storage.paths import parse_location

    source = open_in_place(str(dataset))
    if source is not None:
        return source
    location = parse_location(str(dataset))
    return None if location.is_remote else open_foreign(location.local_path())
