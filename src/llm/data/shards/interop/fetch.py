"""Megatron prefixes and OLMo token files in object storage (s3://, gs://, az://, local:): copied whole into
the cache folder, then read in place like local ones (same checks, same fingerprint).

Megatron's `.bin` and OLMo's arrays are single large files, not our shards, so they are not
streamed through the shard cache: each file is downloaded once into
`cache_dir/foreign-<hash of the URL>/` (a `.part` renamed when complete) and kept while its
size, and for Megatron the `.idx` bytes, are unchanged; `max_cache_size` does not apply.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any

from llm.data.shards.format.validate import ManifestError
from llm.data.shards.interop.flat import FlatTokenSource
from llm.data.storage.paths import Location, parse_location


def _cache_folder(url: str, cache_dir: str | Path | None) -> Path:
    from llm.data.storage.cache import default_cache_root

    root = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_root()
    folder = root / f"foreign-{hashlib.sha256(url.encode()).hexdigest()[:24]}"
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def _download(objects: Any, name: str, size: int, dest: Path, fresh: bool = False) -> None:
    """`name` into `dest` unless a complete copy of that size is there (`fresh`: always fetch)."""
    if not fresh and dest.is_file() and dest.stat().st_size == size:
        return
    from llm.data.storage.objects import download

    download(objects, name, dest, dest.with_name(f"{dest.name}.{os.getpid()}.part"))


def _parent(location: Location) -> tuple[Location, str]:
    head, _, name = location.path.rstrip("/").rpartition("/")
    return Location(location.kind, head, location.bucket), name


def open_remote_megatron(location: Location, storage_options: dict | None = None,
                         cache_dir: str | Path | None = None) -> FlatTokenSource | None:
    """A remote Megatron prefix or folder of them, copied and checked; None when `location` is neither."""
    from llm.data.shards.interop.megatron import open_megatron
    from llm.data.storage.objects import open_objects

    parent, name = _parent(location)
    listing = open_objects(parent, storage_options).list() if name else {}
    if f"{name}.idx" in listing:
        objects, stems = open_objects(parent, storage_options), [name]
    else:
        objects = open_objects(location, storage_options)
        listing = objects.list()
        if "index.json" in listing:
            return None
        stems = sorted(n[:-4] for n in listing if n.endswith(".idx"))
        if not stems:
            return None
    folder = _cache_folder(location.url(), cache_dir)
    for stem in stems:
        if f"{stem}.bin" not in listing:
            raise ManifestError(f"{objects.url(stem + '.bin')} is missing (its index {stem}.idx is there)")
        idx = folder / f"{stem}.idx"
        old = idx.read_bytes() if idx.is_file() else None
        _download(objects, f"{stem}.idx", listing[f"{stem}.idx"], idx, fresh=True)
        changed = old != idx.read_bytes()  # a rewritten index: its .bin is fetched again too
        _download(objects, f"{stem}.bin", listing[f"{stem}.bin"], folder / f"{stem}.bin", fresh=changed)
    return open_megatron(folder / stems[0] if len(stems) == 1 and name in stems else folder)


def open_remote_olmo(value: str, storage_options: dict | None = None, cache_dir: str | Path | None = None) -> FlatTokenSource:
    """An `olmo:` spec whose paths include URLs: remote files copied, local ones read where they are."""
    from llm.data.shards.interop.olmo import _files, open_olmo, parse_spec
    from llm.data.storage.objects import open_objects

    spec = parse_spec(value)
    folder = _cache_folder(str(spec), cache_dir)
    paths: list[Path] = []
    for k, path in enumerate(spec.paths):
        location = parse_location(path)
        if not location.is_remote:
            paths += _files(type(spec)(spec.dtype, spec.eos_id, (path,)))
            continue
        parent, name = _parent(location)
        listing = open_objects(parent, storage_options).list() if name else {}
        if name in listing:
            objects, names = open_objects(parent, storage_options), [name]
        else:
            objects = open_objects(location, storage_options)
            listing = objects.list()
            names = sorted(n for n in listing if n.endswith(".npy"))
            if not names:
                raise ManifestError(f"{path} is neither an OLMo token file nor a folder of *.npy files ({spec})")
        for n in names:
            dest = folder / str(k) / n  # one folder per spec entry: two buckets may hold the same names
            dest.parent.mkdir(exist_ok=True)
            _download(objects, n, listing[n], dest)
            paths.append(dest)
    return open_olmo(spec, local=paths)


def is_remote_olmo(value: object) -> bool:
    from llm.data.shards.interop.olmo import is_olmo_spec, parse_spec

    return is_olmo_spec(value) and any(parse_location(p).is_remote for p in parse_spec(str(value)).paths)
