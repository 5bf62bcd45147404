"""Objects of an s3://, gs:// or az:// bucket read like local files: found by key, prefix or glob; read by ranged GETs.

Text sources use this to stream `s3://bucket/prefix/*.jsonl` with the cursors they use on
local files. Everything goes through `s3.py` (one client per process, obstore's retries,
one-sentence errors). Two rules keep the records exact:

* every GET names the ETag seen when the object was listed (`If-Match`): an object replaced
  since is an error (`ObjectChanged`), never a mix of two versions;
* a transient failure mid-body is retried (by obstore) from the byte where it broke: nothing
  reaches the reader until its window is whole, and a download checks the bytes it got.
"""

from __future__ import annotations

import fnmatch
import io
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import PurePosixPath
from typing import Any, BinaryIO

from llm.data.storage.paths import parse_location
from llm.data.storage.s3 import (
    ObjectNotFound,
    S3Config,
    StorageError,
    _client,
    call,
    http_status,
    resolve_config,
)

# Ranged reads: a byte range [pos, end) is fetched in one window up to _MAX_WINDOW, plus _TAIL
# bytes for the line that crosses `end`; past `end` (or with no end) windows double from _TAIL.
_TAIL = 4 << 10
_MAX_WINDOW = 8 << 20
_GLOB = "*?["


class ObjectChanged(StorageError):
    """An object was replaced or cut after it was listed."""


@dataclass(frozen=True)
class RemoteObject:
    """One object as listed: where it is, its size and its version (ETag, else last-modified)."""

    config: S3Config = field(repr=False)  # holds the keys: never in a repr
    key: str
    size: int
    etag: str | None = None
    modified: str = ""

    @property
    def url(self) -> str:
        return self.config.url(self.key)

    @property
    def name(self) -> str:
        return PurePosixPath(self.key).name

    @property
    def pure(self) -> PurePosixPath:
        """The key as a path (suffixes, name), never opened."""
        return PurePosixPath(self.key)

    def stamp(self) -> str:
        """What identifies this version of the object: its ETag, else its last-modified time."""
        return f"etag:{self.etag}" if self.etag else f"modified:{self.modified}"

    def __str__(self) -> str:
        return self.url


def _changed(obj: RemoteObject, detail: str) -> ObjectChanged:
    return ObjectChanged(
        f"{obj.url} at {obj.config.where} changed while it was read ({detail}); the records read would mix "
        "old and new content: re-run once nothing writes to it"
    )


def _meta(config: S3Config, meta: dict[str, Any]) -> RemoteObject:
    modified = meta.get("last_modified")
    etag = meta.get("e_tag")
    if etag and config.scheme == "az" and not etag.startswith(('"', "W/")):
        # Azure lists ETags bare but sends them quoted in headers: one form, so an object found by listing
        # and by HEAD has one stamp, and If-Match sends the quoted form the protocol defines.
        etag = f'"{etag}"'
    return RemoteObject(config, meta["path"], int(meta["size"]), etag, modified.isoformat() if modified is not None else "")


def _forbidden_as_denied(error: Exception) -> Exception:
    """obstore reports a 403 on a list as a generic error: make it the access-denied one explain() words."""
    from obstore import exceptions as ox

    if isinstance(error, ox.GenericError) and http_status(error) == 403:
        return ox.PermissionDeniedError(str(error))
    return error


def list_objects(config: S3Config, prefix: str) -> list[RemoteObject]:
    """Every object under `prefix/` (all levels; the whole bucket when empty), folder markers left out."""
    import obstore

    def run() -> list[RemoteObject]:
        try:
            return [_meta(config, m) for batch in obstore.list(_client(config), prefix or None) for m in batch
                    if not m["path"].endswith("/")]
        except Exception as e:  # obstore's own types; call sorts them
            raise _forbidden_as_denied(e) from None

    return call(config, prefix, "listing", run)


def head_object(config: S3Config, key: str) -> RemoteObject | None:
    """The object at exactly `key`, or None when there is none."""
    import obstore
    from obstore import exceptions as ox

    def run() -> RemoteObject | None:
        try:
            return _meta(config, obstore.head(_client(config), key))
        except Exception as e:  # a HEAD answer has no body: some stores' 404s come as generic errors
            if isinstance(e, (FileNotFoundError, ox.NotFoundError)) or http_status(e) == 404:
                return None
            raise _forbidden_as_denied(e) from None

    return call(config, key, "reading", run)


def glob_match(pattern: str, key: str) -> bool:
    """Whether `key` matches `pattern` like a local glob: `*` stays within one level, `**` spans levels.

    As on local disk, a name starting with '.' matches only a pattern part starting with '.'.
    """
    return _match(pattern.split("/"), key.split("/"))


def _match(pats: list[str], parts: list[str]) -> bool:
    if not pats:
        return not parts
    if pats[0] == "**":
        return any(_match(pats[1:], parts[i:]) for i in range(len(parts) + 1)
                   if all(not p.startswith(".") for p in parts[:i]))
    if not parts:
        return False
    hidden = parts[0].startswith(".") and not pats[0].startswith(".")
    return not hidden and fnmatch.fnmatchcase(parts[0], pats[0]) and _match(pats[1:], parts[1:])


def expand_objects(
    pattern: str, storage_options: dict | None = None, keep: Callable[[PurePosixPath], bool] | None = None
) -> list[RemoteObject]:
    """`s3://bucket/key`, `s3://bucket/prefix` (a folder) or `s3://bucket/prefix/*.jsonl`, sorted by key.

    An exact key is that object; otherwise every object under the prefix for which `keep(key)`
    holds (hidden names left out); a glob lists from its fixed part and matches each key.
    Finding nothing is an `ObjectNotFound` naming the pattern and the endpoint.
    """
    loc = parse_location(pattern)
    if not loc.is_object_store:
        raise ValueError(f"{pattern!r} is not an object-store (s3://, gs://, az://) location")
    config = resolve_config(loc.bucket, storage_options, loc.kind)
    key = loc.path
    if any(c in key for c in _GLOB):
        fixed = key[: min(key.index(c) for c in _GLOB if c in key)]
        found = [o for o in list_objects(config, fixed[: fixed.rfind("/") + 1].rstrip("/")) if glob_match(key, o.key)]
        if not found:
            raise ObjectNotFound(f"{pattern}: no objects match this pattern at {config.where}: check the path")
    else:
        one = head_object(config, key) if key else None
        if one is not None:
            return [one]
        under = list_objects(config, key)
        found = [o for o in under if not any(p.startswith(".") for p in o.key[len(key):].split("/"))
                 and (keep is None or keep(o.pure))]
        if not found:
            what = "holds no input objects (.txt, .jsonl, .json, .parquet, plain or .gz/.zst)" if under \
                else "is neither an object nor a prefix with objects under it"
            raise ObjectNotFound(f"{pattern} {what} at {config.where}: check the path")
    return sorted(found, key=lambda o: PurePosixPath(o.key))


def _get(obj: RemoteObject, options: dict[str, Any]) -> Any:
    """GET of the version listed (If-Match its ETag): a replaced object is ObjectChanged."""
    import obstore
    from obstore import exceptions as ox

    if obj.etag:
        options["if_match"] = obj.etag
    try:
        return obstore.get(_client(obj.config), obj.key, options=options)
    except ox.PreconditionError:
        raise _changed(obj, f"its ETag is no longer {obj.etag}") from None


def read_range(obj: RemoteObject, start: int, end: int) -> bytes:
    """Bytes [start, end) of the object as listed, whole or not at all (retried on transient failures)."""
    options = {"range": (start, end)}
    data = call(obj.config, obj.key, "reading", lambda: bytes(_get(obj, options).bytes()))
    if len(data) != end - start:  # no ETag to check, and the object is shorter than listed
        raise _changed(obj, f"bytes {start}-{end} asked, {len(data)} received")
    return data


def download(obj: RemoteObject, sink: BinaryIO) -> None:
    """The whole object into `sink`; a failure mid-body resumes at the first byte not yet written."""
    written = 0

    def fetch() -> None:
        nonlocal written
        if written >= obj.size:
            return
        result = _get(obj, {"range": {"offset": written}} if written else {})
        for chunk in result.stream(min_chunk_size=1 << 20):
            sink.write(chunk)
            written += len(chunk)

    call(obj.config, obj.key, "reading", fetch)
    if written != obj.size:
        raise _changed(obj, f"{written} bytes received, {obj.size} listed")


class RangedReader(io.RawIOBase):
    """A remote object as a seekable binary file, fetched in windows by ranged GETs.

    `end_hint` is where the caller means to stop (a partition's end): the first window
    reaches just past it, so a byte range costs one request and a resume at offset `o`
    never asks for the bytes before `o`. Random reads (parquet) fetch what they ask for.
    """

    def __init__(self, obj: RemoteObject, end_hint: int | None = None):
        super().__init__()
        self.obj, self.end_hint = obj, end_hint
        self.name = obj.url
        self._pos, self._at, self._buf, self._tail = 0, 0, b"", _TAIL

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self.obj.size}[whence]
        self._pos = max(0, base + offset)
        return self._pos

    def _buffered(self) -> bool:
        return self._at <= self._pos < self._at + len(self._buf)

    def _fill(self, need: int = 1) -> bool:
        """Fetch the window at the current position; False at the end of the object."""
        left = self.obj.size - self._pos
        if left <= 0:
            return False
        if self.end_hint is not None and self._pos < self.end_hint:
            size, self._tail = self.end_hint - self._pos + _TAIL, _TAIL
        elif self._pos == self._at + len(self._buf):  # reading on: the line (or array) goes on
            size, self._tail = self._tail, min(_MAX_WINDOW, self._tail * 2)
        else:
            size = _TAIL
        size = min(left, max(min(size, _MAX_WINDOW), need))
        self._buf, self._at = read_range(self.obj, self._pos, self._pos + size), self._pos
        return True

    def read(self, size: int | None = -1) -> bytes:
        want = self.obj.size - self._pos if size is None or size < 0 else size
        parts = []
        while want > 0 and (self._buffered() or self._fill(want)):
            off = self._pos - self._at
            chunk = self._buf[off : off + want]
            parts.append(chunk)
            self._pos += len(chunk)
            want -= len(chunk)
        return b"".join(parts)

    def readinto(self, buffer: Any) -> int:
        data = self.read(len(buffer))
        buffer[: len(data)] = data
        return len(data)

    def readline(self, size: int | None = -1) -> bytes:
        parts = []
        while self._buffered() or self._fill():
            off = self._pos - self._at
            nl = self._buf.find(b"\n", off)
            stop = nl + 1 if nl >= 0 else len(self._buf)
            parts.append(self._buf[off:stop])
            self._pos = self._at + stop
            if nl >= 0:
                break
        return b"".join(parts)
