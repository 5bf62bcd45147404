"""Typed settings of the fine-tuning wing: a `datasets:` entry (Axolotl's keys) and the SFT stream, which `build()`s it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, field_validator

from llm.data.inputs.entries import path_stem
from llm.data.text.settings import MixtureConfig, TextStreamConfig

if TYPE_CHECKING:  # built on demand: reading a config needs no torch
    from llm.data.sft.stream import StreamingSFTDataModule

SFT_TYPES = ("alpaca", "chat", "chat_template", "completion")


class DatasetEntry(BaseModel):
    """One `datasets:` / `test_datasets:` entry, with Axolotl's keys: a local path (or glob) or a hub id."""

    model_config = ConfigDict(extra="forbid")

    path: str
    type: str = "completion"
    split: str = "train"
    data_files: str | list[str] | None = None
    name: str | None = None  # the hub dataset's subset (`load_dataset(path, name)`)
    # type: chat_template (Axolotl's keys); chat_template: tokenizer_default | chatml | inline Jinja | a template name
    chat_template: str | None = None
    field_messages: str = "messages"
    message_property_mappings: dict[str, str] | None = None  # {role: ..., content: ...}
    message_field_role: str | None = None  # Axolotl's older spelling of the mappings
    message_field_content: str | None = None
    roles_to_train: list[str] = ["assistant"]
    train_on_eos: Literal["turn", "all", "last", "none"] = "turn"

    def accounting_name(self) -> str:
        """Its name in the per-source accounting (`entry_name`): `name` (the hub subset) when given, else its path's stem."""
        return self.name or path_stem(self.path)

    @field_validator("type")
    @classmethod
    def _check_type(cls, value: str) -> str:
        if value not in SFT_TYPES:
            raise ValueError(f"dataset type {value!r} is not known; use one of: {', '.join(SFT_TYPES)}")
        return value


@dataclass(frozen=True)
class SftStreamConfig(TextStreamConfig):
    """The text stream's settings plus the fine-tuning entries, how they mix and how samples are masked."""

    entries: tuple[Any, ...] = ()
    mixture: MixtureConfig = field(default_factory=MixtureConfig)
    train_on_inputs: bool = False
    sample_packing: bool = False
    chat_template: str | None = None  # the top-level default of `type: chat_template` entries

    def sft_stream(self) -> SftStreamConfig:
        """Itself: the SFT module takes this or a `DataConfig`, and asks either for its settings."""
        return self

    def build(self, batch_size: int, **kwargs: Any) -> StreamingSFTDataModule:  # type: ignore[override]
        """The SFT stream (kwargs: entry, rank, world_size, steps_per_epoch, loop, tokenizer, seed)."""
        from llm.data.sft.stream import StreamingSFTDataModule

        return StreamingSFTDataModule(self, batch_size, **kwargs)
