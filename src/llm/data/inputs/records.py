"""Bytes to text records: the UTF-8 policy, one JSON object per line, and whole JSON arrays.

Invalid UTF-8 policy (the one used everywhere in `llm`): bytes that are not valid
UTF-8, and JSON `\\uXXXX` escapes of lone surrogates (not text either), are replaced
by U+FFFD, the record is kept, and callers count it.
"""

from __future__ import annotations

import codecs
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

from llm.data.inputs.errors import InputError

try:  # optional (`pip install llm-stream-data[json]`): parses a JSON Lines record several times faster
    from orjson import loads as _fast_loads
except ImportError:  # pragma: no cover - the standard library does everything, only slower
    _fast_loads = None

_SURROGATE = re.compile("[\ud800-\udfff]")
_JSON_TYPES = {dict: "an object", list: "an array", str: "a string", int: "a number", float: "a number", bool: "a boolean"}
_ARRAY_READ = 1 << 16


def decode_text(raw: bytes) -> tuple[str, bool]:
    """Decode UTF-8; invalid bytes become U+FFFD. Returns (text, something_was_replaced)."""
    try:
        return raw.decode("utf-8"), False
    except UnicodeDecodeError:
        return raw.decode("utf-8", errors="replace"), True


def json_type(value: object) -> str:
    """A JSON value's type in JSON's words ('null', 'a number', ...)."""
    return "null" if value is None else _JSON_TYPES.get(type(value), type(value).__name__)


def record_text(
    line: bytes, path: Path | str, line_no: int, text_column: str | None, kind: str
) -> tuple[str | None, bool]:
    """One line of a .txt or .jsonl file to (stripped text or None when blank, utf8_replaced).

    `text_column=None` keeps a JSON record whole (its JSON text): fine-tuning reads
    instruction and chat records, not one text field.
    """
    if kind == "txt":
        text, replaced = decode_text(line)
    else:
        if _fast_loads is not None and text_column is not None:
            fast = _fast_text(line, text_column)
            if fast is not None:
                return fast or None, False
        if not line.strip():
            return None, False
        text, replaced = _decode_json(line, path, line_no)
        text, fixed = object_text(text, f"{path}:{line_no}", text_column)
        replaced = replaced or fixed
    text = text.strip()
    return text or None, replaced


def _fast_text(line: bytes, text_column: str) -> str | None:
    """The stripped text column of a well-formed record through orjson; None: take the full path.

    When orjson accepts a line, `json` reads the same string from it: orjson refuses what the
    policy above replaces (invalid UTF-8, lone surrogates escaped or encoded) and what only
    `json` takes (NaN, a BOM), and the full path then gives the same text, error or replacement.
    Numbers may differ (a huge integer becomes a float in orjson), so only a string column is
    taken from here, and only when a text column is asked for (not the whole record).
    """
    try:
        record = _fast_loads(line)
    except ValueError:  # orjson.JSONDecodeError, a blank line included
        return None
    if type(record) is not dict:
        return None
    text = record.get(text_column)
    return text.strip() if type(text) is str else None


def json_problem(e: json.JSONDecodeError, column: bool = True) -> str:
    """json's message, with the column once: some of its messages end in "at" and leave the
    position to be added ("Unterminated string starting at", "Invalid control character at")."""
    message = e.msg.removesuffix(" at")
    return f"{message} at column {e.colno}" if column else message


def _decode_json(line: bytes, path: Path | str, line_no: int) -> tuple[object, bool]:
    try:
        try:
            return json.loads(line), False
        except UnicodeDecodeError:
            text, replaced = decode_text(line)
            return json.loads(text), replaced
    except json.JSONDecodeError as e:
        raise InputError(f"{path}:{line_no}: invalid JSON ({json_problem(e)})") from None
    except RecursionError:
        raise InputError(f"{path}:{line_no}: JSON nested too deeply to read") from None


def object_text(record: object, at: str, text_column: str | None) -> tuple[str, bool]:
    """The text column of one JSON record as (text, lone_surrogates_replaced); `at` names file and line.

    With `text_column=None` the whole object, as JSON text.
    """
    if text_column is None:
        if not isinstance(record, dict):
            raise InputError(f"{at}: expected a JSON object (a whole record), got {json_type(record)}")
        text = json.dumps(record, ensure_ascii=False)
        if _SURROGATE.search(text):
            return _SURROGATE.sub("\ufffd", text), True
        return text, False
    if not isinstance(record, dict):
        raise InputError(f"{at}: expected a JSON object with a {text_column!r} key, got {json_type(record)}")
    if text_column not in record:
        keys = ", ".join(sorted(record)) or "none"
        raise InputError(f"{at}: missing text column {text_column!r} (keys: {keys}); set text_column (CLI: --text-column)")
    text = record[text_column]
    if not isinstance(text, str):
        raise InputError(f"{at}: column {text_column!r} is {json_type(text)}, expected a string")
    if _SURROGATE.search(text):  # "\ud800" escapes decode to lone surrogates, which no encoder takes
        return _SURROGATE.sub("\ufffd", text), True
    return text, False


def starts_json_array(f: BinaryIO) -> bool:
    """Whether a stream's first non-blank byte is '[' (a JSON array, not JSON Lines); rewinds nothing."""
    head = f.read(4096).lstrip(b"\xef\xbb\xbf \t\r\n")
    return head.startswith(b"[")


def iter_json_array(f: BinaryIO, path: Path | str, text_column: str | None) -> Iterator[tuple[str | None, int, bool]]:
    """Elements of a JSON array of objects as (stripped text or None, element number, replaced).

    Parsed one element at a time (memory: one element plus a read buffer), so a big
    array is never loaded whole. Errors name the element: `file:element N`.
    """
    decoder = json.JSONDecoder()
    utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")
    buf, pos, n, eof, opened = "", 0, 0, False, False

    def more() -> bool:
        nonlocal buf, pos, eof
        if eof:
            return False
        chunk = f.read(max(_ARRAY_READ, len(buf) - pos))  # doubling: a big element is re-parsed O(log n) times
        eof = not chunk
        buf = buf[pos:] + utf8.decode(chunk, final=eof)
        pos = 0
        return True

    def skip_blank() -> str:
        nonlocal pos
        while True:
            while pos < len(buf) and buf[pos] in " \t\r\n\ufeff":
                pos += 1
            if pos < len(buf):
                return buf[pos]
            if not more():
                return ""

    while True:
        c = skip_blank()
        if not opened:
            if c != "[":
                raise InputError(f"{path}: expected a JSON array, found {c!r}")
            opened, pos = True, pos + 1
            if skip_blank() == "]":
                pos += 1
                break
            c = skip_blank()
        if c == "":
            raise InputError(f"{path}: element {n + 1}: the JSON array ends before its closing ']'")
        while True:
            try:
                record, end = decoder.raw_decode(buf, pos)
                break
            except json.JSONDecodeError as e:
                if not more():
                    # a column of the read buffer would not be the file's: the element is named instead
                    raise InputError(f"{path}: element {n + 1}: invalid JSON ({json_problem(e, column=False)})") from None
            except RecursionError:
                raise InputError(f"{path}: element {n + 1}: JSON nested too deeply to read") from None
        n, pos = n + 1, end
        text, replaced = object_text(record, f"{path}: element {n}", text_column)
        yield text.strip() or None, n, replaced or "\ufffd" in text
        c = skip_blank()
        if c == "]":
            pos += 1
            break
        if c != ",":
            where = "ends before its closing ']'" if c == "" else f"has {c!r} where ',' or ']' belongs"
            raise InputError(f"{path}: element {n}: the JSON array {where}")
        pos += 1
    if skip_blank():
        raise InputError(f"{path}: unexpected data after the JSON array's closing ']'")
