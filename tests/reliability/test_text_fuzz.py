"""Every reader fuzzed: malformed and cut JSON Lines / JSON arrays / gzip / zstd / parquet, invalid UTF-8,
NUL bytes, deep nesting, wrong types, empty files. Only the documented outcome is allowed: records, or one
`InputError` naming the file; a cut compressed or parquet file is always an error; memory stays bounded."""

from __future__ import annotations

import gzip
import io
import json
import tracemalloc

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from llm.data.inputs.readers import InputError
from llm.data.sources import LocalLineTextSource

KINDS = ["txt", "jsonl", "json", "txt.gz", "jsonl.gz", "jsonl.zst", "json.zst", "parquet"]
texts = st.text(st.characters(codec="utf-8", exclude_characters="\n\r"), max_size=40)
# lines that are not valid records: broken JSON, wrong types, NUL bytes, deep nesting, invalid UTF-8
odd_lines = st.sampled_from([
    b'{"text": 5}', b'{"text": null}', b'{"text": ["a"]}', b'{"txt": "a"}', b"[1, 2]", b'{"text": "a"',
    b'{"text": "\x00nul"}', b'{"text": "a\\u0000b"}', b"\x00\x00\x00", b'{"text": "\xff\xfe bad utf8"}',
    b"[" * 5000, b'{"a": ' + b"[" * 5000, b'{"text": "\\ud800 lone"}', b"\xef\xbb\xbf{}", b"",
])


def _encode(kind: str, records: list[str], odd: list[bytes]) -> bytes:
    lines = [json.dumps({"text": r}).encode() for r in records] if "json" in kind else [r.encode() for r in records]
    for i, line in enumerate(odd):
        lines.insert((i * 7) % (len(lines) + 1), line)
    if kind.startswith("json.") or kind == "json":
        raw = b"[" + b",".join(lines) + b"]"
    else:
        raw = b"\n".join(lines) + (b"\n" if lines else b"")
    if kind.endswith(".gz"):
        return gzip.compress(raw)
    if kind.endswith(".zst"):
        return zstandard.ZstdCompressor().compress(raw)
    if kind == "parquet":
        sink = io.BytesIO()
        pq.write_table(pa.table({"text": pa.array(records, pa.string())}), sink)
        return sink.getvalue()
    return raw


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    kind=st.sampled_from(KINDS),
    records=st.lists(texts, max_size=30),
    odd=st.lists(odd_lines, max_size=3),
    damage=st.sampled_from(["none", "cut", "flip", "nul", "zero"]),
    where=st.floats(0.0, 1.0),
)
def test_readers_give_records_or_one_sentence_naming_the_file(tmp_path_factory, kind, records, odd, damage, where):
    data = bytearray(_encode(kind, records, odd if kind != "parquet" else []))
    at = min(int(len(data) * where), max(len(data) - 1, 0))
    if damage == "cut":
        data = data[:at]
    elif damage == "flip" and data:
        data[at] ^= 0x5A
    elif damage == "nul":
        data[at:at] = b"\x00"
    elif damage == "zero":
        data = bytearray()
    path = tmp_path_factory.mktemp("fuzz") / f"input.{kind}"
    path.write_bytes(bytes(data))
    tracemalloc.start()
    try:
        got = list(LocalLineTextSource(path).iter_texts())
    except InputError as e:
        message = str(e)
        assert str(path) in message and "\n" not in message, message
        got = None
    finally:
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    assert peak < 64 << 20, peak  # a few KB of input never costs more than buffers
    compressed = kind.endswith((".gz", ".zst")) or kind == "parquet"
    if damage == "cut" and compressed and 0 < at < len(_encode(kind, records, odd if kind != "parquet" else [])):
        assert got is None, f"a cut {kind} file was read as complete"
    if got is not None:
        assert all(t == t.strip() and t for t in got)  # stripped, non-empty records only
        if damage == "none" and not odd:
            assert got == [r.strip() for r in records if r.strip()]


@pytest.mark.parametrize("kind", ["jsonl.gz", "jsonl.zst", "parquet"])
def test_every_cut_point_of_a_small_compressed_file_is_an_error(tmp_path, kind) -> None:
    full = _encode(kind, [f"record {i}" for i in range(40)], [])
    path = tmp_path / f"x.{kind}"
    for cut in range(1, len(full), max(1, len(full) // 97)):
        path.write_bytes(full[:cut])
        with pytest.raises(InputError, match=r"x\.") as info:
            list(LocalLineTextSource(path).iter_texts())
        assert str(path) in str(info.value)
