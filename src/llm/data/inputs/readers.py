"""Raw input files to text records: .txt / .jsonl / .json (plain, .gz, .zst) and .parquet, with one error style.

Nothing on disk is trusted: a compressed stream must end where its format says
(`compressed.py`), a parquet file that pyarrow cannot decode is named with its
row group, a file that changes while it is read (`FileStamp`) is an error, and
so is an input that holds no record at all. The UTF-8 policy is `records.py`'s.
"""

from __future__ import annotations

import io
import json
import tempfile
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import BinaryIO

from llm.data.inputs.compressed import open_compressed
from llm.data.inputs.errors import InputError, one_line
from llm.data.inputs.listing import (
    FileStamp,
    Input,
    compression_of,
    expand_inputs,
    expand_sources,
    input_kind,
)
from llm.data.inputs.records import iter_json_array, record_text, starts_json_array
from llm.data.storage.object_files import RangedReader, RemoteObject, download, read_range

__all__ = ["FileStamp", "InputError", "expand_inputs", "expand_sources"]  # their old home: importers keep working

_PROBE = 4096  # bytes enough to tell a JSON array from JSON Lines
# Local files are read through a 256 KiB buffer, not Python's 8 KiB: with records of a few KB
# each `readline` otherwise refills the buffer (a read call and a copy) about once a line: 145 MB
# of ~7 KB records took 0.071 s of CPU to read by lines, 0.025 s with this buffer. A mixture holds
# one such buffer per source it has open.
_READ_BUFFER = 1 << 18


def is_json_array(path: Input) -> bool:
    """Whether a JSON input holds one JSON array (read element by element) rather than JSON Lines."""
    if input_kind(path) != "jsonl":
        return False
    if isinstance(path, RemoteObject):  # one small ranged GET, not the whole object
        return starts_json_array(io.BytesIO(_remote_head(path)))
    with open_binary(path, buffering=_PROBE) as f:  # its head only: every listed file is probed
        return starts_json_array(f)


def splittable(path: Input) -> bool:
    """Whether byte ranges of the file can be read alone: uncompressed line files only (not JSON arrays)."""
    return compression_of(path) is None and input_kind(path) != "parquet" and not is_json_array(path)


def _remote_head(obj: RemoteObject) -> bytes:
    """The first bytes of an object's content (decompressed as far as its first 64 KiB go)."""
    compression = compression_of(obj)
    raw = read_range(obj, 0, min(obj.size, _PROBE if compression is None else 16 * _PROBE)) if obj.size else b""
    try:
        if compression == "gz":
            return zlib.decompressobj(wbits=31).decompress(raw, _PROBE)
        if compression == "zst":
            import zstandard

            return zstandard.ZstdDecompressor().decompressobj().decompress(raw)[:_PROBE]
    except Exception:  # a damaged start: the full read says where and how
        return b""
    return raw


def _open_remote(obj: RemoteObject, end: int | None = None) -> BinaryIO:
    """An object opened like a file: ranged reads up to `end`, or downloaded whole when compressed.

    A compressed stream is checked and decoded like a local file (zstd frame headers are walked
    with seeks), so it is first downloaded to an unnamed temporary file, gone once closed.
    """
    compression = compression_of(obj)
    if compression is None:
        return RangedReader(obj, obj.size if end is None else end)  # type: ignore[return-value]
    tmp = tempfile.TemporaryFile(prefix="llm-text-")  # noqa: SIM115 - returned to the caller, who closes it
    try:
        download(obj, tmp)
        tmp.seek(0)
    except BaseException:
        tmp.close()
        raise
    return open_compressed(tmp, obj, compression)  # type: ignore[arg-type]


def _range_buffer(size: int) -> int:
    """The read buffer for a byte range of `size`: no bigger than the range (a small partition would
    otherwise read far past its end), no smaller than Python's default."""
    return max(io.DEFAULT_BUFFER_SIZE, min(_READ_BUFFER, size))


def open_binary(path: Input, buffering: int = _READ_BUFFER) -> BinaryIO:
    """Open a file for reading bytes, decompressing .gz / .zst, checked (a cut or damaged stream is an InputError).

    `buffering`: the local file's read buffer (a probe of the first bytes asks for a small one)."""
    if isinstance(path, RemoteObject):
        return _open_remote(path)
    path = Path(path)
    try:
        raw = open(path, "rb", buffering=buffering)  # noqa: SIM115 - returned to the caller, who closes it
    except OSError as e:
        raise InputError(f"{path}: cannot open input file ({e.strerror or e})") from None
    compression = compression_of(path)
    return open_compressed(raw, path, compression) if compression else raw



def iter_line_range(
    path: Input, text_column: str | None = "text", start: int = 0, end: int | None = None, resume: int = 0
) -> Iterator[tuple[str, int, bool]]:
    """Records of a .txt / .jsonl file as (text, byte offset after its line, utf8_replaced).

    Blank records are skipped. With a byte range [start, end) of an uncompressed
    file, yields exactly the lines that *start* inside it, so consecutive ranges
    cover every line once. `resume` > 0 is a byte offset where a line starts (a
    cursor): reading seeks there and nothing before it is read again (an object in
    storage is fetched from there: ranged GETs up to just past `end`). A file that
    ends before `end` has shrunk since the range was planned: an InputError.
    """
    kind = input_kind(path)
    remote = isinstance(path, RemoteObject)
    buffering = _READ_BUFFER if end is None else _range_buffer(end - max(start, resume))
    with RangedReader(path, end if end is not None else path.size) if remote else open_binary(path, buffering) as f:
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
    path: Input, text_column: str | None = "text", offset: int = 0, want: Callable[[int], bool] | None = None
) -> Iterator[tuple[str, int, bool]]:
    """A whole line file (any compression) or JSON array as (text, row number, utf8_replaced).

    Rows are lines (or array elements) counted from 1; rows up to `offset` and rows
    for which `want(row)` is false are skipped unparsed (a compressed file cannot seek).
    """
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


def line_number_at(path: Input, offset: int) -> int:
    """1-based number of the line starting at byte `offset` of an uncompressed file."""
    count, done = 0, 0
    with RangedReader(path, offset) if isinstance(path, RemoteObject) else open(path, "rb") as f:
        while done < offset:
            block = f.read(min(8 << 20, offset - done))
            if not block:
                break
            count += block.count(b"\n")
            done += len(block)
    return count + 1


def _parquet_file(path: Input, text_column: str | None):
    import pyarrow as pa
    import pyarrow.parquet as pq

    # an object is read by ranged GETs: the footer, then only the row groups asked for
    source = RangedReader(path) if isinstance(path, RemoteObject) else path
    try:
        pf = pq.ParquetFile(source, page_checksum_verification=True)  # pages written with CRCs are checked
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


def parquet_row_groups(path: Input, text_column: str | None = "text") -> int:
    """How many row groups a parquet file has (its text column checked first)."""
    return _parquet_file(path, text_column).num_row_groups


def _batches(pf, path: Input, text_column: str | None, group: int) -> Iterator:
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
    path: Input,
    text_column: str | None = "text",
    row_group: int | None = None,
    offset: int = 0,
    want: Callable[[int], bool] | None = None,
) -> Iterator[tuple[str, int]]:
    """Stripped, non-empty texts of one parquet column as (text, row number after it).

    Rows count from the start of `row_group` (the whole file when None); rows up
    to `offset` and rows for which `want(row)` is false are skipped unparsed.
    """
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


def iter_texts(path: Input, text_column: str = "text") -> Iterator[tuple[str, bool]]:
    """Every record of any supported input file as (text, utf8_replaced)."""
    if input_kind(path) == "parquet":
        for text, _ in iter_parquet_rows(path, text_column):
            yield text, False
    else:
        for text, _, replaced in iter_records(path, text_column):
            yield text, replaced


def require_records(paths: list, text_column: str = "text", hint: str = "check the input") -> None:
    """Raise unless some input yields a record (reads up to the first one only): empty input is a mistake."""
    for path in paths:
        for _ in iter_texts(path, text_column):
            return
    names = ", ".join(str(p) for p in paths[:5]) + (f" and {len(paths) - 5} more" if len(paths) > 5 else "")
    raise InputError(
        f"no records in {names}: every input file is empty or holds only blank records "
        f"(text column {text_column!r}); {hint}"
    )
