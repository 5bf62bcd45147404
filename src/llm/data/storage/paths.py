"""Where a dataset lives: a plain local path, `local:/mnt/share/...` (a network folder read
through the local shard cache), `s3://bucket/prefix`, `gs://bucket/prefix` (Google Cloud Storage) or
`az://container/prefix` (Azure Blob Storage). A URL is never taken as a local path."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

SCHEMES = ("s3", "gs", "az")  # object stores; the Location's kind is the scheme
_ALIASES = {"gcs": "gs", "azure": "az"}  # spellings other libraries accept (fsspec's gcs://, ...)
_URL = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")
_SCHEME_ONLY = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]+):")  # s3:bucket, gs:/x (one letter: a Windows drive)
_BUCKET = re.compile(r"^[a-z0-9][a-z0-9.\-_]{1,254}$")
_HELP = ("expected a local path, local:/path/on/a/network/drive, s3://bucket/prefix, gs://bucket/prefix "
         "or az://container/prefix")


@dataclass(frozen=True)
class Location:
    """A dataset folder. `kind`: 'file' (local disk), 'local' (network folder, cached), or an object
    store's scheme: 's3', 'gs' or 'az' (where `bucket` is the Azure container)."""

    kind: str
    path: str  # file/local: the filesystem path; object stores: the key prefix, no leading or trailing '/'
    bucket: str = ""

    @property
    def is_remote(self) -> bool:
        """Read through the shard cache (s3:// and local:)."""
        return self.kind != "file"

    @property
    def is_object_store(self) -> bool:
        return self.kind in SCHEMES

    def local_path(self) -> Path:
        if self.is_object_store:
            raise ValueError(f"{self} is in object storage, not a local folder")
        return Path(self.path)

    def key(self, name: str) -> str:
        """The object key (object stores) or file path (local) of `name` inside this folder."""
        if self.is_object_store:
            return f"{self.path}/{name}" if self.path else name
        return str(Path(self.path) / name)

    def url(self, name: str = "") -> str:
        if self.is_object_store:
            key = self.key(name) if name else self.path
            return f"{self.kind}://{self.bucket}/{key}" if key else f"{self.kind}://{self.bucket}"
        base = self.key(name) if name else self.path
        return f"local:{base}" if self.kind == "local" else base

    def __str__(self) -> str:
        return self.url()


def parse_location(value: str | Path | Location) -> Location:
    """A Location from what the user typed; an unknown scheme is one clear error."""
    if isinstance(value, Location):
        return value
    if isinstance(value, Path):
        return Location("file", str(value))
    if not isinstance(value, str) or not value:
        raise ValueError(f"dataset location {value!r} is not a path or URL; {_HELP}")
    url = _URL.match(value)
    if url:
        scheme = url.group(1).lower()
        scheme = _ALIASES.get(scheme, scheme)
        rest = value[url.end() :]
        if scheme in SCHEMES:
            return _parse_bucket_url(scheme, value, rest)
        if scheme == "file":
            return Location("file", rest if rest.startswith("/") else "/" + rest)
        raise ValueError(f"unknown storage scheme {scheme + '://'!r} in {value!r}; {_HELP}")
    if value.startswith("local:"):
        path = value[len("local:") :]
        if not path:
            raise ValueError(f"{value!r} names no folder; {_HELP}")
        return Location("local", path)
    bare = _SCHEME_ONLY.match(value)
    if bare and not value.startswith(("./", "/")):
        raise ValueError(f"{value!r} looks like a URL with scheme {bare.group(1)!r} but no '//'; {_HELP}")
    return Location("file", value)


def _parse_bucket_url(scheme: str, value: str, rest: str) -> Location:
    bucket, _, prefix = rest.partition("/")
    what = "container" if scheme == "az" else "bucket"
    if not bucket:
        raise ValueError(f"{value!r} names no {what}; expected {scheme}://{what}/prefix")
    if not _BUCKET.match(bucket):
        raise ValueError(f"{value!r}: {bucket!r} is not a valid {what} name (3-255 lowercase letters, digits, '.', '-')")
    prefix = prefix.strip("/")
    if any(part in (".", "..") for part in prefix.split("/")) or "//" in prefix:
        raise ValueError(f"{value!r}: the prefix has an empty, '.' or '..' part; expected {scheme}://{what}/a/b")
    return Location(scheme, prefix, bucket)
