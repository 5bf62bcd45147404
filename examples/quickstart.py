"""LitData's quick start with `llm.data` in place of `litdata`: optimize items, then stream them.

Run: python examples/quickstart.py   (writes to a temporary folder)
"""

import tempfile

import numpy as np

from llm.data import StreamingDataLoader, StreamingDataset, optimize


def random_item(index):
    rng = np.random.default_rng(index)
    return {"index": index, "vector": rng.random(8).astype(np.float32), "class": int(rng.integers(10)),
            "caption": f"item number {index}"}


def main(root: str) -> None:
    optimize(fn=random_item, inputs=list(range(1000)), output_dir=f"{root}/my_optimized_dataset",
             num_workers=2, chunk_bytes="64KB", progress=False)

    dataset = StreamingDataset(f"{root}/my_optimized_dataset", shuffle=True)
    sample = dataset[50]
    assert sample["index"] == 50 and sample["caption"] == "item number 50"
    print("dataset[50]:", sample["index"], sample["class"], sample["caption"], sample["vector"][:3])

    dataloader = StreamingDataLoader(dataset, batch_size=64, num_workers=2)
    seen = 0
    for batch in dataloader:  # default_collate: tensors for numbers and arrays, lists for strings
        vectors, classes = batch["vector"], batch["class"]
        seen += len(classes)
    assert seen == len(dataset) == 1000 and vectors.shape[1] == 8
    print(f"one epoch: {seen} samples in {len(dataloader)} batches")


if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as root:
        main(root)
