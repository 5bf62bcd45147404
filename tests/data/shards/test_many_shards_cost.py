"""What opening 10^4 shards costs, counted (not timed): stats, opens and bytes read or parsed (issue 38, target 3).

On one dataset of 10,000 one-document shards, four moments are counted: the first open on a
machine (no remembered shard table: index.json is parsed and cross-checked once), a warm
open in a process that has not opened it yet, the first shuffled batch, and a resume at 50%.
Only the first open may read index.json (later ones name it by its file identity) or read the
folder's verified-shards store whole (later ones read what its index does not cover, and look
shards up in the index); none of them stats or opens more shard files than the batch touches.
bench/huge_shards.py times the same moments at up to 10^5 shards.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import xxhash

from llm.data import StreamingDataLoader, StreamingDataset, TokensLoader
from llm.data.shards.format import validate, verified, verified_index
from llm.data.shards.format.manifest import INDEX_NAME, Manifest
from tests.data.shards.helpers import all_tokens, many_shards

SHARDS, DOC, BLOCK, BATCH = 10_000, 32, 64, 8
TOUCHED = 3 * BATCH  # a 64-token block of 32-token shards lies in at most 3 of them


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    out = many_shards(tmp_path_factory.mktemp("many-shards") / "d", SHARDS, DOC)
    time.sleep(0.06)  # older than the quiet window (verified.py): index.json may be named by its identity
    return out


class _Counter:
    """Stats and opens under one folder, JSON bytes parsed and shard entries checked one by one."""

    def __init__(self, folder: Path):
        self.folder, self.active = str(folder), False
        self.stats: list[str] = []
        self.opened: list[str] = []
        self.json_bytes = self.entry_checks = self.store_bytes = self.store_parsed = self.index_reads = 0
        self.table_reads = 0  # the remembered shard table read whole (it is mapped: only the pages used)

    def shard_files(self) -> set[str]:
        return {p for p in self.stats + self.opened if p.endswith(".bin")}


_current: list[_Counter] = []  # audit hooks cannot be removed: one hook, pointed at the current counter


def _audit(event: str, args: tuple) -> None:
    if _current and _current[-1].active and event == "open" and isinstance(args[0], (str, bytes, os.PathLike)):
        path = os.fsdecode(args[0])
        if path.startswith(_current[-1].folder):
            _current[-1].opened.append(path)


def _count(folder: Path, monkeypatch, work) -> tuple[_Counter, object]:
    """Counts what `work()` does to `folder`, as a process that has read no verified-shards store yet."""
    if not getattr(_count, "hooked", False):
        sys.addaudithook(_audit)
        _count.hooked = True  # type: ignore[attr-defined]
    counter = _Counter(folder)
    real_stat, real_loads, real_check = os.stat, json.loads, validate.check_shard_entry
    real_read, real_parse, real_read_bytes = verified._read_new, verified._parse, Path.read_bytes

    def stat(path, *a, **kw):
        if counter.active and os.fsdecode(path).startswith(counter.folder):
            counter.stats.append(os.fsdecode(path))
        return real_stat(path, *a, **kw)

    def loads(s, *a, **kw):
        counter.json_bytes += len(s)
        return real_loads(s, *a, **kw)

    def check(*a, **kw):
        counter.entry_checks += 1
        return real_check(*a, **kw)

    def read_store(store, known):
        got = real_read(store, known)
        counter.store_bytes += len(got)
        return got

    def read_bytes(path):
        counter.index_reads += path.name == INDEX_NAME  # read whole (the format check reads only its tail)
        counter.table_reads += path.suffix == ".table"
        return real_read_bytes(path)

    def parse_store(lines):
        counter.store_parsed += len(lines)
        return real_parse(lines)

    with monkeypatch.context() as m:
        m.setattr(verified, "_read_new", read_store)
        m.setattr(verified, "_parse", parse_store)
        m.setattr(Path, "read_bytes", read_bytes)
        m.setattr(os, "stat", stat)
        m.setattr(json, "loads", loads)
        m.setattr(validate, "check_shard_entry", check)
        verified._stores.clear()
        _current.append(counter)
        counter.active = True
        try:
            result = work()
        finally:
            counter.active = False
            _current.pop()
    return counter, result


def _first_batch(folder: Path, state: dict | None = None) -> np.ndarray:
    loader = StreamingDataLoader(StreamingDataset(folder, item_loader=TokensLoader(block_size=BLOCK), shuffle=True),
                                 batch_size=BATCH)
    if state is not None:
        loader.load_state_dict(state)
    return next(iter(loader)).numpy()


def test_first_open_warm_open_first_batch_and_resume_at_ten_thousand_shards(folder, monkeypatch):
    index = folder / INDEX_NAME
    table = verified.manifests_folder() / f"{xxhash.xxh3_128_hexdigest(index.read_bytes())}.table"
    table.unlink(missing_ok=True)  # a new machine: no shard table remembered for these bytes
    store = verified.store_path(index)
    verified_index.index_path(store).unlink(missing_ok=True)
    first, manifest = _count(folder, monkeypatch, lambda: Manifest.load(folder))
    assert manifest.num_shards == SHARDS and table.is_file()
    # The first open parses index.json once and checks it, but touches no shard file.
    assert first.json_bytes == pytest.approx(index.stat().st_size, abs=4096), first.json_bytes
    assert first.shard_files() == set(), sorted(first.shard_files())[:3]
    assert first.entry_checks == 0  # checked column by column (validate.shard_columns), not entry by entry
    # optimize remembered its 10^4 shards in the folder's store: read whole once, and indexed.
    assert first.index_reads == 1 and first.store_bytes > SHARDS * 50 and verified_index.index_path(store).is_file()
    print(f"first open: {len(first.stats)} stats, {len(first.opened)} opens, {first.json_bytes} JSON bytes, "
          f"{first.entry_checks} entries checked one by one, {first.store_bytes} store bytes read")

    warm, manifest = _count(folder, monkeypatch, lambda: Manifest.load(folder))
    assert warm.json_bytes < 4096 and warm.entry_checks == 0 and warm.shard_files() == set()
    assert len(warm.stats) <= 5 and len(warm.opened) <= 3, (warm.stats, warm.opened)
    assert warm.index_reads == 0 and warm.table_reads == 0  # index.json named by its identity, the table mapped
    assert warm.store_bytes < 4096 and warm.store_parsed < 4096  # the store's index covers the rest

    batch, got = _count(folder, monkeypatch, lambda: _first_batch(folder))
    assert batch.json_bytes < 4096 and batch.entry_checks == 0
    assert batch.index_reads == 0 and batch.table_reads == 0 and batch.store_bytes < 4096 and batch.store_parsed < 4096
    assert 0 < len(batch.shard_files()) <= TOUCHED, f"{len(batch.shard_files())} of {SHARDS} shard files touched"
    assert len(batch.stats) <= 3 * TOUCHED + 5 and len(batch.opened) <= 2 * TOUCHED + 5, (len(batch.stats), len(batch.opened))
    tokens = all_tokens(folder)
    order = StreamingDataset(folder, item_loader=TokensLoader(block_size=BLOCK), shuffle=True).order(0)
    assert np.array_equal(got, np.stack([tokens[s * BLOCK : (s + 1) * BLOCK] for s in order(np.arange(BATCH)).tolist()]))

    ds = StreamingDataset(folder, item_loader=TokensLoader(block_size=BLOCK), shuffle=True)
    half = len(ds) // 2 // BATCH * BATCH
    loader = StreamingDataLoader(ds, batch_size=BATCH)
    state = dict(loader.state_dict(), samples_consumed=half)
    resume, got = _count(folder, monkeypatch, lambda: _first_batch(folder, state))
    assert resume.json_bytes < 4096 and resume.entry_checks == 0
    assert resume.index_reads == 0 and resume.table_reads == 0 and resume.store_bytes < 4096 and resume.store_parsed < 4096
    assert 0 < len(resume.shard_files()) <= TOUCHED, f"{len(resume.shard_files())} of {SHARDS} shard files touched"
    expected = [tokens[s * BLOCK : (s + 1) * BLOCK] for s in order(np.arange(half, half + BATCH)).tolist()]
    assert np.array_equal(got, np.stack(expected))


_GOOD = {"file": "a.bin", "bytes": 72, "checksum": "xxh3_64:10ef1595417a5cb6", "documents": 1, "tokens": 32, "items": 0,
         "dtype": "uint16", "compression": None, "raw_bytes": 72}
_BAD = [("bytes", 71), ("bytes", True), ("bytes", 7.2e1), ("bytes", -1), ("bytes", 1 << 70), ("bytes", None),
        ("tokens", 33), ("documents", 0), ("items", 1), ("raw_bytes", 70), ("dtype", "int8"), ("dtype", ["uint16"]),
        ("compression", "gzip"), ("checksum", "xxh3_64:10ef"), ("checksum", "md5:10ef1595417a5cb6"), ("checksum", 5),
        ("file", ""), ("file", ".."), ("file", "a/b.bin"), ("file", "a\\b.bin"), ("file", 3), ("extra", 1)]


@pytest.mark.parametrize(("key", "value"), _BAD, ids=[f"{k}={v!r}" for k, v in _BAD])
def test_the_column_checks_refuse_whatever_the_entry_checks_refuse(key, value):
    """A bad entry among good ones: the column pass declines, and the entry pass names it (same message as before)."""
    shards = [dict(_GOOD, file=f"s{i}.bin") for i in range(5)]
    shards[3][key] = value
    assert validate.shard_columns(shards, "tokens", "uint16", False) is None
    data = {"kind": "tokens", "dtype": "uint16", "format_version": 2, "shards": shards}
    with pytest.raises(validate.ManifestError, match="shard entry 3|shard s3.bin|shard a"):
        validate.check_manifest(data, Path("index.json"))


def test_the_column_checks_pass_good_entries_and_refuse_a_name_listed_twice():
    shards = [dict(_GOOD, file=f"s{i}.bin") for i in range(5)]
    columns = validate.shard_columns(shards, "tokens", "uint16", False)
    assert columns is not None and columns["file"] == [s["file"] for s in shards] and columns["tokens"] == [32] * 5
    del shards[2]["raw_bytes"], shards[2]["dtype"]  # defaults: raw_bytes 0 (= bytes), the manifest's dtype
    assert validate.shard_columns(shards, "tokens", "uint16", False) is not None
    shards[4]["file"] = "s0.bin"
    assert validate.shard_columns(shards, "tokens", "uint16", False) is None
    with pytest.raises(validate.ManifestError, match="shard s0.bin is listed twice"):
        validate.check_manifest({"kind": "tokens", "dtype": "uint16", "format_version": 2, "shards": shards},
                                Path("index.json"))
