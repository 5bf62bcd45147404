"""Pydantic configuration models for the YAML sections (`data:`, `model:`, `training:`, ...)."""

from __future__ import annotations

from typing import Literal

from pydantic import ConfigDict, Field, field_validator, model_validator

from llm.training.core.data_config import BUILTIN_SOURCES, DataConfig
from llm.training.core.sections import ConfigModel

__all__ = ["BUILTIN_SOURCES", "CheckpointConfig", "Config", "DataConfig", "LoggingConfig", "ModelConfig", "TrainConfig",
           "TrainingConfig"]

class ModelConfig(ConfigModel):
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


class TrainingConfig(ConfigModel):
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


class CheckpointConfig(ConfigModel):
    """The `checkpoint:` section: where and how often to save, and what to resume from."""

    model_config = ConfigDict(extra="forbid")

    checkpoint_dir: str | None = "checkpoints"
    resume_from_checkpoint: str | None = None
    save_interval_steps: int = Field(default=0, ge=0)
    keep_last_n: int | None = Field(default=3, gt=0)
    ledger: bool = True  # the run ledger, RUN_DIR/ledger/<run>: what every step trained on (docs/proving-a-run.md)
    ledger_loss: bool = True  # each row's mean token loss in the ledger, so a spike maps to documents


class LoggingConfig(ConfigModel):
    """The `logging:` section: what a run serves besides metrics.jsonl (docs/training.md, "Metrics for Prometheus")."""

    model_config = ConfigDict(extra="forbid")

    # the ingest figures for Prometheus on this port + LOCAL_RANK (null: not served; 0: a free port each)
    prometheus_port: int | None = Field(default=None, ge=0, le=65535)
    # all interfaces: a cluster's scraper runs on another machine; 127.0.0.1 keeps the port to this one
    prometheus_host: str = Field(default="0.0.0.0", min_length=1)


class TrainConfig(ConfigModel):
    """A whole `llm-train` YAML file: sections data, model, training, checkpoint, logging."""

    model_config = ConfigDict(extra="forbid")

    data: DataConfig = Field(default_factory=DataConfig)
    model: ModelConfig = Field(default_factory=ModelConfig)
    training: TrainingConfig = Field(default_factory=TrainingConfig)
    checkpoint: CheckpointConfig = Field(default_factory=CheckpointConfig)
    logging: LoggingConfig = Field(default_factory=LoggingConfig)


# The guide's framework calls the whole run's config `Config`.
Config = TrainConfig
