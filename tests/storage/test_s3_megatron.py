"""Megatron prefixes and OLMo token files in object storage: copied once, checked, the same samples and state as local."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from llm.data import StreamingDataLoader, StreamingDataset, TokensLoader
from llm.data.shards.interop.olmo import spec
from llm.data.storage.objects import open_objects
from tests.data.shards import megatron_ref
from tests.storage.conftest import QUICK_ON_S3

BLOCK = 16


def _upload(url: str, files: list[Path]) -> None:
    objects = open_objects(url)
    for f in files:
        objects.put(f.name, f)


def _documents(n: int, seed: int) -> list[list[np.ndarray]]:
    rng = np.random.default_rng(seed)
    return [[rng.integers(0, 5000, int(rng.integers(1, 40)))] for _ in range(n)]


def _epoch(ds: StreamingDataset) -> np.ndarray:
    return np.concatenate([b.numpy() for b in StreamingDataLoader(ds, batch_size=4)])


@pytest.mark.parametrize("store_server", QUICK_ON_S3, indirect=True)
def test_a_remote_prefix_and_folder_read_as_the_local_copy(store_env, tmp_path):
    local = tmp_path / "local"
    local.mkdir()
    megatron_ref.write(local / "a", _documents(40, 1), code=8)
    megatron_ref.write(local / "b", _documents(30, 2), code=4)
    url = store_env.url()
    _upload(url, sorted(local.iterdir()))
    loader = TokensLoader(block_size=BLOCK)
    for remote_path, local_path in ((f"{url}/a", str(local / "a")), (url, str(local))):
        remote = StreamingDataset(remote_path, item_loader=loader, shuffle=True, cache_dir=tmp_path / "cache")
        here = StreamingDataset(local_path, item_loader=loader, shuffle=True)
        assert remote.fingerprint == here.fingerprint and len(remote) == len(here)
        assert np.array_equal(_epoch(remote), _epoch(here))
    # a state saved on the local copy resumes on the bucket's (same fingerprint, same order)
    here = StreamingDataLoader(StreamingDataset(str(local), item_loader=loader, shuffle=True), batch_size=4)
    it = iter(here)
    first = [next(it).numpy() for _ in range(3)]
    state = here.state_dict()
    rest_here = [b.numpy() for b in it]
    there = StreamingDataLoader(StreamingDataset(url, item_loader=loader, shuffle=True, cache_dir=tmp_path / "cache"), batch_size=4)
    there.load_state_dict(state)
    rest_there = [b.numpy() for b in there]
    assert len(first) == 3 and len(rest_there) == len(rest_here)
    assert all(np.array_equal(a, b) for a, b in zip(rest_there, rest_here))


def test_a_truncated_remote_bin_is_named_and_nothing_is_served(s3_env, tmp_path):
    local = tmp_path / "local"
    local.mkdir()
    megatron_ref.write(local / "c", _documents(20, 3), code=8)
    bin_path = local / "c.bin"
    bin_path.write_bytes(bin_path.read_bytes()[:-2])
    url = s3_env.url()
    _upload(url, sorted(local.iterdir()))
    with pytest.raises(ValueError, match=r"c\.bin has \d+ bytes, but sequence_lengths in c\.idx add up to"):
        StreamingDataset(f"{url}/c", item_loader=TokensLoader(block_size=BLOCK), cache_dir=tmp_path / "cache")


def test_remote_olmo_files_read_as_the_local_ones(s3_env, tmp_path):
    local = tmp_path / "olmo"
    local.mkdir()
    rng = np.random.default_rng(4)
    for k in range(2):
        rng.integers(0, 3000, 500).astype(np.uint16).tofile(local / f"part-{k}.npy")
    url = s3_env.url()
    _upload(url, sorted(local.iterdir()))
    loader = TokensLoader(block_size=BLOCK)
    remote = StreamingDataset(spec([f"{url}/part-0.npy", f"{url}/part-1.npy"], "uint16", 0), item_loader=loader,
                              cache_dir=tmp_path / "cache")
    by_folder = StreamingDataset(spec([url], "uint16", 0), item_loader=loader, cache_dir=tmp_path / "cache")
    here = StreamingDataset(spec(sorted(local.iterdir()), "uint16", 0), item_loader=loader)
    assert remote.fingerprint == here.fingerprint == by_folder.fingerprint
    assert np.array_equal(_epoch(remote), _epoch(here)) and len(here) == 2 * (500 // BLOCK)


def test_convert_reads_a_remote_prefix(s3_env, tmp_path):
    from llm.cli.data import main

    local = tmp_path / "local"
    local.mkdir()
    docs = _documents(25, 5)
    megatron_ref.write(local / "d", docs, code=8)
    url = s3_env.url()
    _upload(url, sorted(local.iterdir()))
    assert main(["convert", f"{url}/d", "--output", str(tmp_path / "ours"), "--no-progress"]) == 0
    ours = StreamingDataset(tmp_path / "ours", item_loader=TokensLoader(block_size=1))
    expected = np.concatenate([s for d in docs for s in d])
    assert ours.manifest.total_documents == len(docs)
    assert np.array_equal(np.concatenate([ours[i].numpy() for i in range(len(ours))]), expected)
