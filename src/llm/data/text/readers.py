"""Raw input files to text records: .txt / .jsonl (plain, .gz, .zst) and .parquet, with one error style.

Invalid UTF-8 policy (the one used everywhere in `llm`): bytes that are not valid
UTF-8 are replaced by U+FFFD, the record is kept, and callers count it.
"""

from __future__ import annotations

import glob
import gzip
import io
import json
from collections.abc import Iterator
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
    """'txt', 'jsonl' or 'parquet', from the file name (compression suffix ignored)."""
    path = Path(path)
    name = path.with_suffix("") if compression_of(path) else path
    kind = _KINDS.get(name.suffix.lower())
    if kind is None:
        raise InputError(
            f"{path}: unsupported input type {name.suffix or '(none)'!r}; "
            "expected .txt, .jsonl (optionally .gz/.zst) or .parquet"
        )
    return kind


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


def record_text(line: bytes, path: Path | str, line_no: int, text_column: str, kind: str) -> str | None:
    """One line of a .txt or .jsonl file to its stripped text, None for a blank record."""
    if kind == "txt":
        text, _ = decode_text(line)
    else:
        if not line.strip():
            return None
        text = _json_text(line, path, line_no, text_column)
    text = text.strip()
    return text or None


def _json_text(line: bytes, path: Path | str, line_no: int, text_column: str) -> str:
    try:
        record = json.loads(line)
    except UnicodeDecodeError:
        record = json.loads(decode_text(line)[0])
    except json.JSONDecodeError as e:
        raise InputError(f"{path}:{line_no}: invalid JSON ({e.msg} at column {e.colno})") from None
    if not isinstance(record, dict):
        raise InputError(f"{path}:{line_no}: expected a JSON object, got {type(record).__name__}")
    if text_column not in record:
        keys = ", ".join(sorted(record)) or "none"
        raise InputError(f"{path}:{line_no}: missing text column {text_column!r} (keys: {keys}); set text_column (CLI: --text-column)")
    text = record[text_column]
    if not isinstance(text, str):
        raise InputError(f"{path}:{line_no}: column {text_column!r} is {type(text).__name__}, expected a string")
    return text


def iter_line_records(
    path: Path | str, text_column: str = "text", start: int = 0, end: int | None = None
) -> Iterator[tuple[str, bool]]:
    """Records of a .txt / .jsonl file as (text, utf8_replaced); blank records skipped.

    With a byte range [start, end) of an uncompressed file, yields exactly the
    lines that *start* inside it, so consecutive ranges cover every line once.
    """
    path = Path(path)
    kind = input_kind(path)
    with open_binary(path) as f:
        if start > 0:
            f.seek(start - 1)
            f.readline()  # finish the line that started before `start`: it belongs to the previous range
        pos = f.tell()
        line_no = 0
        while end is None or pos < end:
            line = f.readline()
            if not line:
                break
            line_no += 1
            try:
                text = record_text(line, path, line_no, text_column, kind)
            except InputError:
                if start == 0:
                    raise
                # Mid-file range: count the lines before it only now, on the error path.
                record_text(line, path, line_number_at(path, pos), text_column, kind)
                raise
            pos += len(line)
            if text is not None:
                yield text, kind == "txt" and "\ufffd" in text and _had_invalid(line)


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


def iter_parquet_texts(path: Path | str, text_column: str = "text") -> Iterator[str]:
    """Stripped, non-empty texts of one parquet column, read a row group batch at a time."""
    import pyarrow.parquet as pq

    path = Path(path)
    try:
        pf = pq.ParquetFile(path)
    except Exception as e:  # pyarrow raises several types for unreadable files
        raise InputError(f"{path}: cannot read parquet file ({e})") from None
    names = pf.schema_arrow.names
    if text_column not in names:
        raise InputError(f"{path}: missing text column {text_column!r} (columns: {', '.join(names)}); set text_column (CLI: --text-column)")
    for batch in pf.iter_batches(columns=[text_column], batch_size=8192):
        for text in batch.column(0).to_pylist():
            if isinstance(text, str) and text.strip():
                yield text.strip()


def iter_texts(path: Path | str, text_column: str = "text") -> Iterator[tuple[str, bool]]:
    """Every record of any supported input file as (text, utf8_replaced)."""
    if input_kind(path) == "parquet":
        for text in iter_parquet_texts(path, text_column):
            yield text, False
    else:
        yield from iter_line_records(path, text_column)


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
        for match in matches:
            input_kind(match)  # reject unsupported types early, naming the file
        found.extend(matches)
    return sorted(dict.fromkeys(p.resolve() for p in found))


def _supported(path: Path) -> bool:
    try:
        input_kind(path)
        return True
    except InputError:
        return False
