"""Presets: the guide's snippets run verbatim; names, lookup and apply_to_config as the framework has them."""

import dataclasses
from pathlib import Path

import pytest

from llm.data.presets import (
    BUILTIN_PRESETS,
    C4_PRESET,
    REDPAJAMA_PRESETS,
    THEPILE_PRESET,
    DatasetPreset,
    apply_to_config,
    list_presets,
    resolve_preset,
)
from llm.data.sources import HFStreamTextSource, build_text_source
from llm.training.core.config import DataConfig

SUBSETS = ["arxiv", "book", "c4", "common_crawl", "github", "stackexchange", "wikipedia"]


def test_the_guides_preset_example_runs_as_written():
    cfg = DataConfig(data_source="hf", max_seq_len=512)
    cfg = apply_to_config(cfg, C4_PRESET)
    assert (cfg.data_source, cfg.dataset_name, cfg.dataset_config) == ("hf", "allenai/c4", "en")
    source = build_text_source(cfg)  # lazy: nothing is downloaded
    assert isinstance(source, HFStreamTextSource)
    assert (source.dataset_name, source.dataset_config, source.split, source.text_column) == (
        "allenai/c4", "en", "train", "text")
    assert source.source_fingerprint()["dataset_name"] == "allenai/c4"
    for kwargs in ({"data_source": "local", "max_seq_len": 512}, {"data_source": "dedup_local"}):
        apply_to_config(DataConfig(**kwargs), THEPILE_PRESET)  # constructible without a path


def test_preset_values():
    assert (C4_PRESET.dataset_name, C4_PRESET.dataset_config) == ("allenai/c4", "en")
    assert C4_PRESET.preset_name == "allenai/c4" and C4_PRESET.dataset_split == "train"
    assert THEPILE_PRESET.dataset_name == "monology/pile-uncopyrighted" and THEPILE_PRESET.dataset_config is None
    assert sorted(REDPAJAMA_PRESETS) == sorted(f"redpajama/{s}" for s in SUBSETS)
    for key, preset in REDPAJAMA_PRESETS.items():
        assert preset.preset_name == key
        assert preset.dataset_name == "togethercomputer/RedPajama-Data-1T"
        assert preset.dataset_config == key.split("/", 1)[1]
    for preset in BUILTIN_PRESETS.values():
        assert preset.text_column == "text" and preset.description
    assert set(BUILTIN_PRESETS) == {"allenai/c4", "monology/pile-uncopyrighted", *REDPAJAMA_PRESETS}
    assert all(BUILTIN_PRESETS[name].preset_name == name for name in BUILTIN_PRESETS)
    assert [p.preset_name for p in list_presets()] == sorted(BUILTIN_PRESETS)
    assert all(isinstance(p, DatasetPreset) for p in list_presets())  # the guide's API: objects, not names


def test_preset_is_frozen_and_named_by_its_dataset():
    preset = DatasetPreset("org/corpus")
    assert preset.preset_name == "org/corpus" and preset.dataset_split == "train" and preset.description == ""
    assert DatasetPreset("org/corpus", preset_name="mine").preset_name == "mine"
    with pytest.raises(dataclasses.FrozenInstanceError):
        preset.dataset_name = "other"  # type: ignore[misc]


def test_resolve_preset():
    assert resolve_preset("allenai/c4") is C4_PRESET
    assert resolve_preset("monology/pile-uncopyrighted") is THEPILE_PRESET
    assert resolve_preset("redpajama/github") is REDPAJAMA_PRESETS["redpajama/github"]
    assert resolve_preset("redpajama:arxiv") is REDPAJAMA_PRESETS["redpajama/arxiv"]
    with pytest.raises(KeyError, match="unknown dataset preset 'c5'.*allenai/c4.*redpajama/arxiv"):
        resolve_preset("c5")
    with pytest.raises(KeyError, match="names no RedPajama subset"):
        resolve_preset("redpajama:")
    with pytest.raises(KeyError, match="unknown RedPajama subset 'books'.*book"):
        resolve_preset("redpajama:books")


def test_apply_to_config_sets_only_the_dataset_fields():
    cfg = DataConfig(data_source="dedup_local", dataset_path="kept.txt", text_column="body", max_seq_len=64,
                     hash_algo="md5", dataset_split="validation")
    assert apply_to_config(cfg, C4_PRESET) is cfg
    assert (cfg.data_source, cfg.dataset_name, cfg.dataset_config) == ("dedup_hf", "allenai/c4", "en")
    assert (cfg.dataset_split, cfg.text_column) == ("train", "text")
    assert (cfg.dataset_path, cfg.max_seq_len, cfg.hash_algo) == ("kept.txt", 64, "md5")  # left alone
    apply_to_config(cfg, THEPILE_PRESET)
    assert cfg.dataset_config is None  # a preset without a subset clears the old one
    apply_to_config(cfg, "redpajama:github")
    assert (cfg.dataset_name, cfg.dataset_config) == ("togethercomputer/RedPajama-Data-1T", "github")
    plain = apply_to_config(DataConfig(), C4_PRESET)
    assert plain.data_source == "hf"


def test_apply_to_config_builds_a_dedup_source_offline():
    cfg = apply_to_config(DataConfig(data_source="dedup_hf", steps_per_epoch=3), C4_PRESET)
    with pytest.warns(UserWarning, match="in-memory only"):
        source = build_text_source(cfg)
    fp = source.source_fingerprint()
    assert fp["type"] == "dedup" and fp["inner"]["dataset_name"] == "allenai/c4"
    assert fp["inner"]["dataset_config"] == "en"


def test_apply_to_config_refuses_other_objects():
    with pytest.raises(TypeError, match="data_source"):
        apply_to_config({"data_source": "hf"}, C4_PRESET)


def test_the_docs_preset_snippet_runs_verbatim():
    from pathlib import Path

    doc = (Path(__file__).parents[3] / "docs" / "streaming-text.md").read_text()
    section = doc[doc.index("## Presets"):]
    code = section.split("```python\n", 1)[1].split("```", 1)[0]
    scope: dict = {}
    exec(compile(code, "streaming-text.md", "exec"), scope)
    assert scope["cfg"].dataset_name == "allenai/c4" and scope["cfg"].data_source == "hf"


def test_the_troubleshooting_fix_for_a_missing_dataset():
    cfg = DataConfig(data_source="local", max_seq_len=512)
    with pytest.raises(ValueError, match="dataset_path is required when data_source='local'"):
        build_text_source(cfg)
    cfg.dataset_path = str(Path(__file__))  # the fix the message asks for
    assert build_text_source(cfg).source_fingerprint()["dataset_path"] == cfg.dataset_path


class _RowsOnly:
    """A dataset object as the guide's users may pass one: `skip` and `__iter__` over row dicts, no `.iter`."""

    def __init__(self, rows: list[dict]):
        self.rows = rows

    def skip(self, n: int) -> "_RowsOnly":
        return _RowsOnly(self.rows[n:])

    def __iter__(self):
        return iter(self.rows)


def test_the_hf_source_iterates_a_dataset_with_skip_and_iter_but_no_iter_method():
    source = HFStreamTextSource("org/corpus")
    source._ds = _RowsOnly([{"text": f"row {i}", "id": i} for i in range(600)] + [{"text": "  "}])
    texts = list(source.iter_texts())
    assert texts == [f"row {i}" for i in range(600)]  # more than one batch of 256; the blank row dropped
    assert list(source.iter_texts(skip=598)) == ["row 598", "row 599"]
