"""Input records as (line, JSON record, text): what dedup reads, keeps unchanged and writes back.

Inputs are what `optimize` reads (`llm.data.text`): local files or `s3://` objects,
.txt / .jsonl / .json (plain, .gz, .zst) and .parquet. A record is identified by
its input file and its line (a JSON array's element, a parquet row), counted from
1. A JSON Lines record is kept byte for byte; a .txt line becomes
`{"<text_column>": line}`; a JSON array element or a parquet row becomes its JSON
object. Blank records are not records (as for `optimize`): they are neither
counted nor written.
"""

from __future__ import annotations

import io
import json
import os
from collections.abc import Iterator
from pathlib import PurePath, PurePosixPath
from typing import BinaryIO

from llm.data.inputs.errors import InputError
from llm.data.inputs.listing import Input, compression_of, input_kind
from llm.data.inputs.readers import is_json_array, iter_parquet_rows, open_binary
from llm.data.inputs.records import decode_text, iter_json_array, object_text, record_text
from llm.data.storage.object_files import RemoteObject

READ_BUFFER = 1 << 20
Record = tuple[int, bytes, str]  # (line, the record as one JSON line without newline, its text)


def iter_input_records(path: Input, text_column: str, repairs: list[int] | None = None) -> Iterator[Record]:
    """Every non-blank record of one input, in file order; a malformed one names its file and line.

    `repairs`: a JSON Lines record read with a replacement (invalid UTF-8, lone surrogates) appends its line
    to it, so the scan can tell the write stage that every record's bytes are valid UTF-8 as they stand.
    """
    kind = input_kind(path)
    if kind == "parquet":
        for whole, row in iter_parquet_rows(path, None):
            text, _ = object_text(json.loads(whole), f"{path}: row {row}", text_column)
            if text.strip():
                yield row, whole.encode("utf-8"), text.strip()
        return
    if is_json_array(path):
        with open_binary(path) as f:
            for whole, element, _ in iter_json_array(f, path, None):
                if whole is None:
                    continue
                text, _ = object_text(json.loads(whole), f"{path}: element {element}", text_column)
                if text.strip():
                    yield element, whole.encode("utf-8"), text.strip()
        return
    with open_binary(path) as f:
        for line_no, line in enumerate(_buffered(f), start=1):
            if kind == "txt":
                text, _ = record_text(line, path, line_no, None, kind)
                if text is not None:
                    yield line_no, json.dumps({text_column: text}, ensure_ascii=False).encode("utf-8"), text
                continue
            text, replaced = record_text(line, path, line_no, text_column, kind)
            if text is None:
                continue
            raw = line.rstrip(b"\r\n")
            if replaced:  # invalid UTF-8 or lone surrogates: written as the text that was read
                raw = repaired(raw)
                if repairs is not None:
                    repairs.append(line_no)
            yield line_no, raw, text


def _buffered(f: BinaryIO) -> BinaryIO:
    """A plain local file read through a 1 MB buffer: its default (4 KB) is a read call every ~2 records."""
    return io.BufferedReader(f.raw, READ_BUFFER) if type(f) is io.BufferedReader else f


def repaired(raw: bytes) -> bytes:
    """A JSON line with invalid UTF-8 as the text the reader made of it (U+FFFD)."""
    value = json.loads(decode_text(raw)[0])
    return json.dumps(value, ensure_ascii=False).encode("utf-8", "replace")


def _input_name(path: Input) -> PurePath:
    return PurePosixPath(path.config.bucket, path.key) if isinstance(path, RemoteObject) else PurePath(path)


def output_names(inputs: list[Input]) -> list[str]:
    """The kept records' file of each input: its path below the inputs' common folder, ending in .jsonl.

    `a/b.jsonl.zst` -> `a/b.jsonl`, `c.txt` -> `c.jsonl`; objects keep `bucket/key`. Two inputs
    that would share a name (`x.txt` and `x.jsonl`) are refused.
    """
    local = [_input_name(p) for p in inputs if not isinstance(p, RemoteObject)]
    root = PurePath(_common(local)) if local else None
    names: dict[str, Input] = {}
    out = []
    for path in inputs:
        name = _input_name(path)
        rel = name if isinstance(path, RemoteObject) else name.relative_to(root)  # type: ignore[arg-type]
        if compression_of(path):
            rel = rel.with_suffix("")
        rel = rel.with_suffix(".jsonl") if rel.suffix.lower() != ".jsonl" else rel
        key = rel.as_posix()
        if key in names:
            raise InputError(f"{path}: its kept records would go to {key}, like those of {names[key]}; "
                             "rename one of them or deduplicate them in separate runs")
        names[key] = path
        out.append(key)
    return out


def _common(paths: list[PurePath]) -> str:
    parents = [str(p.parent) for p in paths]
    return os.path.commonpath(parents) if parents else ""


def describe(path: Input) -> str:
    """How the report names an input: its path, or its s3:// URL."""
    return path.url if isinstance(path, RemoteObject) else str(path)
