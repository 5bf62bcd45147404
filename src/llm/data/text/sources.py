"""Text sources for `stream_lm`: local files and HF streaming datasets, split into fixed partitions.

A source is split into partitions that do not depend on the topology (files,
byte ranges of a big uncompressed file aligned to line ends, parquet row groups,
HF shards). `iter_partition(part, offset, want)` yields `(text, offset_after, digest)`;
`offset` is a byte offset (uncompressed local files: a resume seeks) or a row
count (compressed files, parquet, HF, custom sources: a resume re-skips rows).

Row-offset partitions are further cut into `STRIPES` stripes (row r belongs to
stripe (r - 1) % STRIPES), so that a single compressed file, HF shard or custom
source still feeds several ranks; `want(row)` lets a reader skip other stripes'
rows before parsing them.
"""

from __future__ import annotations

import dis
import math
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from llm.data.text.readers import (
    InputError,
    compression_of,
    expand_inputs,
    input_kind,
    open_binary,
    record_text,
)

Record = tuple[str, int, "bytes | None"]

# Byte-range partitions of uncompressed line files: aim at this many partitions in
# all, each between these sizes, so that small corpora still spread over a few ranks.
TARGET_PARTITIONS = 64
MIN_PARTITION_BYTES = 1 << 10
MAX_PARTITION_BYTES = 64 << 20
# Stripes per row-offset partition: fixed, so cursors do not depend on the topology.
STRIPES = 8
Want = Callable[[int], bool] | None


@dataclass(frozen=True)
class Partition:
    """One topology-independent piece of a source; `key` names it in cursors."""

    key: str
    path: str | None = None
    start: int = 0
    end: int | None = None
    shard: int | None = None
    seekable: bool = False  # offsets are byte positions (else row counts)
    stripe: int | None = None  # rows r with (r - 1) % stripes == stripe of the base partition
    stripes: int = 1
    base: str | None = None  # key of the partition this stripe cuts

    @property
    def group(self) -> str:
        """Stripes of one base partition share a group: one reader serves them together."""
        return self.base or self.key

    def owns_row(self, row: int) -> bool:
        return self.stripe is None or (row - 1) % self.stripes == self.stripe


class TextSource:
    """A stream of stripped, non-empty text records.

    Subclasses must implement `iter_texts` and `source_fingerprint`; the default
    partitioning is a single partition resumed by skipping `offset` records.
    """

    def iter_texts(self, skip: int = 0) -> Iterator[str]:
        """Every record in order, after skipping the first `skip` records."""
        raise NotImplementedError

    def source_fingerprint(self) -> dict:
        """A JSON-able description of everything that changes the stream."""
        raise NotImplementedError

    def partitions(self) -> list[Partition]:
        """The fixed list of partitions of this source."""
        return [Partition(key="all")]

    def iter_partition(self, part: Partition, offset: int = 0, want: Want = None) -> Iterator[Record]:
        """Records of one partition from `offset` on, each with the offset after it.

        `want(row)` (row-offset partitions only) may skip rows before they are parsed;
        callers filter again, so honouring it is an optimisation.
        """
        for i, text in enumerate(self.iter_texts(skip=offset), start=offset + 1):
            yield text, i, None


def _partition_bytes(total: int) -> int:
    size = math.ceil(total / TARGET_PARTITIONS) if total else MIN_PARTITION_BYTES
    return min(MAX_PARTITION_BYTES, max(MIN_PARTITION_BYTES, size))


class LocalLineTextSource(TextSource):
    """A file, glob or folder of .txt (a record per line), .jsonl and .parquet, plain or .gz/.zst."""

    def __init__(
        self, path: str | Path | list[str], text_column: str = "text", partition_bytes: int | None = None
    ):
        patterns = [str(p) for p in path] if isinstance(path, list) else [str(path)]
        self.patterns = patterns
        self.text_column = text_column
        self.files = expand_inputs(patterns)
        self.sizes = [f.stat().st_size for f in self.files]
        seekable = [s for f, s in zip(self.files, self.sizes) if _seekable(f)]
        self.partition_bytes = partition_bytes or _partition_bytes(sum(seekable))

    def source_fingerprint(self) -> dict:
        return {
            "type": "local",
            "path": self.patterns[0] if len(self.patterns) == 1 else self.patterns,
            "files": [f.name for f in self.files],
            "bytes": self.sizes,
            "text_column": self.text_column,
            "partition_bytes": self.partition_bytes,
        }

    def partitions(self) -> list[Partition]:
        parts: list[Partition] = []
        for i, (f, size) in enumerate(zip(self.files, self.sizes)):
            name = f"{i:05d}:{f.name}"
            if _seekable(f):
                for start in range(0, max(size, 1), self.partition_bytes):
                    end = min(start + self.partition_bytes, size)
                    parts.append(Partition(f"{name}[{start}:{end}]", str(f), start, end, seekable=True))
            elif input_kind(f) == "parquet":
                for rg in range(_row_groups(f)):
                    parts.append(Partition(f"{name}#rg{rg}", str(f), shard=rg))
            else:
                parts.append(Partition(name, str(f)))
        return parts

    def iter_partition(self, part: Partition, offset: int = 0, want: Want = None) -> Iterator[Record]:
        path = Path(part.path or "")
        if part.shard is not None:
            yield from _iter_row_group(path, part.shard, self.text_column, offset, want)
        elif part.seekable:
            yield from _iter_byte_range(path, part.start, part.end, offset, self.text_column)
        else:
            yield from _iter_lines_counted(path, offset, self.text_column, want)

    def iter_texts(self, skip: int = 0) -> Iterator[str]:
        for part in self.partitions():
            for text, _, _ in self.iter_partition(part):
                if skip:
                    skip -= 1
                    continue
                yield text


def _seekable(path: Path) -> bool:
    return compression_of(path) is None and input_kind(path) != "parquet"


def _row_groups(path: Path) -> int:
    import pyarrow.parquet as pq

    try:
        return pq.ParquetFile(path).num_row_groups
    except Exception as e:  # pyarrow raises several types for unreadable files
        raise InputError(f"{path}: cannot read parquet file ({e})") from None


def _iter_byte_range(
    path: Path, start: int, end: int | None, offset: int, column: str
) -> Iterator[Record]:
    """Lines that start in [start, end); `offset` > 0 is the byte where the next line starts."""
    kind = input_kind(path)
    with open(path, "rb") as f:
        if offset > 0:
            f.seek(offset)  # the cursor is always at a line start: no re-scan
            pos = offset
        else:
            pos = start
            if start > 0:
                f.seek(start - 1)
                pos += len(f.readline()) - 1  # the line that started before `start` is not ours
        # line numbers are known only when reading from the top; elsewhere errors name the byte
        line_no = 0 if pos == 0 else None
        while end is None or pos < end:
            line = f.readline()
            if not line:
                return
            line_start, pos = pos, pos + len(line)
            line_no = None if line_no is None else line_no + 1
            where = line_no if line_no is not None else f"byte {line_start}"
            text = record_text(line, path, where, column, kind)  # type: ignore[arg-type]
            if text is not None:
                yield text, pos, None


def _iter_lines_counted(path: Path, offset: int, column: str, want: Want = None) -> Iterator[Record]:
    """Compressed line files: `offset` counts lines, skipped by reading (no seek possible)."""
    kind = input_kind(path)
    with open_binary(path) as f:
        for line_no, line in enumerate(f, start=1):
            if line_no <= offset or (want is not None and not want(line_no)):
                continue
            text = record_text(line, path, line_no, column, kind)
            if text is not None:
                yield text, line_no, None


def _iter_row_group(path: Path, group: int, column: str, offset: int, want: Want = None) -> Iterator[Record]:
    import pyarrow.parquet as pq

    pf = pq.ParquetFile(path)
    names = pf.schema_arrow.names
    if column not in names:
        raise InputError(f"{path}: missing text column {column!r} (columns: {', '.join(names)}); set text_column")
    values = pf.read_row_group(group, columns=[column]).column(0).to_pylist()
    for row in range(offset, len(values)):
        if want is not None and not want(row + 1):
            continue
        text = values[row]
        if isinstance(text, str) and text.strip():
            yield text.strip(), row + 1, None


class HFStreamTextSource(TextSource):
    """`datasets.load_dataset(..., streaming=True)`; partitions are the dataset's shards."""

    def __init__(
        self,
        name: str,
        config: str | None = None,
        split: str = "train",
        text_column: str = "text",
        data_files: str | list[str] | None = None,
    ):
        self.name, self.config, self.split = name, config, split
        self.text_column = text_column
        self.data_files = data_files
        self._ds: Any = None

    def _dataset(self) -> Any:
        if self._ds is None:
            import datasets

            kwargs: dict[str, Any] = {"split": self.split, "streaming": True}
            if self.data_files:
                kwargs["data_files"] = self.data_files
            self._ds = datasets.load_dataset(self.name, self.config, **kwargs)
        return self._ds

    def source_fingerprint(self) -> dict:
        fp = {"type": "hf", "name": self.name, "config": self.config, "split": self.split,
              "text_column": self.text_column}
        if self.data_files:
            fp["data_files"] = self.data_files
        return fp

    def partitions(self) -> list[Partition]:
        n = self._dataset().num_shards
        return [Partition(f"shard{i:05d}of{n}", shard=i) for i in range(n)]

    def _rows(self, ds: Any, offset: int, want: Want = None) -> Iterator[Record]:
        if offset:
            ds = ds.skip(offset)  # HF streams cannot seek: the skipped rows are re-read
        row = offset
        # .iter() rather than iter(ds): inside a DataLoader worker, iter(ds) would split the
        # shards over the workers a second time; our partitions already did that.
        for batch in ds.iter(batch_size=256):
            if self.text_column not in batch:
                keys = ", ".join(sorted(batch))
                raise InputError(
                    f"{self.name}: missing text column {self.text_column!r} (columns: {keys}); set text_column"
                )
            for text in batch[self.text_column]:
                row += 1
                if want is not None and not want(row):
                    continue
                if isinstance(text, str) and text.strip():
                    yield text.strip(), row, None

    def iter_partition(self, part: Partition, offset: int = 0, want: Want = None) -> Iterator[Record]:
        ds = self._dataset()
        yield from self._rows(ds.shard(ds.num_shards, part.shard or 0, contiguous=True), offset, want)

    def iter_texts(self, skip: int = 0) -> Iterator[str]:
        for text, _, _ in self._rows(self._dataset(), skip):
            yield text


SourceFactory = Callable[[Any], TextSource]


def _attribute_names(fn: Callable) -> frozenset[str] | None:
    """The attribute names a factory reads (`cfg.dataset_bucket`), found in its bytecode."""
    code = getattr(fn, "__code__", None)
    if code is None:
        return None
    names: set[str] = set()
    stack = [code]
    while stack:
        c = stack.pop()
        for ins in dis.get_instructions(c):
            if ins.opname in ("LOAD_ATTR", "LOAD_METHOD") and isinstance(ins.argval, str):
                names.add(ins.argval)
        stack.extend(k for k in c.co_consts if hasattr(k, "co_code"))
    return frozenset(names)


class SourceRegistry:
    """Names (`data_source`) to factories `cfg -> TextSource`; the built-ins are registered below."""

    def __init__(self) -> None:
        self._factories: dict[str, SourceFactory] = {}
        self._keys: dict[str, frozenset[str] | None] = {}
        self._builtin: set[str] = set()

    def register(
        self, name: str, factory: SourceFactory, config_keys: Iterable[str] | None = None
    ) -> None:
        """Register `factory` under `name`; `config_keys` are the extra `data:` keys it reads.

        Without `config_keys`, the keys are the attributes the factory reads from
        its config argument (found in its code), so the guide's one-line lambda
        declares `dataset_bucket` / `dataset_key` by using them.
        """
        self._factories[name] = factory
        self._keys[name] = frozenset(config_keys) if config_keys is not None else _attribute_names(factory)

    def _register_builtin(self, name: str, factory: SourceFactory) -> None:
        self._factories[name] = factory
        self._keys[name] = frozenset()
        self._builtin.add(name)

    def __contains__(self, name: object) -> bool:
        return name in self._factories

    def names(self) -> list[str]:
        return list(self._factories)

    def custom_names(self) -> list[str]:
        return [n for n in self._factories if n not in self._builtin]

    def declared_keys(self, name: str) -> frozenset[str] | None:
        """Extra config keys allowed for `name`; None means the source accepts any."""
        return self._keys.get(name, frozenset())

    def build(self, cfg: Any) -> TextSource:
        """The source named by `cfg.data_source`."""
        factory = self._factories.get(cfg.data_source)
        if factory is None:
            raise ValueError(
                f"data_source {cfg.data_source!r} is not registered; use one of: {', '.join(self.names())}"
            )
        return factory(cfg)


def _local(cfg: Any) -> TextSource:
    return LocalLineTextSource(cfg.dataset_path, cfg.text_column)


def _hf(cfg: Any) -> TextSource:
    # dataset_path with an HF source = data_files, e.g. dataset_name 'json' over local files.
    return HFStreamTextSource(
        cfg.dataset_name, cfg.dataset_config, cfg.dataset_split, cfg.text_column,
        data_files=cfg.dataset_path or None,
    )


def _dedup(inner: SourceFactory) -> SourceFactory:
    def build(cfg: Any) -> TextSource:
        from llm.data.text.dedup import DedupTextSource

        return DedupTextSource(inner(cfg), cfg.hash_algo, cfg.seen_hashes_path, cfg.write_seen_hashes)

    return build


SOURCE_REGISTRY = SourceRegistry()
SOURCE_REGISTRY._register_builtin("local", _local)
SOURCE_REGISTRY._register_builtin("hf", _hf)
SOURCE_REGISTRY._register_builtin("dedup_local", _dedup(_local))
SOURCE_REGISTRY._register_builtin("dedup_hf", _dedup(_hf))


def stripe_partitions(parts: list[Partition], stripes: int = STRIPES) -> list[Partition]:
    """Row-offset partitions cut into `stripes` stripes each; byte ranges stay whole."""
    out: list[Partition] = []
    for p in parts:
        if p.seekable or stripes == 1:
            out.append(p)
            continue
        for j in range(stripes):
            out.append(replace(p, key=f"{p.key}/s{j}of{stripes}", stripe=j, stripes=stripes, base=p.key))
    return out


def assign_partitions(parts: list[Partition], consumer: int, consumers: int) -> list[Partition]:
    """The partitions consumer `consumer` (= rank * workers + worker) owns.

    Whole groups (a byte range, or all stripes of one file / shard) go round robin
    when there are at least as many groups as consumers, so nothing is read twice;
    otherwise the stripes themselves do, and a group is read by several consumers,
    each keeping its own stripes. Cursors are per partition, so any assignment can
    resume from any other.
    """
    groups = list(dict.fromkeys(p.group for p in parts))
    if len(groups) >= consumers:
        mine = {g for i, g in enumerate(groups) if i % consumers == consumer}
        return [p for p in parts if p.group in mine]
    return [p for i, p in enumerate(parts) if i % consumers == consumer]
