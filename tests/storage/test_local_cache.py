"""The shard cache over a network folder (local:): no server needed, same cache as for s3://."""

from __future__ import annotations

import os

import numpy as np
import pytest

from llm.data.shards.format.loaders import TokensLoader
from llm.data.shards.format.manifest import Manifest
from llm.data.shards.read.dataset import StreamingDataset
from llm.data.storage.cache import CorruptObject
from llm.data.storage.sizes import parse_cache_size
from tests.storage.helpers import FolderSampler, docs, stream_tokens, write


@pytest.fixture(scope="module")
def share(tmp_path_factory):
    folder = tmp_path_factory.mktemp("share") / "ds"
    documents = docs(500, seed=6)
    write(str(folder), documents)
    return folder, np.concatenate(documents)


def test_a_network_folder_streams_through_the_cache_within_its_limit(share, tmp_path):
    folder, want = share
    limit = 5 * 4096
    ds = StreamingDataset(f"local:{folder}", item_loader=TokensLoader(block_size=32), cache_dir=tmp_path, max_cache_size=limit)
    largest = max(s.bytes for s in ds.manifest.shards)
    with FolderSampler(ds.cache.folder) as sampler:
        got = stream_tokens(f"local:{folder}", block=32, workers=2, cache_dir=tmp_path, max_cache_size=limit)
    assert np.array_equal(got, want)
    assert 0 < sampler.peak <= limit + largest
    assert not [p for p in ds.cache.folder.iterdir() if p.name.endswith(".part")]


def test_a_damaged_cached_file_is_replaced_by_a_fresh_download(share, tmp_path):
    folder, want = share
    url = f"local:{folder}"
    assert np.array_equal(stream_tokens(url, cache_dir=tmp_path), want)  # fills the cache (no limit)
    cached = tmp_path / Manifest.load(folder).fingerprint() / Manifest.load(folder).shards[0].file
    data = bytearray(cached.read_bytes())
    data[0] ^= 0xFF
    cached.write_bytes(bytes(data))
    assert np.array_equal(stream_tokens(url, cache_dir=tmp_path), want)
    assert cached.read_bytes() == (folder / cached.name).read_bytes()


def test_a_shard_changed_at_the_source_is_an_error_naming_it(tmp_path):
    folder = tmp_path / "ds"
    write(str(folder), docs(60, seed=7))
    shard = folder / Manifest.load(folder).shards[1].file
    data = bytearray(shard.read_bytes())
    data[-9] ^= 1
    shard.write_bytes(bytes(data))
    with pytest.raises(CorruptObject, match=f"local:{shard} does not match the dataset's manifest after 2 downloads"):
        stream_tokens(f"local:{folder}", cache_dir=tmp_path / "cache")


def test_cache_sizes():
    assert parse_cache_size("50GB") == 50 << 30 and parse_cache_size("100 MB") == 100 << 20
    assert parse_cache_size(1234) == 1234 and parse_cache_size(None) is None
    for bad in ("lots", "0MB", -1, True):
        with pytest.raises(ValueError, match="max_cache_size"):
            parse_cache_size(bad)


def test_a_killed_download_leaves_no_reservation(share, tmp_path):
    folder, want = share
    ds = StreamingDataset(f"local:{folder}", item_loader=TokensLoader(block_size=32), cache_dir=tmp_path, max_cache_size=8192)
    dead = 2 ** 22 + 12345  # beyond pid_max on most machines: never a live process
    stale = ds.cache.folder / f".{ds.manifest.shards[0].file}.999999999.{dead}-0.part"
    stale.write_bytes(b"x")
    assert np.array_equal(stream_tokens(f"local:{folder}", block=32, cache_dir=tmp_path, max_cache_size=8192), want)
    assert not stale.exists()
    assert os.listdir(ds.cache.folder)


def test_chunk_and_cache_sizes_are_read_by_one_parser_in_binary_units():
    from llm.data.shards.prepare.optimize import parse_size

    for text, expected in (("64MB", 64 << 20), ("512kb", 512 << 10), ("1GiB", 1 << 30), ("1.5 KB", 1536), ("4096", 4096)):
        assert parse_size(text) == expected == parse_cache_size(text)
    for bad in ("lots", "nanMB", "infGB"):
        with pytest.raises(ValueError, match=f"^chunk size '{bad}' is not a size like 64MB"):
            parse_size(bad)
    with pytest.raises(ValueError, match="^chunk size '2TB' is out of range"):
        parse_size("2TB")
