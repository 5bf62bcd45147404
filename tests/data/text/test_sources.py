"""Sources: partitions cover every record once, offsets resume, errors name file/line/key."""

from __future__ import annotations

import gzip
import json
import os

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from llm.data.inputs.readers import InputError, is_json_array
from llm.data.sources import (
    STRIPES,
    HFStreamTextSource,
    LocalLineTextSource,
    Partition,
    TextSource,
    assign_partitions,
    stripe_partitions,
    validate_source_fingerprint,
)


def _all_records(source, parts=None):
    return [r for p in (parts or source.partitions()) for r in source.iter_partition(p)]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    lines=st.lists(st.text(st.characters(codec="utf-8", exclude_characters="\n\r"), max_size=30), max_size=40),
    partition_bytes=st.integers(1, 64),
)
def test_byte_ranges_cover_every_line_once(tmp_path_factory, lines, partition_bytes):
    path = tmp_path_factory.mktemp("ranges") / "lines.txt"
    path.write_bytes("".join(line + "\n" for line in lines).encode())
    source = LocalLineTextSource(path, partition_bytes=partition_bytes)
    parts = source.partitions()
    assert len(parts) == max(1, -(-path.stat().st_size // partition_bytes))
    got = [text for text, _, _ in _all_records(source)]
    assert got == [line.strip() for line in lines if line.strip()]


def test_offsets_resume_inside_a_partition(tmp_path):
    path = tmp_path / "a.jsonl"
    path.write_text("".join(json.dumps({"text": f"doc {i}", "n": i}) + "\n" for i in range(50)))
    source = LocalLineTextSource(path, partition_bytes=300)
    for part in source.partitions():
        records = list(source.iter_partition(part))
        for k, (_, after, _) in enumerate(records):
            assert list(source.iter_partition(part, after)) == records[k + 1 :]


@pytest.mark.parametrize("suffix", [".txt.gz", ".jsonl.zst"])
def test_compressed_files_are_one_partition_resumed_by_line_count(tmp_path, suffix):
    lines = [f"line {i}" for i in range(30)]
    if suffix.startswith(".jsonl"):
        import zstandard

        raw = "".join(json.dumps({"text": t}) + "\n" for t in lines).encode()
        data = zstandard.ZstdCompressor().compress(raw)
    else:
        data = gzip.compress(("\n".join(lines) + "\n").encode())
    path = tmp_path / f"c{suffix}"
    path.write_bytes(data)
    source = LocalLineTextSource(path)
    [part] = source.partitions()
    assert [t for t, _, _ in source.iter_partition(part, 25)] == lines[25:]
    assert list(source.iter_texts(skip=28)) == lines[28:]


def test_parquet_row_groups_are_partitions(tmp_path):
    texts = [f"row {i}" if i % 7 else "  " for i in range(100)]
    path = tmp_path / "t.parquet"
    pq.write_table(pa.table({"body": texts}), path, row_group_size=30)
    source = LocalLineTextSource(path, text_column="body")
    parts = source.partitions()
    assert len(parts) == 4
    assert [t for t, _, _ in _all_records(source)] == [t for t in texts if t.strip()]
    records = list(source.iter_partition(parts[1]))
    assert list(source.iter_partition(parts[1], records[3][1])) == records[4:]
    with pytest.raises(InputError, match="missing text column 'text'"):
        _all_records(LocalLineTextSource(path))


def test_folder_and_glob_inputs(tmp_path):
    (tmp_path / "b.txt").write_text("b1\nb2\n")
    (tmp_path / "a.txt").write_text("a1\n")
    assert list(LocalLineTextSource(tmp_path).iter_texts()) == ["a1", "b1", "b2"]
    assert list(LocalLineTextSource(str(tmp_path / "b*.txt")).iter_texts()) == ["b1", "b2"]
    with pytest.raises(InputError, match="no files match"):
        LocalLineTextSource(str(tmp_path / "z*.txt"))


def test_bad_json_and_missing_key_name_file_and_line(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"text": "ok"}\n{"txt": "no"}\n')
    with pytest.raises(InputError, match=r"bad.jsonl:2: missing text column 'text' \(keys: txt\)"):
        list(LocalLineTextSource(path).iter_texts())
    path.write_text('{"text": "ok"}\n{"text": broken\n')
    with pytest.raises(InputError, match="bad.jsonl:.*invalid JSON"):
        list(LocalLineTextSource(path).iter_texts())


def test_fingerprints_change_with_the_stream(tmp_path):
    path = tmp_path / "a.jsonl"
    path.write_text('{"text": "x", "body": "y"}\n')
    a = LocalLineTextSource(path).source_fingerprint()
    assert a["type"] == "local" and a["files"] == ["a.jsonl"]
    assert a != LocalLineTextSource(path, text_column="body").source_fingerprint()
    path.write_text('{"text": "xx", "body": "y"}\n')
    assert a != LocalLineTextSource(path).source_fingerprint()
    hf = HFStreamTextSource("json", None, "train", "text", data_files=str(path)).source_fingerprint()
    assert hf["type"] == "hf" and hf != HFStreamTextSource("json", None, "test", "text").source_fingerprint()


def test_hf_streaming_source_from_local_files(tmp_path):
    for k in range(3):
        (tmp_path / f"p{k}.jsonl").write_text("".join(json.dumps({"text": f"{k}-{i}"}) + "\n" for i in range(10)))
    source = HFStreamTextSource("json", None, "train", "text", data_files=str(tmp_path / "p*.jsonl"))
    parts = source.partitions()
    assert len(parts) == 3
    got = sorted(t for t, _, _ in _all_records(source))
    assert got == sorted(f"{k}-{i}" for k in range(3) for i in range(10))
    assert [t for t, _, _ in source.iter_partition(parts[1], 7)] == ["1-7", "1-8", "1-9"]
    bad = HFStreamTextSource("json", None, "train", "body", data_files=str(tmp_path / "p0.jsonl"))
    with pytest.raises(InputError, match="missing text column 'body'"):
        _all_records(bad)


@given(
    kinds=st.lists(st.booleans(), max_size=12), world=st.integers(1, 4), workers=st.integers(1, 4)
)
def test_assignment_is_disjoint_and_complete(kinds, world, workers):
    # True: a byte range (whole); False: a row-offset partition (cut into stripes)
    parts = stripe_partitions([Partition(f"p{i}", seekable=k) for i, k in enumerate(kinds)])
    assert len(parts) == sum(1 if k else STRIPES for k in kinds)
    consumers = world * workers
    owned = [assign_partitions(parts, c, consumers) for c in range(consumers)]
    flat = [p for o in owned for p in o]
    assert sorted(p.key for p in flat) == sorted(p.key for p in parts)  # disjoint and complete
    groups = {p.group for p in parts}
    if len(groups) >= consumers:  # enough groups: nobody reads a file or shard another one reads
        readers = [{p.group for p in o} for o in owned]
        assert sum(len(r) for r in readers) == len(groups)


def test_stripes_split_rows_without_overlap(tmp_path):
    path = tmp_path / "c.txt.gz"
    path.write_bytes(gzip.compress("".join(f"r{i}\n" for i in range(1, 30)).encode()))
    source = LocalLineTextSource(path)
    stripes = stripe_partitions(source.partitions())
    assert [p.key for p in stripes][:2] == ["00000:c.txt.gz/s0of8", "00000:c.txt.gz/s1of8"]
    rows = [[t for t, r, _ in source.iter_partition(stripes[0], 0, p.owns_row) if p.owns_row(r)] for p in stripes]
    assert rows[0] == ["r1", "r9", "r17", "r25"] and rows[7] == ["r8", "r16", "r24"]
    assert sorted(t for r in rows for t in r) == sorted(f"r{i}" for i in range(1, 30))


def test_custom_source_needs_only_two_methods():
    class Lines(TextSource):
        def iter_texts(self, skip=0):
            yield from ["a", "b", "c"][skip:]

        def source_fingerprint(self):
            return {"type": "lines"}

    source = Lines()
    [part] = source.partitions()
    assert list(source.iter_partition(part, 1)) == [("b", 2, None), ("c", 3, None)]


@pytest.mark.parametrize("name", ["rows.csv", "script.py", "NOTES", "data.log.gz"])
def test_any_other_file_is_one_record_per_line(tmp_path, name):
    lines = ["a,b,c", "  ", "x = 1", "last line"]
    raw = ("\n".join(lines) + "\n").encode()
    path = tmp_path / name
    path.write_bytes(gzip.compress(raw) if name.endswith(".gz") else raw)
    source = LocalLineTextSource(path)
    assert list(source.iter_texts()) == ["a,b,c", "x = 1", "last line"]


def test_a_folder_picks_up_text_kinds_only(tmp_path):
    (tmp_path / "a.txt").write_text("one\n")
    (tmp_path / "b.jsonl").write_text('{"text": "two"}\n')
    (tmp_path / "image.png").write_bytes(b"\x89PNG\r\n")
    (tmp_path / ".hidden.txt").write_text("never\n")
    assert sorted(LocalLineTextSource(tmp_path).iter_texts()) == ["one", "two"]


@pytest.mark.parametrize("values", [[1, 2, 3], [b"x", b"y", b"z"]])
def test_parquet_column_of_the_wrong_type_is_named(tmp_path, values):
    path = tmp_path / "t.parquet"
    pq.write_table(pa.table({"text": values}), path)
    with pytest.raises(InputError, match=r"t.parquet: column 'text' is .*, expected a string column"):
        list(LocalLineTextSource(path).iter_texts())


def test_the_frameworks_names_and_fingerprints(tmp_path):
    path = tmp_path / "a.txt"
    path.write_text("x\n")
    local = LocalLineTextSource(dataset_path=str(path))
    assert local.dataset_path == str(path) and local.source_fingerprint()["dataset_path"] == str(path)
    hf = HFStreamTextSource(dataset_name="allenai/c4", dataset_config="en", split="validation", text_column="t")
    assert (hf.dataset_name, hf.dataset_config, hf.split, hf.text_column) == ("allenai/c4", "en", "validation", "t")
    fp = hf.source_fingerprint()
    assert (fp["type"], fp["dataset_name"], fp["dataset_config"]) == ("hf", "allenai/c4", "en")


def test_validate_source_fingerprint_names_what_differs():
    saved = {"type": "dedup", "inner": {"dataset_name": "a", "dataset_config": "en"}, "hash_algo": "sha256"}
    validate_source_fingerprint(saved, dict(saved))
    current = {**saved, "inner": {"dataset_name": "b", "dataset_config": "en"}}
    with pytest.raises(ValueError, match=r"^stream source fingerprint mismatch: inner.dataset_name: 'a' -> 'b' \(saved -> current\)"):
        validate_source_fingerprint(saved, current)


def _reads() -> tuple[int, int]:
    """(bytes, read calls) of this thread so far (Linux's per-thread I/O counters)."""
    with open("/proc/thread-self/io") as f:
        fields = dict(line.split(": ") for line in f.read().splitlines())
    return int(fields["rchar"]), int(fields["syscr"])


@pytest.mark.skipif(not os.path.exists("/proc/thread-self/io"), reason="counts reads with Linux's per-thread I/O counters")
def test_reads_take_large_blocks_but_never_far_past_what_they_need(tmp_path):
    """A pass reads ~7 KB records in 256 KiB blocks, not a buffer refill per line; listing probes only
    each file's head; a small byte-range partition reads about itself, not a whole block past its end."""
    path = tmp_path / "big.jsonl"
    path.write_text("".join(json.dumps({"text": f"{i} " + "w" * 7000}) + "\n" for i in range(600)))  # ~4.2 MB
    size = path.stat().st_size
    bytes0, _ = _reads()
    assert not is_json_array(path)
    assert _reads()[0] - bytes0 <= 8192

    whole = LocalLineTextSource([str(path)], partition_bytes=size)
    _, calls0 = _reads()
    assert [int(text.split()[0]) for text, _, _ in _all_records(whole)] == list(range(600))
    calls = _reads()[1] - calls0
    assert calls < 40, calls  # 4.2 MB in 256 KiB blocks: ~17 reads (in 8 KiB blocks: ~530)

    pieces = LocalLineTextSource([str(path)], partition_bytes=64 << 10)  # 66 partitions of 64 KiB
    bytes0, _ = _reads()
    assert [int(text.split()[0]) for text, _, _ in _all_records(pieces)] == list(range(600))
    read = _reads()[0] - bytes0
    assert read < 2.2 * size, read / size  # each range's own bytes and the block its last line runs into
