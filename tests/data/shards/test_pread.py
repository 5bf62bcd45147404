"""Token blocks read with preadv: the same tokens as the mapped path, no dataset pages held, a changed file named."""

from __future__ import annotations

import os
import shutil

import numpy as np
import pytest

from llm.data import StreamingDataset, TokensLoader, optimize
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
