"""The orjson fast path of `record_text` gives exactly what the standard `json` path gives: text, flag or error."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llm.data.inputs import records
from llm.data.inputs.errors import InputError

pytest.importorskip("orjson")

TRICKY = [
    b'{"text": "plain"}\n',
    b'{"text": "  padded  "}\r\n',
    b'{"text": "   "}\n',  # blank after stripping: skipped
    b"\n",
    b"   \n",
    b'{"text": "\\ud800 lone high"}\n',
    b'{"text": "\\udc00 lone low"}\n',
    b'{"text": "\\ud83d\\ude00 pair"}\n',
    b'{"text": "a\xed\xa0\x80b"}\n',  # a surrogate encoded in UTF-8: json reads it, orjson refuses
    b'{"text": "bad \xff\xfe bytes"}\n',
    b'\xef\xbb\xbf{"text": "bom"}\n',
    b'{"text": NaN}\n',
    b'{"text": 123456789012345678901234567890}\n',  # orjson: a float, json: an int; both "a number"
    b'{"text": 1, "text": "last wins"}\n',
    b'{"text": "a\tb"}\n',  # a raw control character: invalid JSON for both
    b'{"text": "x"} trailing\n',
    b'{"other": "x"}\n',
    b'["text"]\n',
    b'"text"\n',
    b'{"text": null}\n',
    b'{"text": ["a"]}\n',
    b'{"text": "a\\u0000b"}\n',
    b'{"text": "\\u2028 separators \\u00a0"}\n',
    b"[" * 3000 + b"]" * 3000 + b"\n",  # deeper than either parser goes
]


def _both(line: bytes, text_column: str | None) -> tuple[object, object]:
    def run() -> object:
        try:
            return records.record_text(line, "in.jsonl", 7, text_column, "jsonl")
        except InputError as e:
            return ("error", str(e))

    fast = run()
    with pytest.MonkeyPatch.context() as m:
        m.setattr(records, "_fast_loads", None)
        slow = run()
    return fast, slow


@pytest.mark.parametrize("line", TRICKY)
@pytest.mark.parametrize("text_column", ["text", None])
def test_tricky_lines_read_the_same_with_and_without_orjson(line, text_column) -> None:
    fast, slow = _both(line, text_column)
    assert fast == slow


_TEXTS = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)) | st.sampled_from(["\ud800", "\udfff", "\x00"]),
                 max_size=40)


@settings(max_examples=300, deadline=None)
@given(text=_TEXTS, ascii_only=st.booleans(), extra=st.dictionaries(st.text(max_size=5), st.integers() | st.text(max_size=5),
                                                                  max_size=3),
       damage=st.sampled_from([b"", b"\xff", b"\xed\xa0\x80", b"\\"]))
def test_random_records_read_the_same_with_and_without_orjson(text, ascii_only, extra, damage) -> None:
    record = {**extra, "text": text}
    line = json.dumps(record, ensure_ascii=ascii_only).encode("utf-8", "surrogatepass")
    if damage:  # bytes that are not UTF-8, or an escape cut in two, inside the text
        cut = line.rindex(b'"', 0, len(line) - 1)
        line = line[:cut] + damage + line[cut:]
    fast, slow = _both(line + b"\n", "text")
    assert fast == slow


def test_a_well_formed_record_skips_the_standard_parser(monkeypatch) -> None:
    def refuse(*args, **kwargs):
        raise AssertionError("json.loads called")

    monkeypatch.setattr(records.json, "loads", refuse)
    assert records.record_text(b'{"text": " fast \\u00e9 "}\n', "in.jsonl", 1, "text", "jsonl") == ("fast \u00e9", False)


@pytest.mark.parametrize("line, problem", [
    (b'{"text": "a\tb"}\n', "Invalid control character at column 12"),  # json's own text ends in "at"
    (b'{"text": "cut', "Unterminated string starting at column 10"),  # a last line without its newline
    (b'{"text": }\n', "Expecting value at column 10"),
    (b'{"text" "x"}\n', "Expecting ':' delimiter at column 9"),
])
@pytest.mark.parametrize("fast", [True, False])
def test_a_bad_record_is_one_sentence_naming_file_line_and_column_once(line, problem, fast) -> None:
    with pytest.MonkeyPatch.context() as m:
        if not fast:
            m.setattr(records, "_fast_loads", None)
        with pytest.raises(InputError) as info:
            records.record_text(line, "in.jsonl", 7, "text", "jsonl")
    assert str(info.value) == f"in.jsonl:7: invalid JSON ({problem})"


def test_a_bad_element_of_a_json_array_has_no_dangling_at() -> None:
    import io

    with pytest.raises(InputError) as info:
        list(records.iter_json_array(io.BytesIO(b'[{"text": "a"}, {"text": "b\tc"}]'), "in.json", "text"))
    assert str(info.value) == "in.json: element 2: invalid JSON (Invalid control character)"
