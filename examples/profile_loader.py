"""LitData's `StreamingDataLoader(..., profile_batches=5)` with `llm.data`: a Chrome trace of the first batches.

The trace (`result.json`, Trace Event Format) has a span per chunk read, per item decoded, per batch
collated and per batch the training loop waited for, on the thread or worker process that did it.
Open it in chrome://tracing or https://ui.perfetto.dev.

Run: python examples/profile_loader.py
"""

import json
import tempfile
from collections import Counter

import numpy as np

from llm.data import StreamingDataLoader, StreamingDataset, TokensLoader, optimize


def tokenize(index):
    rng = np.random.default_rng(index)
    return rng.integers(0, 50_000, size=int(rng.integers(50, 500)))


def main(root: str) -> None:
    optimize(fn=tokenize, inputs=list(range(400)), output_dir=f"{root}/tokens", item_loader=TokensLoader(),
             chunk_bytes="64KB", num_workers=2, progress=False)
    dataset = StreamingDataset(f"{root}/tokens", item_loader=TokensLoader(block_size=129), shuffle=True)
    loader = StreamingDataLoader(dataset, batch_size=8, num_workers=2, profile_batches=5, profile_dir=root)
    for _ in loader:
        pass  # ... a training step ...

    with open(f"{root}/result.json") as f:
        events = json.load(f)["traceEvents"]
    spans = Counter(e["name"] for e in events if e["ph"] == "X")
    threads = {e["args"]["name"] for e in events if e["name"] == "thread_name"}
    assert spans["wait"] == 5 and spans["read"] >= 1
    print(f"result.json: {dict(spans)} spans on {sorted(threads)}")


if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as root:
        main(root)
