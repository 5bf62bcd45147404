"""Text files as a source: byte ranges of plain files, whole compressed files / JSON arrays, parquet row groups.

The files are local, or objects in s3:// storage read the same way (ranged GETs where a
local file would seek, so cursors and order are the same).
"""

from __future__ import annotations

from collections.abc import Iterator
from itertools import islice
from pathlib import Path

from llm.data.inputs.partitions import byte_ranges
from llm.data.inputs.partitions import partition_bytes as partition_bytes_for
from llm.data.inputs.readers import (
    FileStamp,
    InputError,
    expand_sources,
    input_kind,
    iter_line_range,
    iter_parquet_rows,
    iter_records,
    parquet_row_groups,
    require_records,
    splittable,
)
from llm.data.inputs.source import Partition, Record, RecordFilter, TextSource
from llm.data.storage.object_files import RemoteObject
from llm.data.storage.s3 import StorageError


class RemoteReadError(InputError, StorageError):
    """Reading an object failed (after the retries) or it changed: one sentence naming bucket and key.

    An InputError too, so DataLoader workers pass the sentence on like any bad input.
    """


class LocalLineTextSource(TextSource):
    """A file, glob or folder of text files; any file that is not .jsonl/.json/.parquet is a record per line.

    Plain or .gz/.zst. Uncompressed line files are cut into byte ranges (a resume
    seeks); compressed files and JSON arrays are one partition each (a resume
    re-reads the rows before its cursor); parquet files are one partition per row
    group. Each file is stamped (size, mtime, first and last 64 KiB) when the
    source is made: the stamp is in the fingerprint (a resume on a changed file is
    refused) and is checked again after every partition read (a file changed while
    read is an error, never a mix of old and new records). An input with no record
    at all is an error (`StreamingTextDataModule` says so after its first pass).

    `s3://bucket/prefix/*.jsonl` (a key, a prefix or a glob; `storage_options` or the AWS
    environment reach it) lists objects, stamped by ETag: each GET asks for that version
    (`If-Match`), so a replaced object is an error, and a resume fetches from its cursor.
    `local:/mnt/...` is a local path.
    """

    def __init__(
        self,
        dataset_path: str | Path | list[str],
        text_column: str | None = "text",
        partition_bytes: int | None = None,
        storage_options: dict | None = None,
    ):
        patterns = [str(p) for p in dataset_path] if isinstance(dataset_path, list) else [str(dataset_path)]
        self.dataset_path = patterns[0] if len(patterns) == 1 else patterns
        self.patterns = patterns
        self.text_column = text_column
        self.files = expand_sources(patterns, storage_options)
        self._by_path = {str(f): f for f in self.files}
        self.stamps = {str(f): FileStamp.of(f) for f in self.files if not isinstance(f, RemoteObject)}
        self.sizes = [f.size if isinstance(f, RemoteObject) else self.stamps[str(f)].size for f in self.files]
        # one probe per file (a ranged GET for an object): partitions() reuses it, in every worker
        self._splittable = [splittable(f) for f in self.files]
        self._parts: list[Partition] | None = None
        self.partition_bytes = partition_bytes or partition_bytes_for(
            sum(s for s, split in zip(self.sizes, self._splittable) if split)
        )

    @property
    def uses_object_store(self) -> bool:
        """Whether some input is in object storage (its client does not survive fork())."""
        return any(isinstance(f, RemoteObject) for f in self.files)

    def local_files(self) -> list[Path | RemoteObject]:
        return list(self.files)

    def require_records(self, hint: str = "check the input") -> None:
        require_records(self.files, self.text_column, hint)  # type: ignore[arg-type]

    def source_fingerprint(self) -> dict:
        names = [f.name for f in self.files]
        keys = names if len(set(names)) == len(names) else [str(f) for f in self.files]
        return {
            "type": "local",
            "dataset_path": self.dataset_path,
            "files": names,
            "bytes": self.sizes,
            "text_column": self.text_column,
            "partition_bytes": self.partition_bytes,
            # per file, "mtime_ns:hash of the first and last 64 KiB": a file rewritten at the same
            # size would otherwise resume mid-line at an old byte offset; per object, its ETag
            # (else its last-modified time), so a replaced object is refused the same way
            "stamps": {k: _stamp(f, self.stamps) for k, f in zip(keys, self.files)},
        }

    def partitions(self) -> list[Partition]:
        if self._parts is None:
            self._parts = self._partitions()
        return list(self._parts)

    def _partitions(self) -> list[Partition]:
        parts: list[Partition] = []
        for i, (f, size, split) in enumerate(zip(self.files, self.sizes, self._splittable)):
            name = f"{i:05d}:{f.name}"
            if split:
                for start, end in byte_ranges(size, self.partition_bytes):
                    parts.append(Partition(f"{name}[{start}:{end}]", str(f), start, end, seekable=True))
            elif input_kind(f) == "parquet":
                for rg in range(parquet_row_groups(f, self.text_column)):
                    parts.append(Partition(f"{name}#rg{rg}", str(f), shard=rg))
            else:
                parts.append(Partition(name, str(f)))
        return parts

    def iter_partition(self, part: Partition, offset: int = 0, want: RecordFilter = None) -> Iterator[Record]:
        path = self._by_path.get(part.path or "") or Path(part.path or "")
        stamp = self.stamps.get(str(path))  # None for an object: every GET names the listed ETag
        if stamp is not None:
            stamp.check(path, "since the source was opened")
        try:
            yield from self._records(path, part, offset, want)
        except GeneratorExit:  # closed; matched first: at interpreter exit this module's globals may be None
            raise
        except InputError:
            if stamp is not None:  # a line cut by a writer is a changed file, not a bad record
                stamp.check(path)
            raise
        except StorageError as e:  # an object's read failed after the retries, or it changed
            raise RemoteReadError(str(e)) from None
        if stamp is not None:  # the whole partition was read: were its records all from one version?
            stamp.check(path)

    def _records(self, path: Path | RemoteObject, part: Partition, offset: int, want: RecordFilter) -> Iterator[Record]:
        if part.shard is not None:
            for text, row in iter_parquet_rows(path, self.text_column, part.shard, offset, want):
                yield text, row, None
        elif part.seekable:
            for text, after, _ in iter_line_range(path, self.text_column, part.start, part.end, offset):
                yield text, after, None
        else:
            for text, row, _ in iter_records(path, self.text_column, offset, want):
                yield text, row, None

    def iter_texts(self, skip: int = 0) -> Iterator[str]:
        texts = (text for part in self.partitions() for text, _, _ in self.iter_partition(part))
        yield from islice(texts, skip, None)


def _stamp(f: Path | RemoteObject, stamps: dict[str, FileStamp]) -> str:
    if isinstance(f, RemoteObject):
        return f.stamp()
    s = stamps[str(f)]
    return f"{s.mtime_ns}:{s.edges}"
