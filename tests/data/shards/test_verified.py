"""Remembered verification: a shard this machine hashed is not hashed again, unless it changed in any way."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time

import numpy as np
import pytest

from llm.data import StreamingDataset, TokensLoader, optimize
from llm.data.shards.format import reader as reader_module
from llm.data.shards.format import verified, verified_index
from llm.data.shards.format.reader import ShardError


@pytest.fixture()
def store(tmp_path, monkeypatch):
    monkeypatch.setenv("LLM_CACHE_DIR", str(tmp_path / "cache"))
    return verified.store_path(tmp_path / "ds" / "shard.bin")  # the store of the dataset below


@pytest.fixture()
def dataset(tmp_path):
    out = tmp_path / "ds"
    optimize(lambda i: np.arange(i, i + 500, dtype=np.int64), list(range(40)), str(out), chunk_bytes="8KB",
             num_workers=0, progress=False, item_loader=TokensLoader())
    time.sleep(0.06)  # older than the quiet window: these files may be remembered
    return out


def read_all(path, **kw) -> np.ndarray:
    ds = StreamingDataset(str(path), item_loader=TokensLoader(block_size=100), **kw)
    return ds.read_blocks(np.arange(len(ds)))["input_ids"]


def count_hashes(monkeypatch) -> list[str]:
    calls: list[str] = []
    real = reader_module.checksum_file

    def spy(path, *a, **kw):
        calls.append(str(path))
        return real(path, *a, **kw)

    monkeypatch.setattr(reader_module, "checksum_file", spy)
    return calls


def test_a_shard_verified_by_another_process_is_not_hashed_again(store, dataset, monkeypatch):
    code = ("import sys, numpy as np; from llm.data import StreamingDataset, TokensLoader; "
            "ds = StreamingDataset(sys.argv[1], item_loader=TokensLoader(block_size=100)); "
            "ds.read_blocks(np.arange(len(ds)))")
    store.unlink()  # forget what optimize recorded: the other process hashes and remembers
    subprocess.run([sys.executable, "-c", code, str(dataset)], check=True, env=os.environ.copy())
    shards = len(list(dataset.glob("shard-*.bin")))
    lines = store.read_text().splitlines()
    assert shards > 3 and len([line for line in lines if " xxh3_64:" in line]) == shards
    assert len([line for line in lines if " xxh3_128:" in line]) == 1  # index.json's digest, by its identity
    verified._stores.clear()  # this process reads the store afresh, as a restarted run would
    calls = count_hashes(monkeypatch)
    first = read_all(dataset)
    assert calls == []
    assert (read_all(dataset, verify_checksums="always") == first).all()
    assert len(calls) == shards  # "always" hashes every shard regardless


@pytest.mark.parametrize("restore_mtime", [False, True])
def test_a_shard_changed_after_it_was_remembered_is_hashed_and_refused(store, dataset, restore_mtime):
    read_all(dataset)
    shard = sorted(dataset.glob("shard-*.bin"))[1]
    stat = os.stat(shard)
    data = bytearray(shard.read_bytes())
    data[10] ^= 0xFF  # same size, one byte flipped
    shard.write_bytes(bytes(data))
    if restore_mtime:  # even with its mtime set back: the ctime moved
        os.utime(shard, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    with pytest.raises(ShardError, match=f"shard {shard} fails its checksum"):
        read_all(dataset)


def test_shards_optimize_wrote_are_not_hashed_by_readers_on_this_machine(store, dataset, monkeypatch):
    calls = count_hashes(monkeypatch)
    read_all(dataset)
    assert calls == []


def test_a_file_changed_within_the_quiet_window_is_not_remembered(store, tmp_path):
    path = tmp_path / "fresh.bin"
    path.write_bytes(b"x" * 100)
    verified.remember(path, "xxh3_64:1", verified.identity(path))  # changed just now: not kept
    assert not verified.is_verified(path, "xxh3_64:1")
    time.sleep(0.06)
    verified.remember(path, "xxh3_64:1", verified.identity(path))
    assert verified.is_verified(path, "xxh3_64:1") and not verified.is_verified(path, "xxh3_64:2")


def test_switched_off_and_torn_lines(store, dataset, monkeypatch):
    monkeypatch.setenv("LLM_REMEMBER_VERIFIED", "0")
    store.unlink()
    read_all(dataset)
    assert not store.exists()
    monkeypatch.delenv("LLM_REMEMBER_VERIFIED")
    store.parent.mkdir(parents=True, exist_ok=True)
    store.write_text("garbage line\n1 2 3\n")  # a foreign or torn line is skipped
    verified._stores.clear()
    calls = count_hashes(monkeypatch)
    read_all(dataset)
    assert len(calls) == len(list(dataset.glob("shard-*.bin")))


def test_a_bad_verify_checksums_value_is_refused(dataset):
    with pytest.raises(ValueError, match="verify_checksums must be True, False or 'always', got 'yes'"):
        StreamingDataset(str(dataset), item_loader=TokensLoader(block_size=4), verify_checksums="yes")


def test_an_unchanged_manifest_is_cross_checked_once_an_edited_one_again(store, dataset, monkeypatch):
    from llm.data.shards.format import manifest as manifest_module
    from llm.data.shards.format.manifest import Manifest
    from llm.data.shards.format.validate import ManifestError

    checks: list[str] = []
    real = manifest_module.check_manifest
    monkeypatch.setattr(manifest_module, "check_manifest", lambda data, path: (checks.append(str(path)), real(data, path))[1])
    index = dataset / "index.json"
    before = Manifest.load(dataset)
    assert len(checks) == 1  # optimize's own write is not trusted: the first open checks
    again = Manifest.load(dataset)
    assert len(checks) == 1 and again.fingerprint() == before.fingerprint()  # same bytes: not checked again
    # A count that no longer matches the shard's size: new bytes, so checked again, and refused.
    good = index.read_text()
    data = json.loads(good)
    data["shards"][0]["tokens"] -= 1
    index.write_text(json.dumps(data, indent=1))
    for _ in range(2):  # a refused manifest is never remembered
        with pytest.raises(ManifestError, match="index.json"):
            Manifest.load(dataset)
    assert len(checks) == 3
    monkeypatch.setenv("LLM_REMEMBER_VERIFIED", "0")  # the opt-out covers manifests too
    index.write_text(good)
    Manifest.load(dataset)
    Manifest.load(dataset)
    assert len(checks) == 5


def test_lookups_by_search_and_after_the_store_is_parsed_agree(store, monkeypatch):
    # The first lookups search the store's bytes (no parse of 10^4 lines for a first batch);
    # later ones use the parsed dict: both must answer the same, the last line of an identity winning.
    keys = [(2049, i, 4096 + i, 10**18 + i, 10**18 + 2 * i) for i in range(300)]
    lines = [" ".join(map(str, k)) + f" xxh3_64:{i}" for i, k in enumerate(keys)]
    lines += ["torn 1 2", " ".join(map(str, keys[7])) + " xxh3_64:new", "1 2 3 4"]
    store.parent.mkdir(parents=True, exist_ok=True)
    store.write_text("\n".join(lines) + "\n" + " ".join(map(str, keys[8])) + " xxh3_64:half")  # no newline: torn
    monkeypatch.setattr(verified, "_PARSE_AFTER", 100)
    verified._stores.clear()
    answers = [verified._entries(store).get(k) for k in keys]
    assert verified._entries(store).parsed is not None  # past 100 lookups: parsed
    verified._stores.clear()
    assert answers == [verified._entries(store).get(k) for k in keys]
    expected = [f"xxh3_64:{i}" for i in range(300)]
    expected[7] = "xxh3_64:new"
    assert answers == expected and verified._entries(store).get((2049, 1, 2, 3, 4)) is None
    assert verified._entries(store).get((2049, 999, 1, 1, 1)) is None


def test_a_store_of_duplicates_is_compacted_and_still_answers(store, monkeypatch):
    monkeypatch.setattr(verified, "_MAX_BYTES", 2000)
    store.parent.mkdir(parents=True, exist_ok=True)
    key = (1, 2, 3, 4, 5)
    store.write_text("".join(f"1 2 3 4 5 xxh3_64:{i}\n" for i in range(200)))  # one identity, 200 times
    verified._stores.clear()
    assert verified._entries(store).get(key) == "xxh3_64:199"
    assert store.read_text() == "1 2 3 4 5 xxh3_64:199\n"


def test_a_store_of_unique_entries_is_not_parsed_by_a_new_process(store, monkeypatch):
    """optimize remembers every shard it wrote: a fresh process must not parse 10^5 unique lines to learn that."""
    monkeypatch.setattr(verified, "_MAX_BYTES", 2000)
    store.parent.mkdir(parents=True, exist_ok=True)
    lines = "".join(f"1 {i} 3 4 5 xxh3_64:{i:016x}\n" for i in range(200))  # 200 identities, once each
    store.write_text(lines)
    parses = []
    real = verified._parse
    monkeypatch.setattr(verified, "_parse", lambda raw: (parses.append(len(raw)), real(raw))[1])
    verified._stores.clear()  # no identity twice: found so in one C pass (verified_index.all_distinct), not parsed
    assert verified._entries(store).get((1, 7, 3, 4, 5)) == f"xxh3_64:{7:016x}" and len(parses) == 0
    assert int(store.with_name(f"{store.name}.unique").read_text()) == len(lines)
    verified._stores.clear()  # a new process
    assert verified._entries(store).get((1, 9, 3, 4, 5)) == f"xxh3_64:{9:016x}" and len(parses) == 0
    assert store.read_text() == lines  # nothing to compact: left as it was
    store.write_text(lines * 3)  # duplicates beyond twice the unique size: compacted again
    verified._stores.clear()
    assert verified._entries(store).get((1, 9, 3, 4, 5)) == f"xxh3_64:{9:016x}" and len(parses) == 1
    assert store.read_text() == lines


def _lines(keys, values) -> str:
    return "".join(" ".join(map(str, k)) + f" {v}\n" for k, v in zip(keys, values))


def test_a_large_store_is_indexed_and_a_new_process_reads_only_the_lines_past_the_index(store, monkeypatch):
    """10^5 shards leave 10^5 lines: a new process maps their sorted index instead of searching them all."""
    monkeypatch.setattr(verified, "_INDEX_AFTER", 2000)
    keys = [(2049, 1000 - i, 4096, 10**18 + i // 7, 10**18 + i // 7) for i in range(300)]  # inodes out of order
    values = [f"xxh3_64:{i:016x}" for i in range(300)]
    store.parent.mkdir(parents=True, exist_ok=True)
    store.write_text(_lines(keys, values) + "torn 1 2\n" + _lines([keys[7]], ["xxh3_64:new"]))  # the last line wins
    values[7] = "xxh3_64:new"
    verified._stores.clear()
    assert [verified._entries(store).get(k) for k in keys] == values
    index = verified_index.load(store, verified._entries(store).file)
    assert index is not None and index.covered == store.stat().st_size and len(index) == 300  # the torn line: parsed line by line, the last line of an identity kept
    verified._stores.clear()  # a new process: reads nothing the index covers
    known = verified._entries(store)
    assert known.loaded == index.covered and known.raw == b"\n"
    assert [known.get(k) for k in keys] == values and known.get((2049, 1000, 4096, 1, 1)) is None
    more = [(2049, 5000 + i, 1, 2, 3) for i in range(100)]  # appended by others later: read past the index
    with open(store, "a") as f:
        f.write(_lines(more, ["xxh3_64:more"] * 100) + _lines([keys[9]], ["xxh3_64:newer"]))
    values[9] = "xxh3_64:newer"
    verified._stores.clear()
    known = verified._entries(store)  # past the threshold again: indexed on, the previous index and the new lines
    assert [known.get(k) for k in keys + more] == values + ["xxh3_64:more"] * 100
    assert known.index.covered == store.stat().st_size and len(known.index) == 300 + 101
    verified._stores.clear()
    assert [verified._entries(store).get(k) for k in keys + more] == values + ["xxh3_64:more"] * 100


def test_an_index_of_another_store_file_or_a_damaged_one_is_not_used(store, monkeypatch):
    monkeypatch.setattr(verified, "_INDEX_AFTER", 2000)
    keys = [(2049, i, 4096, 10**18, 10**18) for i in range(100)]
    store.parent.mkdir(parents=True, exist_ok=True)
    store.write_text(_lines(keys, [f"xxh3_64:{i:016x}" for i in range(100)]))
    verified._stores.clear()
    assert verified._entries(store).index is not None
    # Rewritten whole (as a compaction does): a new file of the same size, other entries.
    tmp = store.with_name("tmp")
    tmp.write_text(_lines(keys, [f"xxh3_64:{i + 1:016x}" for i in range(100)]))
    os.replace(tmp, store)
    verified._stores.clear()
    known = verified._entries(store)
    assert known.get(keys[5]) == f"xxh3_64:{6:016x}" and known.index.file == known.file  # indexed anew
    for damage in (b"", b"llm-verified-index\n" + b"\xff" * 40, verified_index.index_path(store).read_bytes()[:-3]):
        verified_index.index_path(store).write_bytes(damage)
        verified._stores.clear()
        assert verified_index.load(store, verified._entries(store).file) is not None  # ignored, then written again
        assert verified._entries(store).get(keys[5]) == f"xxh3_64:{6:016x}"


@pytest.mark.parametrize("how", ["in place, mtime restored", "replaced"])
def test_an_index_json_rewritten_with_the_same_size_is_read_and_checked_again(store, dataset, monkeypatch, how):
    from llm.data.shards.format import manifest as manifest_module
    from llm.data.shards.format.manifest import Manifest
    from llm.data.shards.format.validate import ManifestError

    reads: list[int] = []
    real = manifest_module.check_manifest
    monkeypatch.setattr(manifest_module, "check_manifest", lambda data, path: (reads.append(1), real(data, path))[1])
    index = dataset / "index.json"
    Manifest.load(dataset)
    Manifest.load(dataset)
    assert len(reads) == 1 and verified.recorded(index, verified.identity(index)[0]).startswith("xxh3_128:")
    stat = os.stat(index)
    text = index.read_text()
    # Same size, a count (the first shard's tokens) that no longer matches.
    bad = re.sub(r'("tokens": \d*)(\d)', lambda m: m[1] + str((int(m[2]) + 1) % 10), text, count=1)
    assert bad != text and len(bad) == len(text)
    if how == "replaced":  # the writer's atomic replace (the inode may well be reused)
        (dataset / "new.json").write_text(bad)
        os.replace(dataset / "new.json", index)
    else:
        index.write_text(bad)
    os.utime(index, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    with pytest.raises(ManifestError, match="index.json"):
        Manifest.load(dataset)
    assert len(reads) == 2
