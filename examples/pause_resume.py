"""LitData's pause & resume: save `dataloader.state_dict()` with torch.save, load it into a new loader.

Here the state is a few integers (epoch, samples consumed, seed, fingerprint): the resumed loader
continues with exactly the batches the first one would have given next, with any num_workers.

Run: python examples/pause_resume.py
"""

import tempfile

import numpy as np
import torch

from llm.data import StreamingDataLoader, StreamingDataset, TokensLoader, optimize


def tokenize(index):
    rng = np.random.default_rng(index)
    return rng.integers(0, 50_000, size=int(rng.integers(50, 500)))  # one document's token ids


def make_loader(folder, num_workers):
    dataset = StreamingDataset(folder, item_loader=TokensLoader(block_size=129), shuffle=True, seed=42)
    return StreamingDataLoader(dataset, batch_size=8, num_workers=num_workers)


def main(root: str) -> None:
    folder = f"{root}/tokens"
    optimize(fn=tokenize, inputs=list(range(400)), output_dir=folder, item_loader=TokensLoader(),
             chunk_bytes="64KB", num_workers=2, progress=False)

    reference = [b.clone() for b in make_loader(folder, num_workers=2)]

    dataloader = make_loader(folder, num_workers=2)
    for batch_idx, batch in enumerate(dataloader):
        assert torch.equal(batch, reference[batch_idx])  # ... a training step on `batch` ...
        if batch_idx == 9:
            torch.save(dataloader.state_dict(), f"{root}/dataloader_state.pt")
            break  # the job is preempted here

    resumed = make_loader(folder, num_workers=0)  # another worker count is fine
    resumed.load_state_dict(torch.load(f"{root}/dataloader_state.pt"))
    rest = list(resumed)
    assert all(torch.equal(a, b) for a, b in zip(rest, reference[10:])) and len(rest) == len(reference) - 10
    print(f"resumed after batch 9: the next {len(rest)} batches are the ones the uninterrupted run saw")


if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as root:
        main(root)
