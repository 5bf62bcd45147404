"""Raw input files to text records: .txt / .jsonl (plain, .gz, .zst) and .parquet, with one error style.

Invalid UTF-8 policy (the one used everywhere in `llm`): bytes that are not valid
UTF-8 are replaced by U+FFFD, the record is kept, and callers count it.
"""

from __future__ import annotations

import glob
import gzip
import io
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import BinaryIO

_KINDS = {".txt": "txt", ".text": "txt", ".jsonl": "jsonl", ".json": "jsonl", ".ndjson": "jsonl", ".parquet": "parquet"}
_COMPRESSIONS = (".gz", ".zst")


class InputError(ValueError):
    """A user's input file is unreadable or malformed; the message names file, line and key."""


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


def splittable(path: Path | str) -> bool:
    """Whether byte ranges of the file can be read alone: uncompressed line files only."""
    return compression_of(Path(path)) is None and input_kind(path) != "parquet"


def open_binary(path: Path | str) -> BinaryIO:
    """Open a file for reading bytes, decompressing .gz / .zst transparently."""
    path = Path(path)
    try:
        raw = open(path, "rb")  # noqa: SIM115 - returned to the caller, who closes it
    except OSError as e:
        raise InputError(f"{path}: cannot open input file ({e.strerror or e})") from None
    compression = compression_of(path)
    if compression == "gz":
        return gzip.GzipFile(fileobj=raw, mode="rb")  # type: ignore[return-value]
    if compression == "zst":
        import zstandard

        reader = zstandard.ZstdDecompressor().stream_reader(raw, closefd=True)
        return io.BufferedReader(reader, buffer_size=1 << 20)  # type: ignore[arg-type]
    return raw


def decode_text(raw: bytes) -> tuple[str, bool]:
    """Decode UTF-8; invalid bytes become U+FFFD. Returns (text, something_was_replaced)."""
    try:
        return raw.decode("utf-8"), False
    except UnicodeDecodeError:
        return raw.decode("utf-8", errors="replace"), True


def record_text(line: bytes, path: Path | str, line_no: int, text_column: str | None, kind: str) -> str | None:
    """One line of a .txt or .jsonl file to its stripped text, None for a blank record.

    `text_column=None` keeps a JSON record whole (its JSON text): fine-tuning reads
    instruction and chat records, not one text field.
    """
    if kind == "txt":
        text, _ = decode_text(line)
    else:
        if not line.strip():
            return None
        text = _json_text(line, path, line_no, text_column)
    text = text.strip()
    return text or None


def _json_text(line: bytes, path: Path | str, line_no: int, text_column: str | None) -> str:
    try:
        record = json.loads(line)
    except UnicodeDecodeError:
        record = json.loads(decode_text(line)[0])
    except json.JSONDecodeError as e:
        raise InputError(f"{path}:{line_no}: invalid JSON ({e.msg} at column {e.colno})") from None
    if not isinstance(record, dict):
        raise InputError(f"{path}:{line_no}: expected a JSON object, got {type(record).__name__}")
    if text_column is None:
        return json.dumps(record, ensure_ascii=False)
    if text_column not in record:
        keys = ", ".join(sorted(record)) or "none"
        raise InputError(f"{path}:{line_no}: missing text column {text_column!r} (keys: {keys}); set text_column (CLI: --text-column)")
    text = record[text_column]
    if not isinstance(text, str):
        raise InputError(f"{path}:{line_no}: column {text_column!r} is {type(text).__name__}, expected a string")
    return text


def iter_line_range(
    path: Path | str, text_column: str | None = "text", start: int = 0, end: int | None = None, resume: int = 0
) -> Iterator[tuple[str, int, bool]]:
    """Records of a .txt / .jsonl file as (text, byte offset after its line, utf8_replaced).

    Blank records are skipped. With a byte range [start, end) of an uncompressed
    file, yields exactly the lines that *start* inside it, so consecutive ranges
    cover every line once. `resume` > 0 is a byte offset where a line starts (a
    cursor): reading seeks there and nothing before it is read again.
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
                return
            line_start, pos = pos, pos + len(line)
            line_no = None if line_no is None else line_no + 1
            try:
                text = record_text(line, path, line_no or 0, text_column, kind)
            except InputError:
                if line_no is None:  # name the real line: count the lines before it, only now
                    record_text(line, path, line_number_at(path, line_start), text_column, kind)
                raise
            if text is not None:
                yield text, pos, kind == "txt" and "\ufffd" in text and _had_invalid(line)


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


def _had_invalid(line: bytes) -> bool:
    return decode_text(line)[1]


def _parquet_file(path: Path, text_column: str | None):
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        pf = pq.ParquetFile(path)
    except Exception as e:  # pyarrow raises several types for unreadable files
        raise InputError(f"{path}: cannot read parquet file ({e})") from None
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
    pf = _parquet_file(Path(path), text_column)
    groups = [row_group] if row_group is not None else list(range(pf.num_row_groups))
    row = 0
    for group in groups:
        columns = [text_column] if text_column is not None else None
        for batch in pf.iter_batches(columns=columns, batch_size=8192, row_groups=[group]):
            values = batch.column(0) if text_column is not None else _row_json(batch)
            n = len(values)
            if row + n <= offset:
                row += n
                continue
            for text in values if isinstance(values, list) else values.to_pylist():
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
        for text, _, replaced in iter_line_range(path, text_column):
            yield text, replaced


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
