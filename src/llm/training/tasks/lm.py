"""The `lm` task: local text files tokenized once into a cached token dataset, served like optimized shards."""

from __future__ import annotations

import hashlib
import json
from typing import Any

from llm.training.tasks.optimized import OptimizedData
from llm.training.tasks.stream_lm import refuse_packing
from llm.training.text_cache import cache_root, prepare_text


class LocalTextData(OptimizedData):
    """`data_source: local` for `--task lm`: `prepare_text` once, then `OptimizedData`'s order and resume.

    The data is identified by the text's content digest (plus column, block length and
    tokenizer), not by the cache entry's shard names: a resume works from a rebuilt
    cache or from another cache folder, as long as the text is the same.
    """

    def __init__(self, config: Any, rank: int, world_size: int):
        data = config.data
        self.prepared = prepare_text(data.dataset_path, data.tokenizer_spec(), data.text_column, cache_root(config))
        self.text_column = data.text_column
        super().__init__(config, rank, world_size, path=self.prepared.path, what=f"data.dataset_path {data.dataset_path}")

    def fingerprint(self) -> dict[str, Any]:
        return {
            "type": "local_text",
            "content_xxh3_128": self.prepared.content_xxh3_128,
            "text_column": self.text_column,
            "block_size": self.dataset.block_size,
            "tokenizer": self.tokenizer.fingerprint(),
        }

    def _data_id(self) -> str:
        return hashlib.sha256(json.dumps(self.fingerprint(), sort_keys=True).encode()).hexdigest()[:32]

    def state_dict(self) -> dict[str, Any]:
        # The loader names its data by the manifest, whose shard names differ between two
        # preparations of the same text; the saved state names the text instead.
        return {**self.loader.state_dict(), "fingerprint": self._data_id()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if not isinstance(state, dict) or state.get("fingerprint") != self._data_id():
            raise ValueError(
                f"the data state was saved for other text (data id {state.get('fingerprint') if isinstance(state, dict) else None!r}, "
                f"this config gives {self._data_id()!r}); resume with the data config it was trained on"
            )
        self.loader.load_state_dict({**state, "fingerprint": self.dataset.fingerprint})


def build_lm_data(config: Any, rank: int, world_size: int) -> OptimizedData:
    """TrainData for `--task lm`: `data_source: local` (prepared once, cached) or `optimized` shards."""
    data = config.data
    refuse_packing(data, "--task lm's prepared blocks")
    if data.data_source == "optimized":
        return OptimizedData(config, rank, world_size)
    if data.data_source != "local":
        raise ValueError(
            f"--task lm reads local files (data.data_source: local) or optimized shards, not "
            f"data_source {data.data_source!r}; use --task stream_lm for streamed sources"
        )
    return LocalTextData(config, rank, world_size)
