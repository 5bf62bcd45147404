"""Cross-checks of a manifest: every field typed and in range, every shard's layout consistent."""

from __future__ import annotations

from operator import itemgetter
from pathlib import Path
from typing import Any

import numpy as np

from llm.data.shards.format.checksum import PREFIX
from llm.data.shards.format.serializers import check_layout

TOKEN_DTYPES = {"uint16": 2, "uint32": 4}
COMPRESSIONS = (None, "zstd")
# Far beyond any real shard (256 Ti tokens), far below int64 overflow in the offset arithmetic.
MAX_COUNT = 1 << 48
SHARD_KEYS = ("file", "bytes", "checksum", "documents", "tokens", "items", "dtype", "compression", "raw_bytes")


class ManifestError(ValueError):
    """A dataset folder has no usable index.json; the message names the folder and the problem."""


def _count(value: Any, where: str, key: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_COUNT:
        raise ManifestError(f"{where}: key '{key}' is {value!r}, expected an integer in [0, {MAX_COUNT}]")
    return value


def token_layout_bytes(tokens: int, documents: int, dtype: str) -> int:
    """Uncompressed size of a token shard: the tokens, then one uint64 end offset per document."""
    return tokens * TOKEN_DTYPES[dtype] + 8 * documents


def check_shard_entry(entry: Any, i: int, kind: str, dtype: Any, path: Path, encrypted: bool = False) -> None:
    """One shard entry alone: types, ranges, and the size its counts imply (no file access)."""
    if not isinstance(entry, dict):
        raise ManifestError(f"{path}: shard entry {i} is {type(entry).__name__}, expected a JSON object")
    name = entry.get("file")
    if not isinstance(name, str) or not name or name in (".", "..") or "/" in name or "\\" in name:
        raise ManifestError(f"{path}: shard entry {i} has key 'file' {name!r}, expected a file name inside the dataset folder")
    where = f"{path}: shard {name}"
    unknown = sorted(set(entry) - set(SHARD_KEYS))
    if unknown:
        raise ManifestError(f"{where}: unknown key {unknown[0]!r}")
    for key in ("bytes", "checksum"):
        if key not in entry:
            raise ManifestError(f"{where}: key '{key}' is missing")
    checksum = entry["checksum"]
    if not isinstance(checksum, str) or not checksum.startswith(PREFIX) or len(checksum) != len(PREFIX) + 16:
        raise ManifestError(f"{where}: key 'checksum' is {checksum!r}, expected '{PREFIX}' and 16 hex digits")
    size = _count(entry["bytes"], where, "bytes")
    tokens = _count(entry.get("tokens", 0), where, "tokens")
    documents = _count(entry.get("documents", 0), where, "documents")
    items = _count(entry.get("items", 0), where, "items")
    raw = _count(entry.get("raw_bytes", 0), where, "raw_bytes")
    compression = entry.get("compression")
    if compression not in COMPRESSIONS:
        raise ManifestError(f"{where}: key 'compression' is {compression!r}, expected null or 'zstd'")
    if compression is None and raw not in (0, size) and not encrypted:
        raise ManifestError(f"{where}: key 'raw_bytes' is {raw}, but an uncompressed shard has raw_bytes = bytes = {size}")
    raw = raw if compression or encrypted else size
    if kind == "tokens":
        shard_dtype = dtype if entry.get("dtype") is None else entry["dtype"]  # an empty list is no dtype either
        if not (isinstance(shard_dtype, str) and shard_dtype in TOKEN_DTYPES):
            raise ManifestError(f"{where}: key 'dtype' is {shard_dtype!r}, expected one of {', '.join(TOKEN_DTYPES)}")
        if items:
            raise ManifestError(f"{where}: key 'items' is {items}, but a token shard holds no items")
        if tokens and not documents:
            raise ManifestError(f"{where}: key 'documents' is 0, but the shard holds {tokens} tokens")
        expected = token_layout_bytes(tokens, documents, shard_dtype)
        if raw != expected:
            raise ManifestError(
                f"{where}: {tokens} tokens of {shard_dtype} and {documents} documents make {expected} bytes, "
                f"but key '{'raw_bytes' if compression else 'bytes'}' is {raw}: the manifest does not match the shard"
            )
    else:
        if entry.get("dtype") is not None or tokens or documents:
            bad = "dtype" if entry.get("dtype") is not None else ("tokens" if tokens else "documents")
            raise ManifestError(f"{where}: key '{bad}' is {entry.get(bad)!r}, but an item shard holds no tokens")
        if raw < 8 * (items + 1):
            raise ManifestError(f"{where}: key 'items' is {items}, but {raw} bytes cannot hold the offsets of that many items")


def check_manifest(data: dict, path: Path) -> dict[str, list] | None:
    """Top-level fields and every shard entry; the fingerprint and totals checks need the entries built.

    Returns the entries as columns (`shard_columns`) when they passed the column-wise checks,
    None when they were checked one by one (and passed)."""
    kind = data["kind"]
    dtype = data.get("dtype")
    if kind == "tokens" and not (isinstance(dtype, str) and dtype in TOKEN_DTYPES):  # a list is unhashable
        raise ManifestError(f"{path}: key 'dtype' is {dtype!r}, expected one of {', '.join(TOKEN_DTYPES)}")
    if kind == "items" and dtype is not None:
        raise ManifestError(f"{path}: key 'dtype' is {dtype!r}, but an item dataset has no token dtype (null)")
    tokenizer = data.get("tokenizer")
    if tokenizer is not None and not isinstance(tokenizer, dict):
        raise ManifestError(f"{path}: key 'tokenizer' is {tokenizer!r}, expected an object or null")
    for key in ("eos_id", "vocab_size"):
        value = data.get(key)
        if value is not None:
            _count(value, str(path), key)
        if tokenizer and key in tokenizer and tokenizer[key] != value:
            raise ManifestError(f"{path}: key '{key}' is {value!r}, but the tokenizer recorded says {tokenizer[key]!r}")
    _check_item_layout(data, path)
    encryption = data.get("encryption")
    if encryption is not None and not (isinstance(encryption, dict) and isinstance(encryption.get("class"), str)):
        raise ManifestError(f"{path}: key 'encryption' is {encryption!r}, expected an object naming its 'class' or null")
    if not isinstance(data.get("sources", []), list):
        raise ManifestError(f"{path}: key 'sources' is {data.get('sources')!r}, expected a list")
    columns = shard_columns(data["shards"], kind, dtype, encryption is not None)
    if columns is not None:
        return columns
    seen: set[str] = set()  # something failed (or is unusual): entry by entry, to name the first bad one
    for i, entry in enumerate(data["shards"]):
        check_shard_entry(entry, i, kind, dtype, path, encrypted=encryption is not None)
        if entry["file"] in seen:
            raise ManifestError(f"{path}: shard {entry['file']} is listed twice")
        seen.add(entry["file"])


def shard_columns(shards: list, kind: str, dtype: Any, encrypted: bool) -> dict[str, list] | None:
    """Every shard entry checked column by column: the checks of `check_shard_entry` and the
    duplicate-name check, as set and C-level passes over each key instead of ~40 Python steps
    per entry (at 10^5 shards: ~1 s less on a first open). Returns key -> list of values (the
    values as stored, absent keys as their defaults), or None when anything is off or unusual:
    the caller then checks entry by entry, which names the first bad entry."""
    try:
        if set(map(type, shards)) - {dict}:
            return None
        n = len(shards)
        if not n:
            return {key: [] for key in SHARD_KEYS}
        columns = _every_key(shards)
        if columns is None:
            if not set().union(*shards) <= set(SHARD_KEYS):
                return None
            columns = {key: [e.get(key) for e in shards] for key in ("file", "bytes", "checksum", "dtype", "compression")}
            for key in ("documents", "tokens", "items", "raw_bytes"):
                columns[key] = [e.get(key, 0) for e in shards]
        files, checksums = columns["file"], columns["checksum"]
        if set(map(type, files)) != {str} or len(set(files)) != n or {"", ".", ".."} & set(files):
            return None
        joined = "".join(files)
        if "/" in joined or "\\" in joined:
            return None
        if set(map(type, checksums)) != {str} or set(map(len, checksums)) != {len(PREFIX) + 16}:
            return None
        if sum(map(str.startswith, checksums, [PREFIX] * n)) != n:
            return None
        counts = {}
        for key in ("bytes", "documents", "tokens", "items", "raw_bytes"):
            if set(map(type, columns[key])) != {int}:  # bool, float, None (a missing 'bytes') are refused
                return None
            values = np.array(columns[key], dtype=np.int64)
            if int(values.min()) < 0 or int(values.max()) > MAX_COUNT:
                return None
            counts[key] = values
        compressions = set(columns["compression"])
        if not compressions <= set(COMPRESSIONS):
            return None
        compressed = np.array([c is not None for c in columns["compression"]]) if compressions != {None} else np.zeros(n, bool)
        size, raw = counts["bytes"], counts["raw_bytes"]
        if not encrypted and np.any(~compressed & (raw != 0) & (raw != size)):
            return None
        raw = raw if encrypted else np.where(compressed, raw, size)
        tokens, documents, items = counts["tokens"], counts["documents"], counts["items"]
        if kind == "tokens":
            shard_dtypes = [dtype if d is None else d for d in columns["dtype"]]
            if set(map(type, shard_dtypes)) != {str} or not set(shard_dtypes) <= set(TOKEN_DTYPES):
                return None
            width = np.array([TOKEN_DTYPES[d] for d in shard_dtypes], dtype=np.int64)
            if np.any(items) or np.any((tokens > 0) & (documents == 0)):
                return None
            if np.any(raw != tokens * width + 8 * documents):
                return None
        else:
            if set(columns["dtype"]) != {None} or np.any(tokens) or np.any(documents) or np.any(raw < 8 * (items + 1)):
                return None
        return columns
    except (TypeError, ValueError, OverflowError):  # unhashable values, numbers beyond int64: entry by entry
        return None


def _every_key(shards: list[dict]) -> dict[str, list] | None:
    """The columns of entries that hold exactly SHARD_KEYS (as `optimize` writes them), in C passes
    (one itemgetter per entry, then a transpose); None if any entry lacks a key or has another."""
    if set(map(len, shards)) != {len(SHARD_KEYS)}:
        return None
    try:
        rows = list(map(itemgetter(*SHARD_KEYS), shards))
    except KeyError:
        return None
    return {key: list(column) for key, column in zip(SHARD_KEYS, zip(*rows))}


def _check_item_layout(data: dict, path: Path) -> None:
    """v2 item datasets say how their records are laid out; nothing else has a layout."""
    layout, kind, version = data.get("item_layout"), data["kind"], data["format_version"]
    if layout is None:
        # (only an item dataset is searched for items: a walk over 10^5 entries is not free)
        if kind == "items" and version >= 2 and any(isinstance(s, dict) and s.get("items") for s in data["shards"]):
            raise ManifestError(f"{path}: key 'item_layout' is missing, but a format v{version} item dataset needs it")
        return
    if kind != "items" or version < 2:
        raise ManifestError(f"{path}: key 'item_layout' is set, but a {kind} dataset of format v{version} has none")
    try:
        check_layout(layout)
    except ValueError as e:
        raise ManifestError(f"{path}: key 'item_layout' {e}") from None


def check_derived(data: dict, fingerprint: str, totals: dict, path: Path) -> None:
    """The stored fingerprint and totals must be what the entries give: catches dropped or edited entries."""
    stored = data.get("fingerprint")
    if stored is not None and stored != fingerprint:
        raise ManifestError(
            f"{path}: key 'fingerprint' is {stored!r}, but the shards listed give {fingerprint!r}: "
            "an entry was added, dropped or edited"
        )
    stored_totals = data.get("totals")
    if stored_totals is None:
        return
    if not isinstance(stored_totals, dict):
        raise ManifestError(f"{path}: key 'totals' is {stored_totals!r}, expected an object")
    for key, value in totals.items():
        if stored_totals.get(key) != value:
            raise ManifestError(
                f"{path}: key 'totals.{key}' is {stored_totals.get(key)!r}, but the shards listed add up to {value}"
            )
