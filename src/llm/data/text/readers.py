"""Raw input files to text records: .txt / .jsonl / .json (plain, .gz, .zst) and .parquet, with one error style.

Nothing on disk is trusted: a compressed stream must end where its format says
(`compressed.py`), a parquet file that pyarrow cannot decode is named with its
row group, a file that changes while it is read (`FileStamp`) is an error, and
so is an input that holds no record at all. The UTF-8 policy is `records.py`'s.
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from llm.data.text.compressed import open_compressed
from llm.data.text.errors import InputError, one_line
from llm.data.text.records import decode_text, iter_json_array, record_text, starts_json_array

__all__ = ["InputError", "decode_text", "record_text"]  # their old home: importers keep working

_KINDS = {".txt": "txt", ".text": "txt", ".jsonl": "jsonl", ".json": "jsonl", ".ndjson": "jsonl", ".parquet": "parquet"}
_COMPRESSIONS = (".gz", ".zst")
_STAMP_BLOCK = 1 << 16


def compression_of(path: Path) -> str | None:
    """'gz', 'zst' or None, from the file name."""
    suffix = path.suffix.lower()
    return suffix[1:] if suffix in _COMPRESSIONS else None


def input_kind(path: Path | str) -> str:
    """'jsonl', 'parquet' or 'txt', from the file name (compression suffix ignored).

    Anything that is not .jsonl/.json/.ndjson/.parquet is text with one record per
    line, whatever its extension (.txt, .csv, .py, none).
    """
    path = Path(path)
    name = path.with_suffix("") if compression_of(path) else path
    return _KINDS.get(name.suffix.lower(), "txt")


def is_json_array(path: Path | str) -> bool:
    """Whether a JSON input holds one JSON array (read element by element) rather than JSON Lines."""
    if input_kind(path) != "jsonl":
        return False
    with open_binary(path) as f:
        return starts_json_array(f)


def splittable(path: Path | str) -> bool:
    """Whether byte ranges of the file can be read alone: uncompressed line files only (not JSON arrays)."""
    return compression_of(Path(path)) is None and input_kind(path) != "parquet" and not is_json_array(path)


def open_binary(path: Path | str) -> BinaryIO:
    """Open a file for reading bytes, decompressing .gz / .zst, checked (a cut or damaged stream is an InputError)."""
    path = Path(path)
    try:
        raw = open(path, "rb")  # noqa: SIM115 - returned to the caller, who closes it
    except OSError as e:
        raise InputError(f"{path}: cannot open input file ({e.strerror or e})") from None
    compression = compression_of(path)
    return open_compressed(raw, path, compression) if compression else raw


@dataclass(frozen=True)
class FileStamp:
    """What a file looked like when it was listed: size, mtime, and a hash of its first and last 64 KiB."""

    size: int
    mtime_ns: int
    edges: str

    @classmethod
    def of(cls, path: Path | str) -> FileStamp:
        with open(path, "rb") as f:
            st = os.fstat(f.fileno())
            digest = hashlib.blake2b(f.read(_STAMP_BLOCK), digest_size=8)
            if st.st_size > _STAMP_BLOCK:
                f.seek(max(_STAMP_BLOCK, st.st_size - _STAMP_BLOCK))
                digest.update(f.read(_STAMP_BLOCK))
        return cls(st.st_size, st.st_mtime_ns, digest.hexdigest())

    def check(self, path: Path | str, when: str = "while it was read") -> None:
        """Raise when the file's size or mtime moved since the stamp: it changed under us."""
        try:
            st = os.stat(path)
        except OSError as e:
            raise InputError(f"{path}: input file disappeared {when} ({e.strerror or e})") from None
        if (st.st_size, st.st_mtime_ns) != (self.size, self.mtime_ns):
            raise InputError(
                f"{path}: input file changed {when} (size {self.size} -> {st.st_size} bytes, mtime moved: "
                f"{st.st_mtime_ns != self.mtime_ns}); the records read would mix old and new content: "
                "re-run once nothing writes to it"
            )


def iter_line_range(
    path: Path | str, text_column: str | None = "text", start: int = 0, end: int | None = None, resume: int = 0
) -> Iterator[tuple[str, int, bool]]:
    """Records of a .txt / .jsonl file as (text, byte offset after its line, utf8_replaced).

    Blank records are skipped. With a byte range [start, end) of an uncompressed
    file, yields exactly the lines that *start* inside it, so consecutive ranges
    cover every line once. `resume` > 0 is a byte offset where a line starts (a
    cursor): reading seeks there and nothing before it is read again. A file that
    ends before `end` has shrunk since the range was planned: an InputError.
    """
    path = Path(path)
    kind = input_kind(path)
    with open_binary(path) as f:
        if resume > 0:
            f.seek(resume)
        elif start > 0:
            f.seek(start - 1)
            f.readline()  # finish the line that started before `start`: it belongs to the previous range
        pos = f.tell()
        # line numbers are known only when reading from the top; elsewhere they are counted on error
        line_no: int | None = 0 if pos == 0 else None
        while end is None or pos < end:
            line = f.readline()
            if not line:
                if end is not None and pos < end:
                    raise InputError(
                        f"{path}: input file ends at byte {pos}, before byte {end} where it ended when it was "
                        "listed: it was truncated while being read; re-run once nothing writes to it"
                    )
                return
            line_start, pos = pos, pos + len(line)
            line_no = None if line_no is None else line_no + 1
            try:
                text, replaced = record_text(line, path, line_no or 0, text_column, kind)
            except InputError:
                if line_no is None:  # name the real line: count the lines before it, only now
                    record_text(line, path, line_number_at(path, line_start), text_column, kind)
                raise
            if text is not None:
                yield text, pos, replaced


def iter_records(
    path: Path | str, text_column: str | None = "text", offset: int = 0, want: Callable[[int], bool] | None = None
) -> Iterator[tuple[str, int, bool]]:
    """A whole line file (any compression) or JSON array as (text, row number, utf8_replaced).

    Rows are lines (or array elements) counted from 1; rows up to `offset` and rows
    for which `want(row)` is false are skipped unparsed (a compressed file cannot seek).
    """
    path = Path(path)
    kind = input_kind(path)
    if is_json_array(path):
        with open_binary(path) as f:
            for text, row, replaced in iter_json_array(f, path, text_column):
                if text is not None and row > offset and (want is None or want(row)):
                    yield text, row, replaced
        return
    with open_binary(path) as f:
        for row, line in enumerate(f, start=1):
            if row <= offset or (want is not None and not want(row)):
                continue
            text, replaced = record_text(line, path, row, text_column, kind)
            if text is not None:
                yield text, row, replaced


def line_number_at(path: Path | str, offset: int) -> int:
    """1-based number of the line starting at byte `offset` of an uncompressed file."""
    count, done = 0, 0
    with open(path, "rb") as f:
        while done < offset:
            block = f.read(min(8 << 20, offset - done))
            if not block:
                break
            count += block.count(b"\n")
            done += len(block)
    return count + 1


def _parquet_file(path: Path, text_column: str | None):
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        pf = pq.ParquetFile(path, page_checksum_verification=True)  # pages written with CRCs are checked
    except Exception as e:  # pyarrow raises several types for unreadable files
        raise InputError(f"{path}: cannot read parquet file ({one_line(e)}); the file is incomplete or damaged") from None
    schema = pf.schema_arrow
    if text_column is None:  # whole records
        return pf
    if text_column not in schema.names:
        raise InputError(
            f"{path}: missing text column {text_column!r} (columns: {', '.join(schema.names)}); "
            "set text_column (CLI: --text-column)"
        )
    kind = schema.field(text_column).type
    if not (pa.types.is_string(kind) or pa.types.is_large_string(kind)):
        raise InputError(f"{path}: column {text_column!r} is {kind}, expected a string column")
    return pf


def _row_json(batch) -> list[str]:
    """A record batch's rows as JSON objects (fine-tuning keeps records whole)."""
    return [json.dumps(row, ensure_ascii=False, default=str) for row in batch.to_pylist()]


def parquet_row_groups(path: Path | str, text_column: str | None = "text") -> int:
    """How many row groups a parquet file has (its text column checked first)."""
    return _parquet_file(Path(path), text_column).num_row_groups


def _batches(pf, path: Path, text_column: str | None, group: int) -> Iterator:
    """One row group's record batches (all columns for whole records); a page pyarrow cannot decode names the file and group."""
    columns = [text_column] if text_column is not None else None
    batches = pf.iter_batches(columns=columns, batch_size=8192, row_groups=[group])
    while True:
        try:
            batch = next(batches)
        except StopIteration:
            return
        except Exception as e:  # ArrowInvalid, OSError, ...: the bytes on disk are not what the footer says
            raise InputError(
                f"{path}: cannot read parquet row group {group} ({one_line(e)}); the file is incomplete or damaged"
            ) from None
        yield batch


def iter_parquet_rows(
    path: Path | str,
    text_column: str | None = "text",
    row_group: int | None = None,
    offset: int = 0,
    want: Callable[[int], bool] | None = None,
) -> Iterator[tuple[str, int]]:
    """Stripped, non-empty texts of one parquet column as (text, row number after it).

    Rows count from the start of `row_group` (the whole file when None); rows up
    to `offset` and rows for which `want(row)` is false are skipped unparsed.
    """
    path = Path(path)
    pf = _parquet_file(path, text_column)
    groups = [row_group] if row_group is not None else list(range(pf.num_row_groups))
    row = 0
    for group in groups:
        for batch in _batches(pf, path, text_column, group):
            n = batch.num_rows
            if row + n <= offset:
                row += n
                continue
            try:  # a damaged page can decode into strings that are not UTF-8
                values = batch.column(0).to_pylist() if text_column is not None else _row_json(batch)
            except UnicodeDecodeError as e:
                raise InputError(
                    f"{path}: parquet row group {group} holds invalid UTF-8 ({one_line(e)}); the file is damaged"
                ) from None
            for text in values:
                row += 1
                if row <= offset or (want is not None and not want(row)):
                    continue
                if isinstance(text, str) and text.strip():
                    yield text.strip(), row


def iter_texts(path: Path | str, text_column: str = "text") -> Iterator[tuple[str, bool]]:
    """Every record of any supported input file as (text, utf8_replaced)."""
    if input_kind(path) == "parquet":
        for text, _ in iter_parquet_rows(path, text_column):
            yield text, False
    else:
        for text, _, replaced in iter_records(path, text_column):
            yield text, replaced


def require_records(paths: list[Path], text_column: str = "text", hint: str = "check the input") -> None:
    """Raise unless some input yields a record (reads up to the first one only): empty input is a mistake."""
    for path in paths:
        for _ in iter_texts(path, text_column):
            return
    names = ", ".join(str(p) for p in paths[:5]) + (f" and {len(paths) - 5} more" if len(paths) > 5 else "")
    raise InputError(
        f"no records in {names}: every input file is empty or holds only blank records "
        f"(text column {text_column!r}); {hint}"
    )


def expand_inputs(patterns: list[str]) -> list[Path]:
    """Files, globs and folders to a sorted, de-duplicated list of supported input files."""
    found: list[Path] = []
    for pattern in patterns:
        path = Path(pattern).expanduser()
        if path.is_dir():
            matches = [p for p in sorted(path.rglob("*")) if p.is_file() and _supported(p)]
            if not matches:
                raise InputError(f"{path}: folder holds no .txt, .jsonl or .parquet input files")
        elif any(c in pattern for c in "*?["):
            matches = sorted(Path(p) for p in glob.glob(str(path), recursive=True) if Path(p).is_file())
            if not matches:
                raise InputError(f"{pattern}: no files match this pattern")
        elif path.is_file():
            matches = [path]
        else:
            raise InputError(f"{path}: no such input file or folder")
        found.extend(matches)
    return sorted(dict.fromkeys(p.resolve() for p in found))


_FOLDER_SUFFIXES = {".txt", ".text", ".jsonl", ".json", ".ndjson", ".parquet"}


def _supported(path: Path) -> bool:
    """Files picked up when a folder is given: the known text kinds (a named file may be anything)."""
    name = path.with_suffix("") if compression_of(path) else path
    return not path.name.startswith(".") and name.suffix.lower() in _FOLDER_SUFFIXES
