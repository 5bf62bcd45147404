"""Presets name the right hub datasets and apply to a DataConfig."""

import pytest

from llm.data.text.presets import C4_PRESET, REDPAJAMA_PRESETS, THEPILE_PRESET, apply_to_config
from llm.data.text.sources import SOURCE_REGISTRY
from llm.training.core.config import DataConfig


def test_preset_values():
    assert (C4_PRESET.dataset_name, C4_PRESET.dataset_config) == ("allenai/c4", "en")
    assert THEPILE_PRESET.dataset_name == "monology/pile-uncopyrighted"
    subsets = ["arxiv", "book", "common_crawl", "c4", "github", "stackexchange", "wikipedia"]
    assert sorted(REDPAJAMA_PRESETS) == sorted(f"redpajama/{s}" for s in subsets)
    for key, preset in REDPAJAMA_PRESETS.items():
        assert preset.dataset_name == "togethercomputer/RedPajama-Data-1T"
        assert preset.dataset_config == key.split("/", 1)[1]
    for preset in [C4_PRESET, THEPILE_PRESET, *REDPAJAMA_PRESETS.values()]:
        assert preset.text_column == "text"


def test_apply_to_config_builds_hf_source_offline():
    cfg = DataConfig(data_source="dedup_hf", dataset_name="placeholder", text_column="body", steps_per_epoch=3)
    assert apply_to_config(cfg, C4_PRESET) is cfg
    assert (cfg.dataset_name, cfg.dataset_config, cfg.text_column) == ("allenai/c4", "en", "text")
    with pytest.warns(UserWarning, match="in-memory only"):
        source = SOURCE_REGISTRY.build(cfg)  # builds lazily: nothing is downloaded here
    fp = source.source_fingerprint()
    assert fp["type"] == "dedup" and fp["inner"]["name"] == "allenai/c4" and fp["inner"]["config"] == "en"
    apply_to_config(cfg, "redpajama/github")
    assert (cfg.dataset_name, cfg.dataset_config) == ("togethercomputer/RedPajama-Data-1T", "github")


def test_unknown_preset_name():
    with pytest.raises(ValueError, match="unknown dataset preset 'c5'.*redpajama/arxiv"):
        apply_to_config(DataConfig(dataset_path="x"), "c5")
