"""LitData's `subsample` and `train_test_split` with `llm.data` in place of `litdata`.

    dataset = StreamingDataset("s3://my-bucket/my-data", subsample=0.01)
    train_dataset, val_dataset, test_dataset = train_test_split(dataset, splits=[0.3, 0.2, 0.5])

Subsets are chosen by the seed, shard by shard; each split is a dataset of its own (len, ds[i],
shuffle, a loader and its exact resume state).

Run: python examples/subsample_split.py   (writes to a temporary folder)
"""

import tempfile

import torch

from llm.data import StreamingDataLoader, StreamingDataset, optimize, train_test_split


def make_item(index):
    return {"index": index, "features": torch.full((4,), float(index))}


def main(root: str) -> None:
    optimize(fn=make_item, inputs=list(range(1000)), output_dir=f"{root}/my-data", chunk_bytes="16KB",
             num_workers=2, progress=False)

    # A deterministic 10% of the samples (by seed); len() says so.
    small = StreamingDataset(f"{root}/my-data", subsample=0.1, seed=42)
    again = StreamingDataset(f"{root}/my-data", subsample=0.1, seed=42)
    assert len(small) == 100 and [s["index"] for s in small[:]] == [s["index"] for s in again[:]]
    print(f"subsample=0.1: {len(small)} of 1000 samples, e.g. {[s['index'] for s in small[:5]]}")

    # Values above 1 repeat samples: 2.5 = every sample twice, and half of them a third time.
    assert len(StreamingDataset(f"{root}/my-data", subsample=2.5)) == 2500

    dataset = StreamingDataset(f"{root}/my-data", shuffle=True)
    train_dataset, val_dataset, test_dataset = train_test_split(dataset, splits=[0.3, 0.2, 0.5])
    sizes = [len(train_dataset), len(val_dataset), len(test_dataset)]
    indices = [{s["index"] for s in split[:]} for split in (train_dataset, val_dataset, test_dataset)]
    assert sizes == [300, 200, 500] and set.union(*indices) == set(range(1000)) and sum(map(len, indices)) == 1000
    print(f"train/val/test: {sizes} samples, disjoint, every sample in one of them")

    loader = StreamingDataLoader(train_dataset, batch_size=32, num_workers=2)
    seen = [int(i) for batch in loader for i in batch["index"]]
    assert sorted(seen) == sorted(indices[0])
    state = loader.state_dict()  # records the split: a state of the train split is refused by the val split
    print(f"one epoch of the train split: {len(seen)} samples; its state records split={state['split']}")


if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as root:
        main(root)
