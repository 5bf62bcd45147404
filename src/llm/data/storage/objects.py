"""One interface over the places a dataset's files can live: an s3://, gs:// or az:// prefix, or a network
folder (local:).

Both give `get`, `get_into` (streamed, restartable), `put` (optionally create-only), `delete`,
`list` and `url`; the shard cache and remote writers use nothing else.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from llm.data.storage.paths import Location, parse_location
from llm.data.storage.s3 import ObjectNotFound, S3Objects, resolve_config
from llm.data.waiting import in_flight

_BLOCK = 8 << 20


class LocalObjects:
    """Files of a folder on a (network) drive, by name."""

    def __init__(self, folder: str | Path, scheme: str = "local:"):
        self.folder, self.scheme = Path(folder), scheme

    def url(self, name: str = "") -> str:
        return f"{self.scheme}{self.folder / name if name else self.folder}"

    def _missing(self, name: str) -> ObjectNotFound:
        return ObjectNotFound(f"{self.url(name)} does not exist: check the path and that the drive is mounted")

    def get(self, name: str) -> bytes:
        try:
            return (self.folder / name).read_bytes()
        except FileNotFoundError:
            raise self._missing(name) from None

    def get_into(self, name: str, sink: Callable[[int], Any]) -> None:
        try:  # a network drive that stops answering is named by the data watchdog (llm/data/waiting.py)
            with in_flight(f"reading {self.url(name)}"), open(self.folder / name, "rb") as f:
                write = sink(1)
                while block := f.read(_BLOCK):
                    write(memoryview(block))
        except FileNotFoundError:
            raise self._missing(name) from None

    def put(self, name: str, data: bytes | Path, create: bool = False) -> None:
        from llm.data.storage.local import atomic_write

        self.folder.mkdir(parents=True, exist_ok=True)
        payload = data.read_bytes() if isinstance(data, Path) else data
        if not create:
            atomic_write(self.folder / name, payload)
            return
        try:
            fd = os.open(self.folder / name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            raise FileExistsError(f"{self.url(name)} already exists") from None
        with os.fdopen(fd, "wb") as f:
            f.write(payload)

    def delete(self, name: str) -> None:
        (self.folder / name).unlink(missing_ok=True)

    def list(self) -> dict[str, int]:
        if not self.folder.is_dir():
            return {}
        return {p.name: p.stat().st_size for p in self.folder.iterdir() if p.is_file()}


def download(objects: S3Objects | LocalObjects, name: str, dest: Path, part: Path,
             verify: Callable[[str], None] | None = None) -> None:
    """Object `name` into the file `dest`, streamed through `part`: a reader of `dest` sees it whole or not at all.

    A retried request starts the part file over (obstore resumes a broken body itself; a new attempt rewrites).
    `verify(sha256 hex digest of the bytes)` runs before `dest` is replaced: if it raises, the part file is
    removed and `dest` is left as it was.
    """
    digest = hashlib.sha256() if verify is not None else None
    with open(part, "wb") as f:

        def sink(_attempt: int) -> Any:
            nonlocal digest
            f.seek(0)
            f.truncate()
            if digest is None:
                return f.write
            digest = hashlib.sha256()
            return lambda chunk: (digest.update(chunk), f.write(chunk))[1]

        objects.get_into(name, sink)
    if verify is not None:
        try:
            verify(digest.hexdigest())
        except BaseException:
            part.unlink(missing_ok=True)
            raise
    os.replace(part, dest)


def open_objects(location: str | Path | Location, storage_options: dict | None = None) -> S3Objects | LocalObjects:
    """The objects of a remote dataset location (s3://, gs://, az:// or local:)."""
    loc = parse_location(location)
    if loc.is_object_store:
        return S3Objects(resolve_config(loc.bucket, storage_options, loc.kind), loc.path)
    if storage_options:
        raise ValueError(f"storage_options apply to object stores (s3://, gs://, az://) only, not {loc}")
    return LocalObjects(loc.path, "local:" if loc.kind == "local" else "")
