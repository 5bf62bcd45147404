"""Token blocks read with preadv: the same tokens as the mapped path, no dataset pages held, a changed file named."""

from __future__ import annotations

import os
import shutil

import numpy as np
import pytest

from llm.data import StreamingDataset, TokensLoader, optimize
from llm.data.shards.format import reader as reader_module
from llm.data.shards.format.reader import ShardError


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    out = tmp_path_factory.mktemp("pread") / "ds"
    optimize(lambda i: np.random.default_rng(i).integers(0, 60_000, 20_000), list(range(200)), str(out),
             chunk_bytes="1MB", num_workers=0, progress=False, item_loader=TokensLoader())
    return out


def rss_file_kb() -> int:
    for line in open("/proc/self/status"):
        if line.startswith("RssFile:"):
            return int(line.split()[1])
    raise AssertionError("no RssFile in /proc/self/status")


def mapped_kb(folder) -> int:
    """Resident KB of this process's mappings of files under `folder`."""
    total, current = 0, None
    with open("/proc/self/smaps") as f:
        for line in f:
            parts = line.split()
            if "-" in parts[0] and len(parts) >= 5:  # a mapping's header line
                current = parts[5] if len(parts) > 5 else None
            elif parts[0] == "Rss:" and current and current.startswith(str(folder)):
                total += int(parts[1])
    return total


def test_blocks_match_the_mapped_path_and_hold_no_pages(dataset):
    ds = StreamingDataset(str(dataset), item_loader=TokensLoader(block_size=2049), shuffle=True)
    ids = np.random.default_rng(0).permutation(len(ds))
    ds.read_blocks(ids[:50])  # code pages of the read path loaded before measuring
    before = rss_file_kb()
    got = ds.read_blocks(ids)["input_ids"]
    grown = rss_file_kb() - before
    reader = ds.reader
    for row, sample in enumerate(ids.tolist()):
        start = sample * 2049
        expected = np.empty(2049, dtype=np.int64)
        stop = min(start + 2049, reader.total)
        reader.read(start, stop, expected)
        expected[stop - start:] = ds.pad_id
        assert np.array_equal(got[row], expected)
    assert got.nbytes > 30 << 20
    # 8 MB of tokens read; through a map (with fault-around) ~100 MB would stay resident
    assert grown < 8 << 10, f"{grown} KB of the dataset's pages stayed mapped"


def test_a_shard_replaced_after_verification_is_named(dataset, tmp_path):
    copy = tmp_path / "ds"
    shutil.copytree(dataset, copy)
    ds = StreamingDataset(str(copy), item_loader=TokensLoader(block_size=100))
    ds.reader.files.raw(0)  # verified, not yet read
    shard = copy / ds.manifest.shards[0].file
    replacement = shard.with_name("other.bin")
    shutil.copyfile(shard, replacement)
    os.replace(replacement, shard)
    with pytest.raises(ShardError, match=f"shard {shard} was replaced after its checksum was verified"):
        ds.read_blocks(np.array([0]))


def test_a_shard_truncated_while_read_is_named(dataset, tmp_path):
    copy = tmp_path / "ds"
    shutil.copytree(dataset, copy)
    ds = StreamingDataset(str(copy), item_loader=TokensLoader(block_size=100))
    ds.read_blocks(np.array([0]))
    shard = copy / ds.manifest.shards[0].file
    os.truncate(shard, 1000)
    with pytest.raises(ShardError, match=f"shard {shard} ended after .* bytes while reading a block: the file was truncated"):
        ds.read_blocks(np.array([50]))


def _doc(i: int) -> np.ndarray:
    return np.random.default_rng(1000 + i).integers(0, 60_000, 3_000 + 37 * i)


@pytest.fixture(scope="module")
def many_shards(tmp_path_factory):
    out = tmp_path_factory.mktemp("many") / "ds"
    optimize(_doc, list(range(300)), str(out), chunk_bytes="16KB", num_workers=0, progress=False,
             item_loader=TokensLoader())
    return out


@pytest.mark.parametrize("workers", [0, 2])
def test_a_shuffled_epoch_over_hundreds_of_shards_opens_each_once_and_keeps_no_pages(many_shards, monkeypatch, workers):
    from llm.data import StreamingDataLoader

    reference = np.concatenate([_doc(i) for i in range(300)])
    opened: list[str] = []
    real_open = os.open

    def counting_open(path, *args, **kwargs):
        if str(path).startswith(str(many_shards)):
            opened.append(str(path))
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(reader_module, "_RELEASE_EVERY_TOKENS", 1 << 16)  # release often: what stays is a leak
    monkeypatch.setattr(os, "open", counting_open)
    ds = StreamingDataset(str(many_shards), item_loader=TokensLoader(block_size=512, document_boundaries=True),
                          shuffle=True, seed=3)
    shards = len(ds.manifest.shards)
    batches = list(StreamingDataLoader(ds, batch_size=8, num_workers=workers))
    assert shards > 200
    assert len(opened) <= shards, f"{len(opened)} opens for {shards} shards: descriptors were reopened"
    # every shard was touched through its map (layout check, boundary blocks, document ends)
    assert mapped_kb(many_shards) < 1 << 10, f"{mapped_kb(many_shards)} KB of the dataset's pages stayed mapped"

    # every block exactly once, with its positions, against the documents themselves
    n = len(ds)
    padded = np.full(n * 512, ds.pad_id, dtype=np.int64)
    padded[: reference.size] = reference
    doc_starts = np.concatenate([[0], np.cumsum([_doc(i).size for i in range(300)])])[:-1]
    sample_of = {padded[k * 512 : (k + 1) * 512].tobytes(): k for k in range(n)}
    seen = []
    for batch in batches:
        for row, positions in zip(batch["input_ids"].numpy(), batch["position_ids"].numpy()):
            k = sample_of[row.astype(np.int64).tobytes()]
            seen.append(k)
            starts = [0, *(doc_starts[(doc_starts > k * 512) & (doc_starts < (k + 1) * 512)] - k * 512).tolist()]
            if k == n - 1 and reference.size < n * 512:
                starts.append(reference.size - k * 512)  # padding starts a segment of its own
            expected = np.arange(512) - np.maximum.accumulate(np.isin(np.arange(512), starts) * np.arange(512))
            assert np.array_equal(positions, expected), k
    assert sorted(seen) == list(range(n))


@pytest.mark.parametrize("dest", [
    [3, 0, 2, 1],  # every row of one run, shuffled (a batch read in file order): read in place, widened in one copy
    [7, 5, 4, 6],  # a run that starts further on (a mixture filling part of its batch)
    [0, 2, 5, 7],  # rows apart: scattered
    [1, 1, 2, 3],  # one row twice (never asked for; a run's length, not a run): the scatter's answer, not a guess
])
def test_rows_read_into_wider_rows_land_where_dest_says(tmp_path, dest):
    from llm.data.shards.format.pread import read_rows

    tokens = np.arange(1000, dtype=np.uint16) * 37
    path = tmp_path / "shard.bin"
    path.write_bytes(tokens.tobytes())
    offsets = np.array([100, 0, 640, 300])  # in file order they would be 0, 100, 300, 640: not sorted on purpose
    fd = os.open(path, os.O_RDONLY)
    try:
        out = np.full((9, 16), -1, np.int64)
        read_rows([fd] * 4, offsets, 16, np.dtype("<u2"), out, np.array(dest), lambda k: str(path))
    finally:
        os.close(fd)
    expected = np.full((9, 16), -1, np.int64)
    for k, row in enumerate(dest):
        expected[row] = tokens[offsets[k]:offsets[k] + 16]
    assert np.array_equal(out, expected)
