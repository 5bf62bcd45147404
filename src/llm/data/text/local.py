"""Local text files as a source: byte ranges of plain files, whole compressed files, parquet row groups."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from llm.data.text.partitions import byte_ranges, partition_bytes
from llm.data.text.readers import (
    expand_inputs,
    input_kind,
    iter_line_range,
    iter_parquet_rows,
    open_binary,
    parquet_row_groups,
    record_text,
    splittable,
)
from llm.data.text.source import Partition, Record, TextSource, Want


class LocalLineTextSource(TextSource):
    """A file, glob or folder of text files; any file that is not .jsonl/.json/.parquet is a record per line.

    Plain or .gz/.zst. Uncompressed line files are cut into byte ranges (a resume
    seeks); compressed files are one partition each (a resume re-reads the lines
    before its cursor); parquet files are one partition per row group.
    """

    def __init__(
        self,
        dataset_path: str | Path | list[str],
        text_column: str | None = "text",
        partition_bytes: int | None = None,
    ):
        patterns = [str(p) for p in dataset_path] if isinstance(dataset_path, list) else [str(dataset_path)]
        self.dataset_path = patterns[0] if len(patterns) == 1 else patterns
        self.patterns = patterns
        self.text_column = text_column
        self.files = expand_inputs(patterns)
        self.sizes = [f.stat().st_size for f in self.files]
        self.partition_bytes = partition_bytes or _default_partition_bytes(self.files, self.sizes)

    def source_fingerprint(self) -> dict:
        return {
            "type": "local",
            "dataset_path": self.dataset_path,
            "files": [f.name for f in self.files],
            "bytes": self.sizes,
            "text_column": self.text_column,
            "partition_bytes": self.partition_bytes,
        }

    def partitions(self) -> list[Partition]:
        parts: list[Partition] = []
        for i, (f, size) in enumerate(zip(self.files, self.sizes)):
            name = f"{i:05d}:{f.name}"
            if splittable(f):
                for start, end in byte_ranges(size, self.partition_bytes):
                    parts.append(Partition(f"{name}[{start}:{end}]", str(f), start, end, seekable=True))
            elif input_kind(f) == "parquet":
                for rg in range(parquet_row_groups(f, self.text_column)):
                    parts.append(Partition(f"{name}#rg{rg}", str(f), shard=rg))
            else:
                parts.append(Partition(name, str(f)))
        return parts

    def iter_partition(self, part: Partition, offset: int = 0, want: Want = None) -> Iterator[Record]:
        path = Path(part.path or "")
        if part.shard is not None:
            for text, row in iter_parquet_rows(path, self.text_column, part.shard, offset, want):
                yield text, row, None
        elif part.seekable:
            for text, after, _ in iter_line_range(path, self.text_column, part.start, part.end, offset):
                yield text, after, None
        else:
            yield from _iter_lines_counted(path, offset, self.text_column, want)

    def iter_texts(self, skip: int = 0) -> Iterator[str]:
        for part in self.partitions():
            for text, _, _ in self.iter_partition(part):
                if skip:
                    skip -= 1
                    continue
                yield text


def _default_partition_bytes(files: list[Path], sizes: list[int]) -> int:
    return partition_bytes(sum(s for f, s in zip(files, sizes) if splittable(f)))


def _iter_lines_counted(path: Path, offset: int, column: str | None, want: Want = None) -> Iterator[Record]:
    """Compressed line files: `offset` counts lines, skipped by reading (no seek possible)."""
    kind = input_kind(path)
    with open_binary(path) as f:
        for line_no, line in enumerate(f, start=1):
            if line_no <= offset or (want is not None and not want(line_no)):
                continue
            text = record_text(line, path, line_no, column, kind)
            if text is not None:
                yield text, line_no, None
