"""The manifest (`index.json`): what a dataset holds, shard by shard; written last and atomically."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

import numpy as np
import xxhash

from llm.data.collector import collector_paused
from llm.data.shards.format import shard_table, verified
from llm.data.shards.format.shard_table import ShardInfo, ShardTable
from llm.data.shards.format.validate import ManifestError, check_derived, check_manifest
from llm.data.storage.local import atomic_write

__all__ = ["FORMAT_VERSION", "INDEX_NAME", "KINDS", "Manifest", "ManifestError", "ShardInfo", "merge_backends"]

# v2: item records follow `item_layout` (format/serializers.py) instead of one pickle each, and the
# fingerprint is over the content (checksums, counts, layout), not the run-specific file names.
FORMAT_VERSION = 2
READABLE_VERSIONS = (1, 2)
INDEX_NAME = "index.json"
KINDS = ("tokens", "items")
_DIGEST = "xxh3_128:"  # index.json's digest as remembered in the verified-shards store


def merge_backends(previous: str | None, new: str | None) -> str | None:
    """The `tokenizer_backend` of an appended dataset: each engine that wrote some of it, in order."""
    names = [n for part in (previous, new) if part for n in part.split(",")]
    return ",".join(dict.fromkeys(names)) or None


@dataclass
class Manifest:
    """A dataset's manifest. `shards` is the list of entries; a manifest loaded from a folder holds
    them as a `ShardTable` (columns) and makes that list only when something asks for `shards`:
    the read path uses `entries`, `column` and `num_shards`, which never build one object per shard."""

    kind: str
    shards: list[ShardInfo]  # a property below: the list, made from the table on first use
    dtype: str | None = None
    tokenizer: dict | None = None
    eos_id: int | None = None
    vocab_size: int | None = None
    sources: list[dict] = field(default_factory=list)
    format_version: int = FORMAT_VERSION
    # The engine(s) that encoded the text, e.g. "fastokens" (None in older manifests). Not part of
    # the fingerprint: every engine gives the same ids for a vocabulary.
    tokenizer_backend: str | None = None
    item_layout: Any = None  # v2 items: the structure every record follows (None: v1 pickles)
    # encrypted shards: the Encryption's class, algorithm, level and public state (encryption.py)
    encryption: dict | None = None

    @property
    def entries(self) -> Sequence[ShardInfo]:
        """Shard i's entry as `entries[i]`, without building the others (the list, or the table)."""
        shards = self.__dict__.get("_shards")
        return shards if shards is not None else self.__dict__["_table"]

    @property
    def num_shards(self) -> int:
        return len(self.entries)

    def column(self, name: str) -> np.ndarray:
        """One count of every shard (`bytes`, `raw_bytes`, `tokens`, `documents`, `items`) as int64."""
        entries = self.entries
        if isinstance(entries, ShardTable):
            return entries.column(name)
        return np.array([getattr(s, name) for s in entries], dtype=np.int64).reshape(-1)

    def distinct(self, key: str) -> list:
        """The distinct per-shard values of `dtype` or `compression`."""
        entries = self.entries
        if isinstance(entries, ShardTable):
            return entries.distinct(key)
        return list(dict.fromkeys(getattr(s, key) for s in entries))

    @property
    def total_tokens(self) -> int:
        return int(self.column("tokens").sum())

    @property
    def total_items(self) -> int:
        return int(self.column("items").sum())

    @property
    def total_documents(self) -> int:
        return int(self.column("documents").sum())

    def fingerprint(self) -> str:
        """Identifies the content: changes when any shard, the kind, the tokenizer or the item layout changes.

        From v2 on, shard file names (which hold a run id) are left out: the same content written
        by two runs, or by two engines, has one fingerprint.
        """
        if self.__dict__.get("_shards") is None and self.__dict__.get("_fingerprint"):
            return self.__dict__["_fingerprint"]  # computed when the manifest was checked (shard_table.py)
        h = hashlib.sha256()
        if self.format_version == 1:
            h.update(json.dumps([self.kind, self.tokenizer], sort_keys=True).encode())
            for s in self.shards:
                h.update(f"{s.file}:{s.checksum}:{s.tokens}:{s.items}".encode())
            return h.hexdigest()[:32]
        h.update(json.dumps([self.format_version, self.kind, self.tokenizer, self.item_layout], sort_keys=True).encode())
        for s in self.shards:
            h.update(f"{s.checksum}:{s.tokens}:{s.documents}:{s.items};".encode())
        return h.hexdigest()[:32]

    def to_json(self) -> dict:
        data = asdict(self)
        if data["item_layout"] is None:  # token datasets and v1 items have none
            del data["item_layout"]
        if data["encryption"] is None:  # unencrypted manifests stay as they were
            del data["encryption"]
        data["fingerprint"] = self.fingerprint()
        data["totals"] = self.totals()
        return data

    def totals(self) -> dict[str, int]:
        return {
            "shards": self.num_shards,
            "documents": self.total_documents,
            "tokens": self.total_tokens,
            "items": self.total_items,
            "bytes": int(self.column("bytes").sum()),
        }

    def save(self, folder: Path) -> None:
        """Write index.json atomically: a reader sees the old manifest or the new one, never half."""
        atomic_write(folder / INDEX_NAME, json.dumps(self.to_json(), indent=1).encode())

    @classmethod
    def load(cls, folder: Path | str) -> Manifest:
        """The manifest of a dataset folder, every field cross-checked (validate.py).

        Checks are a pure function of the index.json bytes: once these very bytes passed them on
        this machine, their shard table was remembered (shard_table.py) and is read instead of the
        JSON, so a restart, a resume or another rank opens in the same time at 50 or 10^5 shards.
        """
        folder = Path(folder)
        path = folder / INDEX_NAME
        if folder.is_file():
            hint = f"; pass its folder {folder.parent}" if folder.name == INDEX_NAME else ""
            raise ManifestError(f"{folder} is a file, not a dataset folder (a folder holding {INDEX_NAME}){hint}")
        if not folder.is_dir():
            raise ManifestError(f"{folder}: dataset folder does not exist")
        if not path.is_file():
            raise ManifestError(f"{folder}: no {INDEX_NAME}; is this a dataset made by `llm-data optimize`?")
        # The digest of index.json's bytes names its remembered table. It is itself remembered by the
        # file's identity (device, inode, size, mtime_ns, ctime_ns) in the folder's verified-shards
        # store, like a shard's checksum and on the same terms (verified.py): only for a file that
        # had not changed for 50 ms when it was read, and any later write, in place or by the
        # writer's atomic replace, changes the ctime (which no user call sets back), so a
        # rewritten index.json, even of the same size and mtime on a reused inode, is read and
        # hashed again. So a restart names a 24 MB index.json with one stat, not a read and a hash.
        before = verified.identity(path)
        stamp = verified.recorded(path, before[0])
        if stamp is not None and stamp.startswith(_DIGEST):
            manifest = cls._remembered(stamp[len(_DIGEST) :])
            if manifest is not None:
                return manifest
        raw = path.read_bytes()
        # xxh3-128 detects any change (a collision made on purpose would only serve a manifest
        # that passed every check here) and is far cheaper than sha256.
        digest = xxhash.xxh3_128_hexdigest(raw)
        manifest = cls._remembered(digest)
        if manifest is not None:
            verified.remember(path, _DIGEST + digest, before)
            return manifest
        with collector_paused():  # ~10 objects a shard, garbage a moment later (llm/data/collector.py)
            try:
                data = json.loads(raw)
            except (json.JSONDecodeError, UnicodeDecodeError) as e:
                raise ManifestError(f"{path}: malformed manifest ({e})") from None
            manifest = cls.from_json(data, path, as_table=True)
            del data
            if manifest.__dict__.get("_table") is None:  # entries checked one by one: made into a table here
                manifest = cls.from_table(ShardTable.from_infos(manifest.shards), manifest.header_fields(),
                                          manifest.fingerprint())
            # Columns from here on: the per-shard objects of the JSON die now, not at the process's
            # next full garbage collection (and none is traversed by later ones).
        shard_table.remember(digest, manifest.entries, {"fields": manifest.header_fields(), "fingerprint": manifest.fingerprint()})
        verified.remember(path, _DIGEST + digest, before)
        return manifest

    @classmethod
    def _remembered(cls, digest: str) -> Manifest | None:
        """The manifest whose checked index.json bytes have `digest`, from its remembered table, if any."""
        remembered = shard_table.recall(digest)
        if remembered is None:
            return None
        table, meta = remembered
        header, fingerprint = meta.get("fields"), meta.get("fingerprint")
        if isinstance(header, dict) and set(header) == _HEADER_FIELDS and isinstance(fingerprint, str):
            return cls.from_table(table, header, fingerprint)
        return None  # written by another version: checked again

    def header_fields(self) -> dict:
        """Every field but the shard list, as JSON values."""
        return {name: getattr(self, name) for name in sorted(_HEADER_FIELDS)}

    @classmethod
    def from_table(cls, table: ShardTable, header: dict, fingerprint: str) -> Manifest:
        """A manifest of checked `header_fields` whose shards are `table` (made into a list on first use)."""
        manifest = cls(shards=None, **header)  # type: ignore[arg-type]
        manifest.__dict__["_table"], manifest.__dict__["_fingerprint"] = table, fingerprint
        return manifest

    @classmethod
    def from_json(cls, data: object, path: Path, as_table: bool = False) -> Manifest:
        """The manifest in `data` (read from `path`), every field cross-checked.

        `as_table`: its shards as a `ShardTable` made straight from the checked columns (no
        `ShardInfo` per shard), unless the entries had to be checked one by one."""
        if not isinstance(data, dict):
            raise ManifestError(f"{path}: malformed manifest (expected a JSON object)")
        version = data.get("format_version")
        if type(version) is not int or version not in READABLE_VERSIONS:
            raise ManifestError(f"{path}: format_version {version!r} is not supported (expected one of {READABLE_VERSIONS})")
        if data.get("kind") not in KINDS:
            raise ManifestError(f"{path}: key 'kind' is {data.get('kind')!r}, expected one of {', '.join(KINDS)}")
        shards = data.get("shards")
        if not isinstance(shards, list):
            raise ManifestError(f"{path}: key 'shards' is missing or not a list")
        # Trust nothing on disk: a wrong count would repeat data, read document ends as tokens or hang.
        columns = check_manifest(data, path)
        backend = data.get("tokenizer_backend")
        if backend is not None and not isinstance(backend, str):
            raise ManifestError(f"{path}: key 'tokenizer_backend' is {backend!r}, expected a string or null")
        known = {f for f in cls.__dataclass_fields__}
        fields = {k: v for k, v in data.items() if k in known and k != "shards"}
        if as_table and columns is not None:
            header = cls(shards=[], **fields).header_fields()
            fingerprint = _fingerprint_of_columns(header, columns)
            manifest = cls.from_table(ShardTable.from_columns(columns), header, fingerprint)
            check_derived(data, fingerprint, manifest.totals(), path)
            return manifest
        infos = [ShardInfo(**s) for s in shards]
        manifest = cls(shards=infos, **fields)
        check_derived(data, manifest.fingerprint(), manifest.totals(), path)
        return manifest


_HEADER_FIELDS = {f.name for f in fields(Manifest)} - {"shards"}


def _fingerprint_of_columns(header: dict, columns: dict[str, list]) -> str:
    """`Manifest.fingerprint` of checked entries given key by key: one string hashed, not one update per shard."""
    h = hashlib.sha256()
    if header["format_version"] == 1:
        h.update(json.dumps([header["kind"], header["tokenizer"]], sort_keys=True).encode())
        rows = zip(columns["file"], columns["checksum"], columns["tokens"], columns["items"])
        h.update("".join([f"{f}:{c}:{t}:{i}" for f, c, t, i in rows]).encode())
        return h.hexdigest()[:32]
    h.update(json.dumps([header["format_version"], header["kind"], header["tokenizer"], header["item_layout"]],
                        sort_keys=True).encode())
    rows = zip(columns["checksum"], columns["tokens"], columns["documents"], columns["items"])
    h.update("".join([f"{c}:{t}:{d}:{i};" for c, t, d, i in rows]).encode())
    return h.hexdigest()[:32]


def _get_shards(self: Manifest) -> list[ShardInfo]:
    shards = self.__dict__.get("_shards")
    if shards is None:  # loaded from a table: the whole list only for code that asks for it
        shards = self.__dict__["_shards"] = list(self.__dict__["_table"])
    return shards


def _set_shards(self: Manifest, value: list[ShardInfo] | None) -> None:
    self.__dict__["_shards"] = value
    self.__dict__.setdefault("_table", None)
    self.__dict__.setdefault("_fingerprint", None)


# Set after @dataclass: a property in the class body would be taken for the field's default. The
# dataclass's __init__, asdict, == and repr all go through it, so they see the whole list.
Manifest.shards = property(_get_shards, _set_shards)  # type: ignore[assignment]
