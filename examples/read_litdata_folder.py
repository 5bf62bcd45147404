"""A folder LitData optimized, streamed by llm.data in place: no re-preparing (docs/interop.md).

Needs litdata (`pip install --no-deps litdata`); prints a note and exits 0 without it.
Run: python examples/read_litdata_folder.py
"""

import importlib.util
import tempfile

import numpy as np
import torch


def tokenize(index):
    return torch.arange(index, index + 300, dtype=torch.int32)


def main(root: str) -> None:
    import litdata

    from llm.data import StreamingDataLoader, StreamingDataset, TokensLoader

    litdata.optimize(fn=tokenize, inputs=list(range(50)), output_dir=f"{root}/lit", chunk_bytes="16KB",
                     item_loader=litdata.TokensLoader(), num_workers=1)
    theirs = litdata.StreamingDataset(f"{root}/lit", item_loader=litdata.TokensLoader(block_size=128))
    ours = StreamingDataset(f"{root}/lit", item_loader=TokensLoader(block_size=128), shuffle=True)
    assert len(ours) == len(theirs)
    assert all(np.array_equal(ours[i].numpy(), np.asarray(theirs[i])) for i in range(len(ours)))
    loader = StreamingDataLoader(ours, batch_size=4)
    next(iter(loader))
    print(f"{len(ours)} blocks, block i = LitData's ds[i]; loader state: {loader.state_dict()}")


if __name__ == "__main__":
    if importlib.util.find_spec("litdata") is None:
        print("litdata is not installed: nothing to read (pip install --no-deps litdata)")
    else:
        with tempfile.TemporaryDirectory() as root:
            main(root)
