"""Hugging Face dataset presets (C4, the Pile, RedPajama), `resolve_preset` and `apply_to_config`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable


@dataclass(frozen=True)
class DatasetPreset:
    """Where a well-known corpus lives on the Hugging Face hub; `preset_name` defaults to `dataset_name`."""

    dataset_name: str
    dataset_config: str | None = None
    dataset_split: str = "train"
    text_column: str = "text"
    description: str = ""
    preset_name: str | None = None

    def __post_init__(self) -> None:
        if self.preset_name is None:
            object.__setattr__(self, "preset_name", self.dataset_name)


__all__ = [
    "BUILTIN_PRESETS",
    "C4_PRESET",
    "REDPAJAMA_PRESETS",
    "THEPILE_PRESET",
    "DatasetPreset",
    "PresetNotFound",
    "apply_to_config",
    "get_preset",
    "list_presets",
    "resolve_preset",
]


class PresetNotFound(KeyError, ValueError):
    """An unknown preset name; the message lists the valid ones."""

    def __str__(self) -> str:
        return str(self.args[0])


C4_PRESET = DatasetPreset(
    "allenai/c4", "en", description="Colossal Clean Crawled Corpus, English (about 365 M documents)"
)
THEPILE_PRESET = DatasetPreset(
    "monology/pile-uncopyrighted", description="The Pile without its copyrighted subsets"
)
_REDPAJAMA = "togethercomputer/RedPajama-Data-1T"
_REDPAJAMA_SUBSETS = ("arxiv", "book", "c4", "common_crawl", "github", "stackexchange", "wikipedia")
REDPAJAMA_PRESETS = {
    f"redpajama/{subset}": DatasetPreset(
        _REDPAJAMA, subset, description=f"RedPajama 1T, the {subset} subset", preset_name=f"redpajama/{subset}"
    )
    for subset in _REDPAJAMA_SUBSETS
}
BUILTIN_PRESETS: dict[str, DatasetPreset] = {
    p.preset_name: p for p in (C4_PRESET, THEPILE_PRESET, *REDPAJAMA_PRESETS.values())  # type: ignore[misc]
}
# short names kept from earlier releases of this library
_ALIASES = {"c4": C4_PRESET, "thepile": THEPILE_PRESET, "pile": THEPILE_PRESET}


def list_presets() -> list[DatasetPreset]:
    """Every built-in preset, sorted by preset name (the guide's API: objects, not names)."""
    return [BUILTIN_PRESETS[name] for name in sorted(BUILTIN_PRESETS)]


def resolve_preset(name: str) -> DatasetPreset:
    """A preset by preset name, by dataset id, or as `redpajama:<subset>`; else KeyError listing the names."""
    available = ", ".join(sorted(BUILTIN_PRESETS))
    if name in BUILTIN_PRESETS:
        return BUILTIN_PRESETS[name]
    if name in _ALIASES:
        return _ALIASES[name]
    if name.startswith("redpajama:"):
        subset = name.split(":", 1)[1].strip()
        if not subset:
            raise PresetNotFound(
                f"preset {name!r} names no RedPajama subset; use redpajama:<subset> with one of: "
                f"{', '.join(_REDPAJAMA_SUBSETS)}"
            )
        if f"redpajama/{subset}" in REDPAJAMA_PRESETS:
            return REDPAJAMA_PRESETS[f"redpajama/{subset}"]
        raise PresetNotFound(
            f"unknown RedPajama subset {subset!r}; use one of: {', '.join(_REDPAJAMA_SUBSETS)}"
        )
    by_id = [p for p in BUILTIN_PRESETS.values() if p.dataset_name == name]
    if len(by_id) == 1:
        return by_id[0]
    if by_id:
        raise PresetNotFound(
            f"dataset {name!r} has {len(by_id)} presets, one per subset; name one: "
            f"{', '.join(str(p.preset_name) for p in by_id)}"
        )
    raise PresetNotFound(f"unknown dataset preset {name!r}; available presets: {available}")


def get_preset(name: str) -> DatasetPreset:
    """`resolve_preset` under its earlier name."""
    return resolve_preset(name)


@runtime_checkable
class PresetTarget(Protocol):
    """What a preset sets: the `data:` section's HF fields (`DataConfig` has them)."""

    data_source: str
    dataset_name: str | None
    dataset_config: str | None
    dataset_split: str
    text_column: str


def apply_to_config(cfg: PresetTarget, preset: DatasetPreset | str) -> PresetTarget:
    """Point a `DataConfig` at `preset`'s HF dataset; every other field is left alone. Returns `cfg`.

    Sets `data_source` to `hf` (`dedup_hf` when it was a dedup source), `dataset_name`,
    `dataset_config` (None for presets without a subset), `dataset_split`, `text_column`.
    """
    if not isinstance(cfg, PresetTarget):
        raise TypeError(
            f"apply_to_config expects a DataConfig (the data: section with data_source, dataset_name, ...), "
            f"got {type(cfg).__name__}"
        )
    if isinstance(preset, str):
        preset = resolve_preset(preset)
    cfg.data_source = "dedup_hf" if cfg.data_source.startswith("dedup") else "hf"
    cfg.dataset_name = preset.dataset_name
    cfg.dataset_config = preset.dataset_config
    cfg.dataset_split = preset.dataset_split
    cfg.text_column = preset.text_column
    return cfg
