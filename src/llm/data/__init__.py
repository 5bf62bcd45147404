"""The data side of `llm`: prepare token and item shards (`optimize`, `map`) and stream them, exactly resumable.

Names are imported lazily so that light users (the `optimize` worker processes,
the CLI's argument parsing) do not pay for importing torch.
"""

from __future__ import annotations

import importlib
from typing import Any

# `optimize` is lazy too (it was eager): its module pulls in encryption, manifests and the shard writers,
# ~0.2 s that `llm-data dedup` and a dedup_corpus process do not need. `llm.data.optimize` is still the
# function: importing the submodule `llm.data.shards.prepare.optimize` binds the name on `prepare`, not here.
_EXPORTS = {
    "optimize": "llm.data.shards.prepare.optimize",
    "TokensLoader": "llm.data.shards.format.loaders",
    "ItemsLoader": "llm.data.shards.format.loaders",
    "StreamingDataset": "llm.data.shards.read.dataset",
    "CombinedStreamingDataset": "llm.data.shards.mix.combined",
    "StreamingDataLoader": "llm.data.shards.read.loader",
    "train_test_split": "llm.data.shards.plan.splits",
    "StreamingTextDataModule": "llm.data.text.stream",
    "StreamingTextDataset": "llm.data.text.stream",
    "load_tokenizer": "llm.data.tokenize.tokenizers",
    "as_tokenizer": "llm.data.tokenize.foreign",
    "map": "llm.data.shards.prepare.map",
    "MapError": "llm.data.shards.prepare.map",
    "OptimizeError": "llm.data.shards.prepare.optimize",
    "collate_items": "llm.data.shards.read.collate",
    "Encryption": "llm.data.shards.format.encryption",
    "FernetEncryption": "llm.data.shards.format.encryption",
    "merge_datasets": "llm.data.shards.prepare.merge",
    "dedup_corpus": "llm.data.corpus_dedup.pipeline",  # `llm.data.dedup` is the on-the-fly source's module
    # the errors a loader's options can raise, to catch by name: a metrics port in use, a stalled data wait
    "MetricsPortError": "llm.data.metrics_export",
    "DataStallError": "llm.data.watchdog",
}

__all__ = sorted(_EXPORTS)


def __dir__() -> list[str]:
    """The lazily exported names too: tab completion and `dir(llm.data)` show what users can import."""
    return sorted({*globals(), *_EXPORTS})


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if name == "Machine":  # LitData's cloud machine type: the sentence says what to use instead
        from llm.data.shards.prepare.lightning_cloud import machine_import_error

        raise machine_import_error()
    if module is None:
        raise AttributeError(f"module 'llm.data' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
