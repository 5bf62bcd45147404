"""`DataConfig`: the data layer's input, the `data:` section of a run (where text comes from, how it is cut)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    ConfigDict,
    Discriminator,
    Field,
    Tag,
    field_validator,
    model_validator,
)

from llm.data.inputs.dedup import check_hash_algo
from llm.data.inputs.entries import SOURCE_KEYS, SourceEntry, entry_name, path_stem
from llm.data.sft.settings import SFT_TYPES, DatasetEntry, SftStreamConfig
from llm.data.text.changes import check_mixture_changes
from llm.data.text.settings import DEFAULT_SEED, MixtureConfig, TextStreamConfig, packing_keys
from llm.training.core.axolotl_keys import close_key
from llm.training.core.errors import ConfigError
from llm.training.core.sections import ConfigModel

__all__ = ["SFT_TYPES", "DataConfig", "DatasetEntry", "SourceEntry"]

# "optimized": token shards made by `llm-data optimize` (read by the trainer, not a text source)
BUILTIN_SOURCES = ("local", "hf", "dedup_local", "dedup_hf", "optimized")
# what each built-in source needs, checked when the source is built or a run starts
_REQUIRED = {"local": "dataset_path", "dedup_local": "dataset_path", "optimized": "dataset_path",
             "hf": "dataset_name", "dedup_hf": "dataset_name"}


def _entry_kind(entry: object) -> str:
    """A datasets: entry with a text source's keys is a `SourceEntry`; any other is a fine-tuning entry."""
    if isinstance(entry, dict):
        return "source" if SOURCE_KEYS & set(entry) else "sft"
    return "source" if isinstance(entry, SourceEntry) else "sft"


class DataConfig(ConfigModel):
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
    # sft records (path, type), or text sources to mix (data_source, dataset_path or path, ...)
    datasets: list[Annotated[Annotated[DatasetEntry, Tag("sft")] | Annotated[SourceEntry, Tag("source")],
                             Discriminator(_entry_kind)]] | None = None
    test_datasets: list[DatasetEntry] | None = None
    # Axolotl's held-out split of the datasets' records without streaming: a fraction < 1 or a count
    val_set_size: int | float = Field(default=0, ge=0)
    train_on_inputs: bool = False
    chat_template: str | None = None  # `type: chat_template` entries' default (Axolotl's top-level key)
    sample_packing: bool = False
    streaming: bool = True
    streaming_dataset_mixing_strategy: Literal["round_robin", "weighted", "random"] = "round_robin"
    streaming_mixing_weights: list[float] | None = None
    streaming_buffer_per_dataset: int = Field(default=1000, gt=0)
    streaming_mixing_unit: str = "records"  # records | tokens: what a weight is a share of
    streaming_mixing_schedule: list[Any] | None = None  # [{step, weights, interpolate?}]: weights by step
    # how text becomes blocks (stream_lm, pretraining_dataset, sft with sample_packing): greedy (None) | best_fit.
    # None when unset, so that checkpoints saved before these keys existed resume under the same config
    packing: str | None = None
    packing_buffer: int | None = None  # best fit's open blocks (None: 64)
    # "allow": a resume may add or remove sources of a mixture (kept ones continue); default "refuse"
    mixture_changes: str = "refuse"
    # global batch ranges [start, end) the run never trains on (llm.training.skip_ranges, docs/training.md)
    skip_batches: list[Any] | None = None
    # ids of documents dropped wherever they would be read, as `llm-train why` prints them: a list, or the
    # path of a file of them (llm.data.skip_documents, docs/proving-a-run.md); kept in every checkpoint
    skip_documents: list[str] | str | None = None
    # the data watchdog (llm.data.watchdog, docs/reliability.md): no batch for this many seconds names what the
    # loader waits for (rank, worker, shard or object, the request in flight); 0: off. "raise": DataStallError
    watchdog_s: float = Field(default=600.0, ge=0)
    watchdog: Literal["log", "raise"] = "log"

    @model_validator(mode="before")
    @classmethod
    def _one_path_key(cls, value: object) -> object:
        # path (the SFT word) and dataset_path name one key of a mixture entry: both is ambiguous
        if isinstance(value, dict):
            for i, entry in enumerate(value.get("datasets") or ()):
                if isinstance(entry, dict) and "path" in entry and "dataset_path" in entry:
                    raise ValueError(f"datasets[{i}] gives both path and dataset_path (the same key); keep one")
        return value

    @model_validator(mode="after")
    def _check_packing(self) -> DataConfig:
        from llm.data.pack.best_fit import check_packing

        check_packing(**packing_keys(self.packing, self.packing_buffer))
        check_mixture_changes(self.mixture_changes)
        return self

    @field_validator("hash_algo")
    @classmethod
    def _check_hash_algo(cls, value: str) -> str:
        return check_hash_algo(value)  # the one check, dedup's

    @model_validator(mode="after")
    def _check_source(self) -> DataConfig:
        # the dataset name/path is not checked here: the guide builds a DataConfig first and
        # fills it in later (apply_to_config); check_source() runs when the source is built
        from llm.data.inputs.registry import SOURCE_REGISTRY

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
            from llm.data.mix.choosers import check_schedule, check_unit, check_weights

            check_unit(self.streaming_mixing_unit)
            n, strategy = len(self.datasets), self.streaming_dataset_mixing_strategy
            if check_schedule(self.streaming_mixing_schedule, n, strategy, self.streaming_mixing_weights) is None:
                check_weights(self.streaming_mixing_weights, n, strategy)
        return self

    def _check_extra_keys(self, allowed: frozenset[str] | None) -> None:
        extra = sorted(self.model_extra or {})
        if allowed is None:  # a custom source that did not declare its keys: checked when built
            return
        unknown = [k for k in extra if k not in allowed]
        if unknown:
            valid = [*type(self).model_fields, *sorted(allowed)]
            close = close_key(unknown[0], valid)
            hint = f" (did you mean {close!r}?)" if close else ""
            raise ValueError(f"unknown data key {unknown[0]!r}{hint}; valid keys are: {', '.join(valid)}")

    def check_source(self) -> DataConfig:
        """Raise the guide's sentence when the source lacks its dataset (`dataset_path is required when ...`)."""
        if self.datasets:  # fine-tuning entries name their own data
            return self
        key = _REQUIRED.get(self.data_source)
        if key and not self.model_dump(include={key})[key]:
            raise ConfigError(f"{key} is required when data_source={self.data_source!r}")
        return self

    def tokenizer_spec(self) -> str:
        """The spec string for `llm.data.tokenize.tokenizers.load_tokenizer`."""
        return "simple" if self.tokenizer_type == "simple" else str(self.tokenizer_path)

    def mixture(self) -> MixtureConfig:
        """How the `datasets:` entries mix (and each entry's name in the per-source accounting)."""
        return MixtureConfig(self.streaming_dataset_mixing_strategy, self.streaming_mixing_weights,
                             self.streaming_buffer_per_dataset, unit=self.streaming_mixing_unit,
                             schedule=self.streaming_mixing_schedule,
                             names=tuple(entry_name(e) for e in self.datasets or ()))

    def source_name(self) -> str:
        """The name of a single (unmixed) source in the per-source accounting: its path's stem."""
        return path_stem(self.dataset_path or self.dataset_name) or self.data_source

    def _stream_keys(self, seed: int) -> dict[str, Any]:
        return {
            "source": self, "tokenizer": self.tokenizer_spec(), "max_seq_len": self.max_seq_len,
            "steps_per_epoch": self.steps_per_epoch, "num_workers": self.num_workers, "text_column": self.text_column,
            "val_dataset_path": self.val_dataset_path, "storage_options": self.storage_options, "seed": seed,
            "mixture_changes": self.mixture_changes, **packing_keys(self.packing, self.packing_buffer),
            "watchdog_s": self.watchdog_s, "watchdog": self.watchdog,
        }

    def text_stream(self, seed: int = DEFAULT_SEED) -> TextStreamConfig:
        """The text stream's typed settings; `seed` is the root seed (the trainer passes training.seed)."""
        return TextStreamConfig(**self._stream_keys(seed))

    def sft_stream(self, seed: int = DEFAULT_SEED) -> SftStreamConfig:
        """The SFT stream's typed settings: the text stream's plus the entries, their mixture and masking."""
        return SftStreamConfig(
            **self._stream_keys(seed), entries=tuple(self.datasets or ()), mixture=self.mixture(),
            train_on_inputs=self.train_on_inputs, sample_packing=self.sample_packing, chat_template=self.chat_template,
        )

    def extra(self, key: str, default: Any = None) -> Any:
        """A key passed through for a custom source (e.g. `dataset_bucket`)."""
        return (self.model_extra or {}).get(key, default)
