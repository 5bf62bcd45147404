"""The manifest (`index.json`): what a dataset holds, shard by shard; written last and atomically."""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from llm.data.shards.format import verified
from llm.data.shards.format.validate import ManifestError, check_derived, check_manifest
from llm.data.storage.local import atomic_write

__all__ = ["FORMAT_VERSION", "INDEX_NAME", "KINDS", "Manifest", "ManifestError", "ShardInfo", "merge_backends"]

# v2: item records follow `item_layout` (format/serializers.py) instead of one pickle each, and the
# fingerprint is over the content (checksums, counts, layout), not the run-specific file names.
FORMAT_VERSION = 2
READABLE_VERSIONS = (1, 2)
INDEX_NAME = "index.json"
KINDS = ("tokens", "items")


def merge_backends(previous: str | None, new: str | None) -> str | None:
    """The `tokenizer_backend` of an appended dataset: each engine that wrote some of it, in order."""
    names = [n for part in (previous, new) if part for n in part.split(",")]
    return ",".join(dict.fromkeys(names)) or None


@dataclass(frozen=True)
class ShardInfo:
    """One shard file. `tokens` counts tokens (kind tokens) and `items` items (kind items)."""

    file: str
    bytes: int
    checksum: str  # "xxh3_64:<hex>" of the file as stored (compressed bytes when compressed)
    documents: int = 0
    tokens: int = 0
    items: int = 0
    dtype: str | None = None  # token dtype of this shard (a run may widen uint16 to uint32)
    compression: str | None = None
    raw_bytes: int = 0  # size before compression; equals `bytes` when uncompressed


@dataclass
class Manifest:
    kind: str
    shards: list[ShardInfo]
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
    def total_tokens(self) -> int:
        return sum(s.tokens for s in self.shards)

    @property
    def total_items(self) -> int:
        return sum(s.items for s in self.shards)

    @property
    def total_documents(self) -> int:
        return sum(s.documents for s in self.shards)

    def fingerprint(self) -> str:
        """Identifies the content: changes when any shard, the kind, the tokenizer or the item layout changes.

        From v2 on, shard file names (which hold a run id) are left out: the same content written
        by two runs, or by two engines, has one fingerprint.
        """
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
            "shards": len(self.shards),
            "documents": self.total_documents,
            "tokens": self.total_tokens,
            "items": self.total_items,
            "bytes": sum(s.bytes for s in self.shards),
        }

    def save(self, folder: Path) -> None:
        """Write index.json atomically: a reader sees the old manifest or the new one, never half."""
        atomic_write(folder / INDEX_NAME, json.dumps(self.to_json(), indent=1).encode())

    @classmethod
    def load(cls, folder: Path | str) -> Manifest:
        folder = Path(folder)
        path = folder / INDEX_NAME
        if folder.is_file():
            hint = f"; pass its folder {folder.parent}" if folder.name == INDEX_NAME else ""
            raise ManifestError(f"{folder} is a file, not a dataset folder (a folder holding {INDEX_NAME}){hint}")
        if not folder.is_dir():
            raise ManifestError(f"{folder}: dataset folder does not exist")
        if not path.is_file():
            raise ManifestError(f"{folder}: no {INDEX_NAME}; is this a dataset made by `llm-data optimize`?")
        raw = path.read_bytes()
        try:
            data = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise ManifestError(f"{path}: malformed manifest ({e})") from None
        digest = hashlib.sha256(raw).hexdigest()
        checked = verified.manifest_checked(digest)
        manifest = cls.from_json(data, path, checked=checked)
        if not checked:
            verified.remember_manifest(digest)
        return manifest

    @classmethod
    def from_json(cls, data: object, path: Path, checked: bool = False) -> Manifest:
        """The manifest in `data` (read from `path`), cross-checked unless `checked`: these very
        bytes passed the checks on this machine before (verified.manifest_checked)."""
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
        if not checked:
            check_manifest(data, path)
        backend = data.get("tokenizer_backend")
        if backend is not None and not isinstance(backend, str):
            raise ManifestError(f"{path}: key 'tokenizer_backend' is {backend!r}, expected a string or null")
        infos = [ShardInfo(**s) for s in shards]
        known = {f for f in cls.__dataclass_fields__}
        fields = {k: v for k, v in data.items() if k in known and k != "shards"}
        manifest = cls(shards=infos, **fields)
        if not checked:
            check_derived(data, manifest.fingerprint(), manifest.totals(), path)
        return manifest

