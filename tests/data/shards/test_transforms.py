"""`transform=` and subclasses overriding `__getitem__` apply everywhere: ds[i], slices, the loader's workers (threads and processes), a plain iteration."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from llm.data import StreamingDataLoader, StreamingDataset, TokensLoader, optimize

BLOCK = 17


def _item(i: int) -> dict:
    return {"i": i, "name": f"item {i}"}


def _doc(i: int) -> np.ndarray:
    return np.arange(i * 7, i * 7 + 23) % 1000


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("transforms")
    optimize(_item, list(range(120)), str(root / "items"), chunk_bytes="1KB", num_workers=0, progress=False)
    optimize(_doc, list(range(120)), str(root / "tokens"), item_loader=TokensLoader(), chunk_bytes="1KB",
             num_workers=0, progress=False)
    return {"items": str(root / "items"), "tokens": str(root / "tokens")}


def times_ten(sample):
    """A transform for both kinds: items become {i, tag}, token blocks become {input, target}."""
    if isinstance(sample, dict):
        return {"i": sample["i"] * 10, "tag": len(sample["name"])}
    return {"input": sample[:-1] * 10, "target": sample[1:]}


class TimesTen(StreamingDataset):
    """The LitData way: a subclass whose __getitem__ changes each sample."""

    def __getitem__(self, index):
        return times_ten(super().__getitem__(index))


def make(folders: dict, kind: str, how: str, **kw) -> StreamingDataset:
    loader = TokensLoader(block_size=BLOCK) if kind == "tokens" else None
    if how == "transform":
        return StreamingDataset(folders[kind], item_loader=loader, transform=times_ten, **kw)
    return TimesTen(folders[kind], item_loader=loader, **kw)


def expected_batches(folders: dict, kind: str, batch: int, shuffle: bool) -> list[dict]:
    """What the loader must give: ds[i] of the plain dataset, transformed, in plan order, collated."""
    plain = StreamingDataset(folders[kind], item_loader=TokensLoader(block_size=BLOCK) if kind == "tokens" else None,
                             shuffle=shuffle, seed=3)
    order = plain.epoch_permutation(0)(np.arange(len(plain))).tolist()
    samples = [times_ten(plain[i]) for i in order]
    from torch.utils.data import default_collate

    return [default_collate(samples[k : k + batch]) for k in range(0, len(samples), batch)]


def same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(torch.as_tensor(a[k]), torch.as_tensor(b[k])) for k in a)


@pytest.mark.parametrize("kind", ["items", "tokens"])
@pytest.mark.parametrize("how", ["transform", "subclass"])
@pytest.mark.parametrize("workers,backend", [(0, "threads"), (2, "threads"), (0, "processes"), (2, "processes")])
def test_the_loader_applies_it_in_workers(folders, kind, how, workers, backend):
    ds = make(folders, kind, how, shuffle=True, seed=3)
    assert ds.reads_per_sample()
    loader = StreamingDataLoader(ds, batch_size=8, num_workers=workers, worker_backend=backend)
    got = list(loader)
    want = expected_batches(folders, kind, 8, shuffle=True)
    assert len(got) == len(want) == len(loader) and all(same(g, w) for g, w in zip(got, want))


@pytest.mark.parametrize("kind", ["items", "tokens"])
@pytest.mark.parametrize("how", ["transform", "subclass"])
def test_random_access_slices_and_plain_iteration_apply_it(folders, kind, how):
    ds = make(folders, kind, how)
    plain = StreamingDataset(folders[kind], item_loader=TokensLoader(block_size=BLOCK) if kind == "tokens" else None)
    assert same(ds[5], times_ten(plain[5])) and same(ds[-1], times_ten(plain[len(plain) - 1]))
    assert all(same(a, times_ten(b)) for a, b in zip(ds[3:40:4], plain[3:40:4]))
    assert all(same(a, times_ten(plain[i])) for i, a in enumerate(ds))  # iterated on its own
    batches = list(DataLoader(ds, batch_size=10, num_workers=2))  # a plain torch DataLoader, worker processes
    assert sum(len(next(iter(b.values()))) for b in batches) == len(plain)


def test_auto_backend_and_collate_fn_for_token_transforms(folders):
    ds = make(folders, "tokens", "transform")
    assert StreamingDataLoader(ds, batch_size=4, num_workers=2).worker_backend == "threads"  # tensor ops: threads
    plain = StreamingDataset(folders["tokens"], item_loader=TokensLoader(block_size=BLOCK))
    assert StreamingDataLoader(plain, batch_size=4, num_workers=2).worker_backend == "threads"
    with pytest.raises(ValueError, match="collate_fn is only used"):
        StreamingDataLoader(plain, batch_size=4, collate_fn=list)
    firsts = next(iter(StreamingDataLoader(ds, batch_size=4, collate_fn=lambda xs: [x["target"][0] for x in xs])))
    assert [int(x) for x in firsts] == [int(plain[i][1]) for i in range(4)]
    with pytest.raises(TypeError, match="transform must be a callable.*got 'upper'"):
        StreamingDataset(folders["items"], transform="upper")
    chained = StreamingDataset(folders["items"], transform=[times_ten, lambda s: s["i"] + 1])  # LitData takes a list
    assert chained[4] == 41 and list(StreamingDataLoader(chained, batch_size=3, num_workers=2))[0].tolist() == [1, 11, 21]


def test_a_transform_and_a_subsample_resume_together(folders):
    def run(state, steps, workers):
        ds = StreamingDataset(folders["items"], transform=times_ten, subsample=0.5, shuffle=True)
        loader = StreamingDataLoader(ds, batch_size=4, num_workers=workers)
        if state:
            loader.load_state_dict(state)
        out = []
        for batch in loader:
            out.append(batch["i"].tolist())
            if len(out) == steps:
                break
        return out, loader.state_dict()

    everything, _ = run(None, None, 0)
    head, state = run(None, 5, 2)
    tail, _ = run(state, None, 0)
    assert head + tail == everything and all(i % 10 == 0 for b in everything for i in b)
