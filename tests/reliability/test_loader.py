"""The loader side: vectorised reads equal the per-row reference, epoch boundaries, iterators, bad states."""

from __future__ import annotations

import copy
import itertools
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch.utils.data import DataLoader

from llm.data import StreamingDataLoader, StreamingDataset, TokensLoader, optimize
from llm.data.shards.plan.schedule import epoch_order
from tests.data.shards.helpers import make_token_dataset

BLOCK = 37


@pytest.fixture(scope="module")
def datasets(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("loader")
    (root / "a").mkdir()
    (root / "b").mkdir()
    out = {"small-shards": make_token_dataset(root / "a", n_lines=600, chunk_bytes="1KB"),
           "zstd": make_token_dataset(root / "b", n_lines=300, chunk_bytes="2KB", compression="zstd")}
    rng = np.random.default_rng(0)
    docs = [rng.integers(0, 70_000, size=int(rng.integers(1, 90))) for _ in range(120)]
    out["uint32"] = root / "c"
    optimize(lambda i: docs[i], list(range(len(docs))), out["uint32"], num_workers=0, item_loader=TokensLoader(),
             chunk_size=500, progress=False)
    return out


def _reference(ds: StreamingDataset, ids: np.ndarray) -> dict[str, np.ndarray]:
    """The pre-vectorisation path: every block read alone by TokenReader.read."""
    tokens = np.empty((len(ids), ds.block_size), dtype=np.int64)
    positions = np.empty_like(tokens)
    for row, sample in enumerate(ids.tolist()):
        ds._read_block(sample, tokens[row], positions[row])
    return {"input_ids": tokens, "position_ids": positions}


@pytest.mark.parametrize("name", ["small-shards", "zstd", "uint32"])
@settings(max_examples=40, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_vectorised_blocks_equal_the_per_row_reference(datasets, name, data) -> None:
    block = data.draw(st.sampled_from([1, 2, 7, BLOCK, 300, 2049]))
    ds = StreamingDataset(datasets[name], item_loader=TokensLoader(block_size=block, document_boundaries=True))
    ids = np.array(data.draw(st.lists(st.integers(0, len(ds) - 1), min_size=1, max_size=50)), dtype=np.int64)
    got, want = ds.read_blocks(ids), _reference(ds, ids)
    assert np.array_equal(got["input_ids"], want["input_ids"])
    assert np.array_equal(got["position_ids"], want["position_ids"])
    plain = StreamingDataset(datasets[name], item_loader=TokensLoader(block_size=block)).read_blocks(ids)
    assert np.array_equal(plain["input_ids"], want["input_ids"])


@pytest.mark.parametrize("boundaries", [False, True])
@pytest.mark.parametrize("workers", [0, 2])
def test_a_plain_dataloader_over_the_dataset_gives_the_same_samples_as_indexing(datasets, boundaries, workers) -> None:
    ds = StreamingDataset(datasets["small-shards"], item_loader=TokensLoader(block_size=BLOCK, document_boundaries=boundaries),
                          shuffle=True, seed=3)
    ds.set_epoch(2)
    order = epoch_order(len(ds), 3, 2, True)(np.arange(len(ds)))
    want = [ds[int(i)] for i in order]
    got = [b for batch in DataLoader(ds, batch_size=5, num_workers=workers)
           for b in (batch["input_ids"] if boundaries else batch)] if not boundaries else None
    if boundaries:
        got_ids, got_pos = [], []
        for batch in DataLoader(ds, batch_size=5, num_workers=workers):
            got_ids.extend(batch["input_ids"])
            got_pos.extend(batch["position_ids"])
        assert sorted(map(tuple, (t.tolist() for t in got_ids))) == sorted(tuple(w["input_ids"].tolist()) for w in want)
        if workers == 0:
            assert all(torch.equal(a, w["position_ids"]) for a, w in zip(got_pos, want, strict=True))
        return
    if workers == 0:
        assert all(torch.equal(a, w) for a, w in zip(got, want, strict=True))
    else:  # workers interleave chunks; every sample still comes exactly once
        assert sorted(tuple(t.tolist()) for t in got) == sorted(tuple(w.tolist()) for w in want)


def _loader(path: Path, batch: int = 4, **kw) -> StreamingDataLoader:
    ds = StreamingDataset(path, item_loader=TokensLoader(block_size=BLOCK), shuffle=True, seed=11)
    return StreamingDataLoader(ds, batch_size=batch, **kw)


def _key(batches) -> list[tuple]:
    return [tuple(b.flatten().tolist()) for b in batches]


STOPS = ["break-after-last", "islice", "state-at-boundary", "next-until-exhausted"]


@pytest.mark.parametrize("stop", STOPS)
@pytest.mark.parametrize("workers", [0, 2])
def test_every_way_of_stopping_at_the_epoch_end_starts_a_full_next_epoch(datasets, stop, workers) -> None:
    path = datasets["small-shards"]
    reference = _loader(path, num_workers=workers)
    full = [_key(list(reference)) for _ in range(4)]
    n = len(reference)
    assert all(len(p) == n for p in full) and full[0] != full[1]
    loader, passes = _loader(path, num_workers=workers), []
    for _ in range(4):
        if stop == "break-after-last":
            got = []
            for i, b in enumerate(loader):
                got.append(b)
                if i == n - 1:
                    break
        elif stop == "islice":
            got = list(itertools.islice(loader, n))
        elif stop == "next-until-exhausted":
            it = iter(loader)
            got = [next(it) for _ in range(n)]
        else:
            got = list(itertools.islice(loader, n))
            state = loader.state_dict()
            assert state["samples_consumed"] == 0, "the boundary reads as the next epoch at 0"
            loader = _loader(path, num_workers=workers)
            loader.load_state_dict(copy.deepcopy(state))
        passes.append(_key(got))
    assert [len(p) for p in passes] == [n] * 4
    assert passes == full, "the interrupted run must equal the uninterrupted one"
    assert loader.state_dict()["epoch"] == 4


def test_a_new_iterator_supersedes_the_old_one(datasets) -> None:
    loader = _loader(datasets["small-shards"])
    first = iter(loader)
    a = [next(first) for _ in range(3)]
    second = iter(loader)
    with pytest.raises(RuntimeError, match="superseded"):
        next(first)
    rest = list(second)
    assert _key(a + rest) == _key(list(_loader(datasets["small-shards"])))
    third = iter(loader)
    loader.load_state_dict(loader.state_dict())
    with pytest.raises(RuntimeError, match="superseded"):
        next(third)


def test_bad_loader_arguments_are_one_sentence(datasets) -> None:
    with pytest.raises(ValueError, match="block_size must be an integer >= 1, got True"):
        TokensLoader(block_size=True)
    with pytest.raises(ValueError, match="num_workers must be an integer >= 0, got -1"):
        _loader(datasets["small-shards"], num_workers=-1)


_VALUES = st.one_of(st.none(), st.booleans(), st.integers(-(2**66), 2**66), st.integers(-5, 400),
                    st.text(max_size=4), st.floats(), st.just([]), st.just(2**64 - 33))


@settings(max_examples=120, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_any_edit_of_a_loader_state_is_a_clear_error_or_an_exact_resume(datasets, data) -> None:
    path = datasets["small-shards"]
    loader = _loader(path, batch=3)
    list(itertools.islice(loader, data.draw(st.integers(0, 2 * len(loader)))))
    state = loader.state_dict()
    key = data.draw(st.sampled_from(sorted(state)))
    if data.draw(st.booleans()):
        del state[key]
    else:
        state[key] = data.draw(_VALUES)
    fresh = _loader(path, batch=3)
    try:
        fresh.load_state_dict(state)
    except ValueError as e:
        assert "\n" not in str(e) and "loader state" in str(e)
        return
    ds = fresh.dataset
    epoch, consumed = state["epoch"], state["samples_consumed"]
    if consumed == len(ds):
        epoch, consumed = epoch + 1, 0
    samples = epoch_order(len(ds), ds.seed, epoch, ds.shuffle)(np.arange(consumed, len(ds)))
    want = ds.read_blocks(samples)["input_ids"] if len(samples) else np.zeros((0, BLOCK), np.int64)
    got = [b.numpy() for b in fresh]
    assert np.array_equal(np.concatenate(got) if got else np.zeros((0, BLOCK), np.int64), want)


def test_a_mixture_of_two_tokenizers_is_refused_naming_both(datasets, tmp_path) -> None:
    import json
    import shutil

    other = tmp_path / "other"
    shutil.copytree(datasets["small-shards"], other)
    index = json.loads((other / "index.json").read_text())
    index["tokenizer"] = {**index["tokenizer"], "type": "tiktoken", "fingerprint": "abc"}
    index.pop("fingerprint", None)  # derived from the entries; recomputed on load
    (other / "index.json").write_text(json.dumps(index))
    from llm.data import CombinedStreamingDataset

    a, b = (StreamingDataset(p, item_loader=TokensLoader(block_size=8)) for p in (datasets["small-shards"], other))
    with pytest.raises(ValueError, match=r"datasets\[1\] \(.*other\) was tokenized with .*tiktoken.* but datasets\[0\] "
                                         r"\(.*\) with .*simple.*; mix datasets made with one tokenizer"):
        CombinedStreamingDataset([a, b])


@pytest.mark.skipif(torch.cuda.is_available(), reason="pins for real where a GPU is present")
def test_pin_memory_without_a_gpu_only_warns(datasets) -> None:
    ds = StreamingDataset(datasets["small-shards"], item_loader=TokensLoader(block_size=8))
    with pytest.warns(UserWarning, match="pin_memory"):
        loader = StreamingDataLoader(ds, batch_size=2, num_workers=2, pin_memory=True)
        first = next(iter(loader))
    assert first.shape == (2, 8)


@pytest.mark.parametrize("how", ["break", "held"])
def test_a_threaded_loader_left_mid_epoch_exits_quietly(datasets, how) -> None:
    import subprocess
    import sys
    import textwrap

    body = "for i, b in enumerate(loader):\n    if i == 3:\n        break" if how == "break" else \
        "it = iter(loader)\nfor _ in range(3):\n    next(it)"
    script = textwrap.dedent(f"""
        from llm.data import StreamingDataLoader, StreamingDataset, TokensLoader
        ds = StreamingDataset({str(datasets["small-shards"])!r}, item_loader=TokensLoader(block_size=16), shuffle=True)
        loader = StreamingDataLoader(ds, batch_size=2, num_workers=2)
    """) + body + "\n"
    src = str(Path(__file__).resolve().parents[2] / "src")
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                          env={"PYTHONPATH": src, "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 0 and proc.stderr == ""
