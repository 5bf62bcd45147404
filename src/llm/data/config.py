"""`DataConfig`: the data layer's input, the `data:` section of a run (where text comes from, how it is cut)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from llm.data.text.dedup import check_hash_algo

# "optimized": token shards made by `llm-data optimize` (read by the trainer, not a text source)
BUILTIN_SOURCES = ("local", "hf", "dedup_local", "dedup_hf", "optimized")
# what each built-in source needs, checked when the source is built or a run starts
_REQUIRED = {"local": "dataset_path", "dedup_local": "dataset_path", "optimized": "dataset_path",
             "hf": "dataset_name", "dedup_hf": "dataset_name"}


SFT_TYPES = ("alpaca", "chat", "completion")
MIXING_STRATEGIES = ("round_robin", "weighted", "random")


class DatasetEntry(BaseModel):
    """One `datasets:` / `test_datasets:` entry, with Axolotl's keys: a local path (or glob) or a hub id."""

    model_config = ConfigDict(extra="forbid")

    path: str
    type: str = "completion"
    split: str = "train"
    data_files: str | list[str] | None = None
    name: str | None = None  # the hub dataset's subset (`load_dataset(path, name)`)

    @field_validator("type")
    @classmethod
    def _check_type(cls, value: str) -> str:
        if value not in SFT_TYPES:
            raise ValueError(f"dataset type {value!r} is not known; use one of: {', '.join(SFT_TYPES)}")
        return value


class SourceEntry(BaseModel):
    """One `datasets:` entry of a `stream_lm` mixture: a text source with the `data:` section's source keys."""

    model_config = ConfigDict(extra="forbid")

    # dedup_*: deduplicated against the mixture's one seen-set (the data: section's dedup keys)
    data_source: Literal["local", "hf", "dedup_local", "dedup_hf"] = "local"
    dataset_path: str = ""
    dataset_name: str = ""
    dataset_config: str | None = None
    dataset_split: str = "train"
    text_column: str = "text"

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
        return value


class DataConfig(BaseModel):
    """The `data:` section: where the text comes from and how it is cut into blocks."""

    # extra="allow" so keys declared by a registered custom source pass through;
    # every other unknown key is rejected by _check_extra_keys below.
    model_config = ConfigDict(extra="allow", validate_assignment=False)

    data_source: str = "local"
    dataset_path: str = ""
    dataset_name: str = ""
    dataset_config: str | None = None
    dataset_split: str = "train"
    text_column: str = "text"
    # s3:// dataset_path: endpoint, keys, retries (docs/storage.md). Left out of dumps, so keys never
    # land in a checkpoint and new keys or another endpoint do not block a resume (the
    # source's fingerprint names the objects and their ETags)
    storage_options: dict[str, Any] | None = Field(default=None, exclude=True)
    max_seq_len: int = Field(default=512, gt=0)
    steps_per_epoch: int | None = Field(default=None, gt=0)
    seen_hashes_path: str | None = None
    write_seen_hashes: bool = False
    hash_algo: str = "sha256"
    tokenizer_type: Literal["simple", "hf", "tiktoken"] = "simple"
    tokenizer_path: str | None = None
    val_dataset_path: str | None = None
    num_workers: int = Field(default=0, ge=0)
    # where local text is tokenized once for --task lm and validation; None: <checkpoint_dir>/.data
    cache_dir: str | None = None
    # fine-tuning (--task sft), Axolotl's names
    datasets: list[DatasetEntry | SourceEntry] | None = None  # sft records, or text sources to mix
    test_datasets: list[DatasetEntry] | None = None
    train_on_inputs: bool = False
    sample_packing: bool = False
    streaming: bool = True
    streaming_dataset_mixing_strategy: Literal["round_robin", "weighted", "random"] = "round_robin"
    streaming_mixing_weights: list[float] | None = None
    streaming_buffer_per_dataset: int = Field(default=1000, gt=0)

    @field_validator("hash_algo")
    @classmethod
    def _check_hash_algo(cls, value: str) -> str:
        return check_hash_algo(value)  # the one check, dedup's

    @model_validator(mode="after")
    def _check_source(self) -> DataConfig:
        # the dataset name/path is not checked here: the guide builds a DataConfig first and
        # fills it in later (apply_to_config); check_source() runs when the source is built
        from llm.data.text.registry import SOURCE_REGISTRY

        if self.data_source not in BUILTIN_SOURCES and self.data_source not in SOURCE_REGISTRY:
            valid = ", ".join([*BUILTIN_SOURCES, *SOURCE_REGISTRY.custom_names()])
            raise ValueError(
                f"data_source {self.data_source!r} is not known; use one of: {valid} "
                "(or register it with SOURCE_REGISTRY.register)"
            )
        if self.tokenizer_type != "simple" and not self.tokenizer_path:
            raise ValueError(
                f"tokenizer_path is required when tokenizer_type={self.tokenizer_type!r}"
            )
        if self.write_seen_hashes and not self.seen_hashes_path:
            raise ValueError("seen_hashes_path is required when write_seen_hashes is true")
        self._check_extra_keys(SOURCE_REGISTRY.declared_keys(self.data_source))
        if self.datasets and len(self.datasets) > 1:
            from llm.data.text.mixing import check_weights

            check_weights(self.streaming_mixing_weights, len(self.datasets), self.streaming_dataset_mixing_strategy)
        return self

    def _check_extra_keys(self, allowed: frozenset[str] | None) -> None:
        extra = sorted(self.model_extra or {})
        if allowed is None:  # a custom source that did not declare its keys: checked when built
            return
        unknown = [k for k in extra if k not in allowed]
        if unknown:
            valid = ", ".join([*type(self).model_fields, *sorted(allowed)])
            raise ValueError(f"unknown data key {unknown[0]!r}; valid keys are: {valid}")

    def check_source(self) -> DataConfig:
        """Raise the guide's sentence when the source lacks its dataset (`dataset_path is required when ...`)."""
        if self.datasets:  # fine-tuning entries name their own data
            return self
        key = _REQUIRED.get(self.data_source)
        if key and not getattr(self, key):
            raise ValueError(f"{key} is required when data_source={self.data_source!r}")
        return self

    def tokenizer_spec(self) -> str:
        """The spec string for `llm.data.tokenize.tokenizers.load_tokenizer`."""
        return "simple" if self.tokenizer_type == "simple" else str(self.tokenizer_path)

    def extra(self, key: str, default: Any = None) -> Any:
        """A key passed through for a custom source (e.g. `dataset_bucket`)."""
        return (self.model_extra or {}).get(key, default)
