"""Pydantic configuration models for the YAML sections (`data:`, `model:`, `training:`, ...)."""

from __future__ import annotations

import hashlib
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

# "optimized": token shards made by `llm-data optimize` (read by the trainer, not a text source)
BUILTIN_SOURCES = ("local", "hf", "dedup_local", "dedup_hf", "optimized")
FAST_HASHES = ("xxh3_128",)


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

    @field_validator("hash_algo")
    @classmethod
    def _check_hash_algo(cls, value: str) -> str:
        if value in FAST_HASHES or value in hashlib.algorithms_available:
            return value
        valid = ", ".join(sorted({*FAST_HASHES, *hashlib.algorithms_guaranteed}))
        raise ValueError(f"hash_algo {value!r} is not a hashlib algorithm or xxh3_128; use one of: {valid}")

    @model_validator(mode="after")
    def _check_source(self) -> DataConfig:
        from llm.data.text.sources import SOURCE_REGISTRY

        if self.data_source not in BUILTIN_SOURCES and self.data_source not in SOURCE_REGISTRY:
            valid = ", ".join([*BUILTIN_SOURCES, *SOURCE_REGISTRY.custom_names()])
            raise ValueError(
                f"data_source {self.data_source!r} is not known; use one of: {valid} "
                "(or register it with SOURCE_REGISTRY.register)"
            )
        if self.data_source in ("local", "dedup_local", "optimized") and not self.dataset_path:
            raise ValueError(f"dataset_path is required when data_source={self.data_source!r}")
        if self.data_source in ("hf", "dedup_hf") and not self.dataset_name:
            raise ValueError(f"dataset_name is required when data_source={self.data_source!r}")
        if self.tokenizer_type != "simple" and not self.tokenizer_path:
            raise ValueError(
                f"tokenizer_path is required when tokenizer_type={self.tokenizer_type!r}"
            )
        if self.write_seen_hashes and not self.seen_hashes_path:
            raise ValueError("seen_hashes_path is required when write_seen_hashes is true")
        self._check_extra_keys(SOURCE_REGISTRY.declared_keys(self.data_source))
        return self

    def _check_extra_keys(self, allowed: frozenset[str] | None) -> None:
        extra = sorted(self.model_extra or {})
        if allowed is None:  # a custom source that did not say which keys it reads
            return
        unknown = [k for k in extra if k not in allowed]
        if unknown:
            valid = ", ".join([*type(self).model_fields, *sorted(allowed)])
            raise ValueError(f"unknown data key {unknown[0]!r}; valid keys are: {valid}")

    def tokenizer_spec(self) -> str:
        """The spec string for `llm.data.tokenizers.load_tokenizer`."""
        return "simple" if self.tokenizer_type == "simple" else str(self.tokenizer_path)

    def extra(self, key: str, default: Any = None) -> Any:
        """A key passed through for a custom source (e.g. `dataset_bucket`)."""
        return (self.model_extra or {}).get(key, default)



class ModelConfig(BaseModel):
    """The `model:` section: the decoder-only transformer's shape (vocabulary from the tokenizer)."""

    model_config = ConfigDict(extra="forbid")

    d_model: int = Field(default=128, gt=0)
    n_layers: int = Field(default=2, gt=0)
    n_heads: int = Field(default=4, gt=0)
    d_ff: int | None = Field(default=None, gt=0)
    dropout: float = Field(default=0.0, ge=0.0, lt=1.0)
    vocab_size: int | None = Field(default=None, gt=0)

    @model_validator(mode="after")
    def _check_heads(self) -> ModelConfig:
        if self.d_model % self.n_heads:
            raise ValueError(f"model.d_model ({self.d_model}) must be divisible by model.n_heads ({self.n_heads})")
        return self


class TrainingConfig(BaseModel):
    """The `training:` section: optimisation, schedule, device and precision."""

    model_config = ConfigDict(extra="forbid")

    batch_size: int = Field(default=8, gt=0)
    epochs: int = Field(default=1, gt=0)
    lr: float = Field(default=3e-4, gt=0)
    min_lr_ratio: float = Field(default=0.1, ge=0.0, le=1.0)
    weight_decay: float = Field(default=0.1, ge=0.0)
    warmup_steps: int = Field(default=0, ge=0)
    grad_clip: float = Field(default=1.0, ge=0.0)
    max_steps: int | None = Field(default=None, gt=0)
    seed: int = 42
    device: str = "auto"
    amp_dtype: Literal["bf16", "fp16", "fp32"] = "bf16"
    compile: bool = False
    deterministic: bool = False
    log_interval_steps: int = Field(default=1, gt=0)
    val_interval_steps: int = Field(default=0, ge=0)
    val_batches: int = Field(default=8, gt=0)

    @field_validator("device")
    @classmethod
    def _check_device(cls, value: str) -> str:
        if value == "auto" or value.split(":")[0] in ("cpu", "cuda", "mps"):
            return value
        raise ValueError(f"training.device {value!r} is not one of auto, cpu, cuda, cuda:N, mps")


class CheckpointConfig(BaseModel):
    """The `checkpoint:` section: where and how often to save, and what to resume from."""

    model_config = ConfigDict(extra="forbid")

    checkpoint_dir: str | None = "checkpoints"
    resume_from_checkpoint: str | None = None
    save_interval_steps: int = Field(default=0, ge=0)
    keep_last_n: int | None = Field(default=3, gt=0)


class TrainConfig(BaseModel):
    """A whole `llm-train` YAML file: sections data, model, training, checkpoint."""

    model_config = ConfigDict(extra="forbid")

    data: DataConfig
    model: ModelConfig = Field(default_factory=ModelConfig)
    training: TrainingConfig = Field(default_factory=TrainingConfig)
    checkpoint: CheckpointConfig = Field(default_factory=CheckpointConfig)
