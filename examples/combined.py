"""LitData's CombinedStreamingDataset: several datasets mixed by weight, one loader, one resumable state.

Run: python examples/combined.py
"""

import tempfile

import numpy as np

from llm.data import (
    CombinedStreamingDataset,
    StreamingDataLoader,
    StreamingDataset,
    TokensLoader,
    optimize,
)


def web(index):
    return np.full(300, 1)  # every token of a `web` document is 1


def code(index):
    return np.full(300, 2)


def main(root: str) -> None:
    optimize(fn=web, inputs=list(range(200)), output_dir=f"{root}/web", item_loader=TokensLoader(), num_workers=1,
             progress=False)
    optimize(fn=code, inputs=list(range(200)), output_dir=f"{root}/code", item_loader=TokensLoader(), num_workers=1,
             progress=False)
    datasets = [StreamingDataset(f"{root}/{name}", item_loader=TokensLoader(block_size=65), shuffle=True, seed=s)
                for s, name in enumerate(["web", "code"])]
    train_dataset = CombinedStreamingDataset(datasets=datasets, iterate_over_all=False, seed=42, weights=(0.3, 0.7))
    train_dataloader = StreamingDataLoader(train_dataset, batch_size=8, num_workers=2)

    counts = np.zeros(3, dtype=np.int64)
    for batch in train_dataloader:
        counts += np.bincount(batch[:, 0].numpy(), minlength=3)
    share = counts[1] / counts[1:].sum()
    assert abs(share - 0.3) < 0.01, share
    print(f"web share {share:.3f} (weight 0.3); state: {train_dataloader.state_dict()['mixture']['counts']}")


if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as root:
        main(root)
