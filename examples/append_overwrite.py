"""LitData's `mode="append"` / `mode="overwrite"`: grow a dataset, or replace it.

Run: python examples/append_overwrite.py
"""

import tempfile

from llm.data import StreamingDataset, optimize


def compress(index):
    return (index, index**2)


def main(root: str) -> None:
    out = f"{root}/squares"
    optimize(fn=compress, inputs=list(range(100)), output_dir=out, chunk_bytes="64MB", num_workers=1, progress=False)
    assert len(StreamingDataset(out)) == 100

    optimize(fn=compress, inputs=list(range(100, 200)), output_dir=out, chunk_bytes="64MB", num_workers=1,
             mode="append", progress=False)
    ds = StreamingDataset(out)
    assert len(ds) == 200 and ds[150] == (150, 22500)

    optimize(fn=compress, inputs=list(range(1000, 1050)), output_dir=out, chunk_bytes="64MB", num_workers=1,
             mode="overwrite", progress=False)
    ds = StreamingDataset(out)
    assert len(ds) == 50 and ds[0] == (1000, 1000000)
    print("append: 200 items; overwrite: 50 items")


if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as root:
        main(root)
