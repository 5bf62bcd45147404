"""The samples the interop tests write with the peers' own writers (importable by their worker processes)."""

from __future__ import annotations

import numpy as np
import torch


def lit_document(i: int) -> torch.Tensor:
    rng = np.random.default_rng(i)
    return torch.tensor(rng.integers(0, 50_000, size=int(rng.integers(3, 400))), dtype=torch.int32)


def lit_document_u16(i: int) -> np.ndarray:
    return lit_document(i).numpy().astype(np.uint16)


def lit_item(i: int) -> dict:
    from PIL import Image

    rng = np.random.default_rng(i)
    return {
        "index": i, "score": i / 3, "name": f"item {i}", "raw": bytes([i % 256]) * (i % 7 + 1), "flag": i % 2 == 0,
        "vec": rng.random(i % 5 + 1), "grid": rng.integers(0, 9, size=(2, 3)), "ids": torch.arange(i % 6 + 1),
        "mat": torch.ones(2, 2) * i, "image": Image.fromarray(rng.integers(0, 255, (4, 6), dtype=np.uint8)),
    }


def lit_row(i: int) -> dict:
    return {"id": i, "text": f"row {i} " * (i % 4 + 1)}


def lit_nested_item(i: int) -> dict:
    return {"id": i, "spans": [[i, i + 1], [i + 2]]}


MDS_COLUMNS = {"id": "int", "text": "str", "raw": "bytes", "tokens": "ndarray:int32", "fixed": "ndarray:uint16:4",
               "x": "float32", "meta": "json", "image": "png", "pixels": "pil", "blob": "pkl"}


def mds_sample(i: int) -> dict:
    from PIL import Image

    rng = np.random.default_rng(i)
    return {"id": i, "text": f"doc {i}", "raw": bytes([i % 256]) * 5,
            "tokens": rng.integers(0, 1000, size=i % 17 + 1).astype(np.int32),
            "fixed": np.arange(4, dtype=np.uint16) + i, "x": np.float32(i / 7), "meta": {"a": [i, i + 1]},
            "image": Image.fromarray(rng.integers(0, 255, (6, 6, 3), dtype=np.uint8)),
            "pixels": Image.fromarray(rng.integers(0, 255, (4, 5), dtype=np.uint8)), "blob": (i, "x")}


def trainer_document(i: int) -> np.ndarray:
    return (np.arange(20 + 7 * (i % 5)) + 31 * i) % 1000


def trainer_loader(folder, workers: int = 0, ledger=None):
    """The loader the trainer tests hand to torchdata-style loops and to Lightning: 16 batches an epoch."""
    from llm.data import StreamingDataLoader, StreamingDataset, TokensLoader

    ds = StreamingDataset(folder, item_loader=TokensLoader(block_size=32), shuffle=True, seed=7)
    return StreamingDataLoader(ds, batch_size=4, num_workers=workers, ledger=ledger)


def audited_once(ledger) -> int:
    """The ledger's audit (it must pass): how many samples it counts trained exactly once."""
    from llm.data.audit import audit_ledger
    from llm.data.ledger.reader import read_ledger

    report = audit_ledger(read_ledger(ledger))
    assert report.ok, "\n".join(report.lines())
    assert not report.repeated and not report.missing
    return report.once
