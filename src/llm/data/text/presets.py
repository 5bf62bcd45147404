"""Hugging Face dataset presets (C4, the Pile, RedPajama) and `apply_to_config`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class DatasetPreset:
    """Where a well-known corpus lives on the Hugging Face hub."""

    dataset_name: str
    dataset_config: str | None = None
    text_column: str = "text"


C4_PRESET = DatasetPreset("allenai/c4", "en")
THEPILE_PRESET = DatasetPreset("monology/pile-uncopyrighted")
_REDPAJAMA = "togethercomputer/RedPajama-Data-1T"
REDPAJAMA_PRESETS = {
    f"redpajama/{subset}": DatasetPreset(_REDPAJAMA, subset)
    for subset in ("arxiv", "book", "common_crawl", "c4", "github", "stackexchange", "wikipedia")
}
PRESETS = {"c4": C4_PRESET, "thepile": THEPILE_PRESET, **REDPAJAMA_PRESETS}


def get_preset(name: str) -> DatasetPreset:
    """A preset by name (`c4`, `thepile`, `redpajama/<subset>`)."""
    if name not in PRESETS:
        raise ValueError(f"unknown dataset preset {name!r}; use one of: {', '.join(PRESETS)}")
    return PRESETS[name]


def apply_to_config(cfg: Any, preset: DatasetPreset | str) -> Any:
    """Set `dataset_name`, `dataset_config` and `text_column` of `cfg` from `preset`; returns `cfg`."""
    if isinstance(preset, str):
        preset = get_preset(preset)
    cfg.dataset_name = preset.dataset_name
    cfg.dataset_config = preset.dataset_config
    cfg.text_column = preset.text_column
    return cfg
