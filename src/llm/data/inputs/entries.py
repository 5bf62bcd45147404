"""`SourceEntry`: one `datasets:` entry of a `stream_lm` mixture (a text source), as the YAML gives it."""

from __future__ import annotations

from typing import Literal, Protocol

from pydantic import BaseModel, ConfigDict, model_validator

# keys that make a datasets: entry a text source (else it is a fine-tuning entry: path, type)
SOURCE_KEYS = frozenset({"data_source", "dataset_path", "dataset_name", "dataset_config", "dataset_split", "text_column"})


def path_stem(path: str) -> str:
    """`wiki` for `data/wiki.jsonl.gz`, `org/set` -> `set`: a readable name for a path."""
    name = path.rstrip("/").replace("\\", "/").split("/")[-1]
    while "." in name and not name.startswith("."):
        name = name.rsplit(".", 1)[0]
    return name or path


class NamedEntry(Protocol):
    """A `datasets:` entry of either kind (`SourceEntry`, the SFT wing's `DatasetEntry`): each says its own name."""

    def accounting_name(self) -> str: ...


def entry_name(entry: NamedEntry) -> str:
    """A datasets: entry's name in the per-source accounting: `name`, else its path's stem."""
    return entry.accounting_name()


class SourceEntry(BaseModel):
    """One `datasets:` entry of a `stream_lm` mixture: a text source with the `data:` section's source keys.

    `path` is accepted for `dataset_path` (the SFT entries' word); giving both is an error.
    """

    model_config = ConfigDict(extra="forbid")

    # dedup_*: deduplicated against the mixture's one seen-set (the data: section's dedup keys)
    data_source: Literal["local", "hf", "dedup_local", "dedup_hf"] = "local"
    dataset_path: str = ""
    dataset_name: str = ""
    dataset_config: str | None = None
    dataset_split: str = "train"
    text_column: str = "text"
    name: str | None = None  # the entry's name in the per-source accounting (default: its path's stem)

    def accounting_name(self) -> str:
        return self.name or path_stem(self.dataset_path or self.dataset_name)

    @model_validator(mode="before")
    @classmethod
    def _shared_dedup_keys(cls, value: object) -> object:
        if isinstance(value, dict):
            for key in ("seen_hashes_path", "write_seen_hashes", "hash_algo"):
                if key in value:
                    raise ValueError(
                        f"{key} is not a datasets entry key: every dedup_* entry of a mixture shares one "
                        f"seen-set, set {key} in the data: section"
                    )
            if "path" in value:
                if "dataset_path" in value:
                    raise ValueError("give path or dataset_path (the same key), not both")
                value = {**value, "dataset_path": value["path"]}
                del value["path"]
        return value
