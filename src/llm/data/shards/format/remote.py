"""Remote datasets (s3://, local:): the manifest from the store, shards through the shard cache."""

from __future__ import annotations

import json
import mmap
import os
import threading
from collections import OrderedDict
from pathlib import Path
from typing import Any

import numpy as np
import xxhash

from llm.data.shards.format.encryption import unlock
from llm.data.shards.format.manifest import INDEX_NAME, Manifest, ManifestError
from llm.data.shards.format.reader import _ShardBytes
from llm.data.storage.cache import CorruptObject, ShardCache, default_cache_root
from llm.data.storage.objects import open_objects
from llm.data.storage.paths import Location, parse_location
from llm.data.storage.s3 import BucketNotFound, ObjectNotFound
from llm.data.storage.sizes import parse_cache_size


def load_manifest(location: Location, storage_options: dict | None = None) -> tuple[Manifest, Any]:
    """(manifest, objects) of a remote dataset; a missing index.json is a ManifestError naming it."""
    objects = open_objects(location, storage_options)
    url = objects.url(INDEX_NAME)
    try:
        raw = objects.get(INDEX_NAME)
    except BucketNotFound:
        raise
    except ObjectNotFound:
        raise ManifestError(f"{location}: no {INDEX_NAME} ({url} does not exist); is this a dataset made by `llm-data optimize`?") from None
    try:
        data = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ManifestError(f"{url}: malformed manifest ({e})") from None
    return Manifest.from_json(data, url), objects  # type: ignore[arg-type]


def open_cache(location: Location, manifest: Manifest, objects: Any, cache_dir: str | Path | None,
               max_cache_size: int | str | None) -> ShardCache:
    """The cache folder `cache_dir/<fingerprint>` (default: the user cache dir).

    The folder records the dataset's URL (`.source.json`, for `llm-data cache ls`) and is held
    in use (a shared lock on that file) while the cache lives, so `llm-data cache clear` leaves it.
    """
    from llm.data.storage.cache_admin import register

    root = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_root()
    folder = root / manifest.fingerprint()
    registration = register(folder, location.url())
    cache = ShardCache(objects, manifest.shards, folder, parse_cache_size(max_cache_size))
    cache.registration = registration  # type: ignore[attr-defined]  # not pickled: the opening process holds it
    return cache


class _Pins(threading.local):
    """One reading thread's pinned shards (index -> (pin, mapped bytes)): empty on the thread's first use."""

    def __init__(self) -> None:
        self.held: OrderedDict[int, tuple[Any, np.ndarray]] = OrderedDict()


class RemoteShardBytes(_ShardBytes):
    """Shard bytes from the cache: each reading thread pins the one shard it reads, and only while
    it reads (released before the next shard and at the end of each chunk), so shards it has moved
    past can be evicted while the run goes on."""

    keep_views = False
    opened: Any = None  # called with (shard, its verified uncompressed bytes) on each open (read/edges.py)

    def __init__(self, cache: ShardCache, manifest: Manifest, verify: bool = True, encryption: Any = None):
        self.cache = cache
        self.encryption, self.encrypted = encryption, manifest.encryption is not None
        self.folder, self.shards, self.verify = cache.folder, manifest.shards, verify
        self.kind, self.dtype = manifest.kind, manifest.dtype
        self._maps: dict = {}
        self._decompressed: OrderedDict[int, np.ndarray] = OrderedDict()
        self._lock = threading.Lock()
        self._local = _Pins()

    def _held(self) -> OrderedDict:
        return self._local.held

    pinned_descriptors = None  # cached shards are read through their pinned maps, not by path (eviction may replace the file)

    def raw(self, i: int) -> np.ndarray:
        held = self._held()
        if i in held:
            held.move_to_end(i)
            return held[i][1]
        info = self.shards[i]
        # A reader copies out of one shard at a time: unpin the previous one *before* asking for the
        # next, so a reader waiting for room in a full cache never holds a pin itself (no deadlock).
        self.release()
        if not self.plain(info):
            return self._compressed(i)
        pin = self.cache.open(i)  # downloaded and verified; cannot be evicted while pinned
        data = _map(pin.path) if info.bytes else np.zeros(0, np.uint8)
        self._check_layout(info, data)
        held[i] = (pin, data)
        if self.opened is not None:
            self.opened(i, data)
        return data

    def _compressed(self, i: int) -> np.ndarray:
        """A compressed or encrypted shard, decoded whole from its cached file."""
        with self._lock:
            if i in self._decompressed:
                self._decompressed.move_to_end(i)
                return self._decompressed[i]
        info = self.shards[i]
        pin = self.cache.open(i)
        try:
            stored = pin.path.read_bytes()
        finally:
            pin.close()
        stored = unlock(self.encrypted, self.encryption, stored, self.cache.objects.url(info.file))
        data = np.frombuffer(stored, np.uint8) if info.compression is None else self._decompress(info, stored)
        self._check_layout(info, data)
        if self.opened is not None:
            self.opened(i, data)
        with self._lock:
            self._decompressed[i] = data
            while len(self._decompressed) > self._cache_shards:
                self._decompressed.popitem(last=False)
        return data

    def release(self) -> None:
        """Unpin every shard this thread holds (end of an iteration)."""
        held = self._held()
        while held:
            held.popitem(last=False)[1][0].close()

    def release_pages(self, shards: set[int]) -> None:
        """Nothing to do: a reader unmaps a cached shard when it moves past it (release)."""

    def verify_all(self) -> None:
        for i, info in enumerate(self.shards):
            pin = self.cache.open(i)  # downloaded and its checksum (over the stored bytes) checked
            if self.encrypted and self.encryption is None:  # no key: the checksums are all there is to check
                pin.close()
                continue
            try:
                data = self.raw(i) if self.plain(info) else self._compressed(i)
                self._check_layout(info, data, deep=True)
            finally:
                pin.close()
        self.release()

    def _per_process(self) -> dict:
        return {"_lock": threading.Lock(), "_local": _Pins()}


def _map(path: Path) -> np.ndarray:
    # Its own file description: the pin's shared lock ends when the pin closes, not with the map.
    # A map that outlives its pin stays readable even if the file is then evicted (Linux keeps the inode).
    fd = os.open(path, os.O_RDONLY)
    try:
        return np.frombuffer(mmap.mmap(fd, 0, access=mmap.ACCESS_READ), np.uint8)
    finally:
        os.close(fd)


def verify_remote(location: Location, storage_options: dict | None = None) -> Manifest:
    """Stream every shard of a remote dataset and check its size and checksum (nothing is cached)."""
    manifest, objects = load_manifest(location, storage_options)
    present = objects.list()
    for info in manifest.shards:
        if info.file not in present:
            raise ObjectNotFound(f"shard {objects.url(info.file)} is missing (listed in {objects.url(INDEX_NAME)})")
        if present[info.file] != info.bytes:
            raise CorruptObject(f"shard {objects.url(info.file)} has {present[info.file]} bytes, the manifest says {info.bytes}")
    for info in manifest.shards:
        h = xxhash.xxh3_64()

        def sink(_attempt: int, h: Any = h) -> Any:
            h.reset()
            return h.update

        objects.get_into(info.file, sink)
        actual = "xxh3_64:" + h.hexdigest()
        if actual != info.checksum:
            raise CorruptObject(f"shard {objects.url(info.file)} fails its checksum ({actual} != {info.checksum}): the object is corrupt")
    return manifest


def load_any(dataset: str | Path, storage_options: dict | None = None) -> Manifest:
    """The manifest of a dataset anywhere: a folder, local:/... or s3://..."""
    location = parse_location(dataset)
    if location.is_remote:
        return load_manifest(location, storage_options)[0]
    return Manifest.load(location.local_path())


def verify_any(dataset: str | Path, storage_options: dict | None = None) -> Manifest:
    """`llm-data verify`: every shard's size and checksum, wherever the dataset lives."""
    from llm.data.shards.format.reader import verify_dataset

    location = parse_location(dataset)
    if location.is_remote:
        return verify_remote(location, storage_options)
    return verify_dataset(location.local_path())
