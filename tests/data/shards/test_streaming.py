"""StreamingDataset / StreamingDataLoader: blocks, epochs, ranks x workers, exact resume on any topology."""

from __future__ import annotations

import os
import pickle

import numpy as np
import pytest
import torch

from llm.data import StreamingDataLoader, StreamingDataset, TokensLoader
from tests.data.shards.helpers import all_tokens, make_token_dataset, run_loader
from tests.resume import check_resume


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    return make_token_dataset(tmp_path_factory.mktemp("core"), n_lines=2500)


def test_blocks_are_the_token_stream_cut_in_order_across_shards(dataset):
    tokens = all_tokens(dataset)
    ds = StreamingDataset(dataset, item_loader=TokensLoader(block_size=100))
    assert len(ds.manifest.shards) > 3, "fixture must span several shards"
    assert len(ds) == -(-tokens.size // 100)
    joined = torch.cat([ds[i] for i in range(len(ds))]).numpy()
    assert np.array_equal(joined[: tokens.size], tokens)
    assert np.all(joined[tokens.size :] == ds.manifest.eos_id), "the short last block is padded with EOS"
    assert ds[0].dtype == torch.int64 and ds[-1].shape == (100,)
    dropped = StreamingDataset(dataset, item_loader=TokensLoader(block_size=100), drop_last=True)
    assert len(dropped) == tokens.size // 100


def test_document_boundaries_restart_positions(dataset):
    tokens = all_tokens(dataset)
    eos = StreamingDataset(dataset, item_loader=TokensLoader(block_size=64)).manifest.eos_id
    ds = StreamingDataset(dataset, item_loader=TokensLoader(block_size=64, document_boundaries=True))
    for i in range(0, len(ds) - 1, 37):
        item = ds[i]
        ids, pos = item["input_ids"].numpy(), item["position_ids"].numpy()
        expected = np.empty(64, dtype=np.int64)
        p = 0
        for j in range(64):
            expected[j] = p
            p = 0 if ids[j] == eos else p + 1  # the token after EOS starts a new document
        assert np.array_equal(ids, tokens[i * 64 : (i + 1) * 64])
        assert np.array_equal(pos, expected), f"block {i}"


@pytest.mark.parametrize("workers,backend", [(0, "auto"), (2, "threads"), (2, "processes")])
def test_epoch_delivers_every_block_once_and_reshuffles(dataset, workers, backend):
    ds = StreamingDataset(dataset, item_loader=TokensLoader(block_size=128), shuffle=True, seed=3)
    loader = StreamingDataLoader(ds, batch_size=8, num_workers=workers, worker_backend=backend)
    reference = torch.stack([ds[i] for i in range(len(ds))])
    epochs = []
    for _ in range(2):
        batches = list(loader)
        assert len(batches) == len(loader) == -(-len(ds) // 8)
        assert all(b.shape[1:] == (128,) and b.dtype == torch.int64 for b in batches)
        rows = torch.cat(batches)
        order = [int(torch.nonzero((reference == r).all(1))[0]) for r in rows[:50]]
        epochs.append(order)
        assert sorted(map(tuple, rows.tolist())) == sorted(map(tuple, reference.tolist()))
    assert epochs[0] != epochs[1], "a new epoch is reshuffled"


def test_ranks_times_workers_split_is_disjoint_and_complete(dataset):
    ds = StreamingDataset(dataset, item_loader=TokensLoader(block_size=128), shuffle=True)
    world, seen, counts = 3, [], []
    for rank in range(world):
        os.environ["RANK"], os.environ["WORLD_SIZE"] = str(rank), str(world)
        try:
            batches = list(StreamingDataLoader(ds, batch_size=4, num_workers=2, worker_backend=("threads", "processes")[rank % 2]))
        finally:
            del os.environ["RANK"], os.environ["WORLD_SIZE"]
        counts.append(len(batches))
        seen.extend(map(tuple, torch.cat(batches).tolist()))
    assert len(set(counts)) == 1, f"every rank steps the same number of times: {counts}"
    everything = {tuple(ds[i].tolist()) for i in range(len(ds))}
    assert set(seen) == everything
    repeats = len(seen) - len(set(seen))
    assert repeats < world, "only the final short global batch may repeat a sample, to even out the ranks"


def test_state_is_small_and_counts_only_handed_batches(dataset):
    ds = StreamingDataset(dataset, item_loader=TokensLoader(block_size=128), shuffle=True)
    loader = StreamingDataLoader(ds, batch_size=8, num_workers=2, prefetch_factor=4, worker_backend="processes")
    it = iter(loader)
    for _ in range(3):
        next(it)
    state = loader.state_dict()
    assert state["samples_consumed"] == 24 and state["epoch"] == 0
    assert len(pickle.dumps(state)) < 600


def test_resume_does_not_replay(dataset, monkeypatch):
    ds = StreamingDataset(dataset, item_loader=TokensLoader(block_size=16), shuffle=True)
    loader = StreamingDataLoader(ds, batch_size=2)
    n = len(loader)
    loader.load_state_dict({**loader.state_dict(), "samples_consumed": 2 * (n * 9 // 10)})
    reads = []
    original = StreamingDataset.read_blocks
    monkeypatch.setattr(StreamingDataset, "read_blocks", lambda self, ids: reads.append(len(ids)) or original(self, ids))
    next(iter(loader))
    assert sum(reads) <= 2 * loader._chunk_batches, "the first batch after a resume reads one chunk, not the past"


def test_load_state_rejects_other_dataset(dataset, tmp_path):
    other = make_token_dataset(tmp_path, n_lines=300)
    a = StreamingDataLoader(StreamingDataset(dataset, item_loader=TokensLoader(block_size=32)), batch_size=2)
    b = StreamingDataLoader(StreamingDataset(other, item_loader=TokensLoader(block_size=32)), batch_size=2)
    with pytest.raises(ValueError, match="fingerprint"):
        b.load_state_dict(a.state_dict())


@pytest.fixture(scope="module")
def resume_config(tmp_path_factory):
    path = make_token_dataset(tmp_path_factory.mktemp("resume"), n_lines=700)
    return {"path": str(path), "block": 64, "batch": 4, "world": 1, "workers": 0, "epochs": 2}


def test_resume_exact_same_topology_and_other_workers(resume_config):
    n = len(run_loader(resume_config, None, None)[0])
    per_epoch = n // 2
    check_resume(
        run_loader,
        resume_config,
        stops=[1, per_epoch // 2, per_epoch, per_epoch + 3],  # mid-epoch, the epoch end, into epoch 2
        resume_configs=[
            {**resume_config, "workers": 2, "backend": "processes"},
            {**resume_config, "workers": 3, "backend": "threads"},
        ],
    )


def test_resume_exact_on_another_world_size(resume_config):
    two_ranks = {**resume_config, "world": 2, "batch": 2, "workers": 2, "backend": "processes"}  # global batch 4
    one_rank = {**resume_config, "world": 1, "batch": 4, "workers": 1}
    check_resume(run_loader, two_ranks, stops=[5, 17], resume_configs=[one_rank])
    check_resume(run_loader, one_rank, stops=[9], resume_configs=[two_ranks])


@pytest.mark.parametrize("dtype, expected", [(torch.int32, torch.int32), ("int32", torch.int32), (None, torch.uint16),
                                             (torch.int64, torch.int64)])
def test_token_dtype_of_the_batches(dataset, dtype, expected):
    reference = StreamingDataset(str(dataset), item_loader=TokensLoader(block_size=33), shuffle=True)
    ds = StreamingDataset(str(dataset), item_loader=TokensLoader(block_size=33, dtype=dtype), shuffle=True)
    want = [b for b in StreamingDataLoader(reference, batch_size=4, num_workers=2)]
    got = [b for b in StreamingDataLoader(ds, batch_size=4, num_workers=2)]
    assert all(g.dtype == expected for g in got)
    assert all(torch.equal(g.long(), w) for g, w in zip(got, want)) and len(got) == len(want)


def test_a_token_dtype_that_cannot_hold_the_ids_is_refused(dataset):
    with pytest.raises(ValueError, match="TokensLoader.dtype must be torch.int64, torch.int32 or None"):
        TokensLoader(block_size=4, dtype=torch.float32)
    with pytest.raises(ValueError, match="TokensLoader.dtype uint16 cannot hold the token ids of .* \\(up to 70000"):
        StreamingDataset(str(dataset), item_loader=TokensLoader(block_size=4, dtype=None, pad_id=70000))
