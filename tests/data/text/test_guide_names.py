"""The guide's framework as a drop-in: every documented source name, preset name and `reset_cross_run_seen`
is accepted and does what docs/streaming-text.md says."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from llm.data.dedup import DedupTextSource, normalize
from llm.data.presets import BUILTIN_PRESETS, apply_to_config, resolve_preset
from llm.data.sources import HFStreamTextSource, LocalLineTextSource, build_text_source
from llm.training.core.config import DataConfig

RECORDS = ["  alpha  beta ", "gamma", "", "alpha beta", "delta", "gamma"]  # a blank one; two repeats once normalised
STRIPPED = ["alpha  beta", "gamma", "alpha beta", "delta", "gamma"]  # what a plain source yields
UNIQUE = ["alpha  beta", "gamma", "delta"]  # what a dedup source yields (whitespace runs collapse when hashing)
SUBSETS = ["arxiv", "book", "c4", "common_crawl", "github", "stackexchange", "wikipedia"]
# docs/streaming-text.md, "Presets": each name the guide resolves, and the dataset it names
PRESET_NAMES = {
    "allenai/c4": ("allenai/c4", "en"),
    "monology/pile-uncopyrighted": ("monology/pile-uncopyrighted", None),
    **{f"redpajama/{s}": ("togethercomputer/RedPajama-Data-1T", s) for s in SUBSETS},
    **{f"redpajama:{s}": ("togethercomputer/RedPajama-Data-1T", s) for s in SUBSETS},  # the shorthand
}


def corpus(tmp_path: Path) -> Path:
    path = tmp_path / "corpus.jsonl"
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in RECORDS))
    return path


def keys(name: str, path: Path) -> dict:
    """The dataset keys each source name reads: a path, or (hf) the json builder over it."""
    if name.endswith("hf"):
        pytest.importorskip("datasets")
        return {"dataset_name": "json", "dataset_path": str(path)}
    return {"dataset_path": str(path)}


@pytest.mark.parametrize(("name", "required"), [("local", "dataset_path"), ("hf", "dataset_name"),
                                                ("dedup_local", "dataset_path"), ("dedup_hf", "dataset_name")])
def test_each_source_name_is_accepted_and_reads_what_the_doc_says(tmp_path, name, required):
    cfg = DataConfig(data_source=name, max_seq_len=512)  # the guide fills the dataset in later
    with pytest.raises(ValueError, match=f"^{required} is required when data_source='{name}'$"):
        build_text_source(cfg)
    cfg = DataConfig(data_source=name, **keys(name, corpus(tmp_path)))
    if name.startswith("dedup_"):
        with pytest.warns(UserWarning, match="in-memory only"):  # no seen_hashes_path: said so
            source = build_text_source(cfg)
        assert isinstance(source, DedupTextSource) and source.source_fingerprint()["type"] == "dedup"
        inner = source.inner
        assert list(source.iter_texts()) == UNIQUE  # repeats dropped, in the order read
    else:
        source = inner = build_text_source(cfg)
        assert list(source.iter_texts()) == STRIPPED  # stripped, the blank record skipped, repeats kept
    kind = name.removeprefix("dedup_")
    assert isinstance(inner, LocalLineTextSource if kind == "local" else HFStreamTextSource)
    assert inner.source_fingerprint()["type"] == kind


def test_optimized_is_a_data_source_name_the_trainer_reads():
    cfg = DataConfig(data_source="optimized", dataset_path="data/demo_optimized")
    assert cfg.check_source() is cfg
    with pytest.raises(ValueError, match="dataset_path is required when data_source='optimized'"):
        DataConfig(data_source="optimized").check_source()


def test_an_unknown_source_name_lists_the_documented_ones():
    with pytest.raises(ValueError, match="data_source 'hub' is not known; use one of: local, hf, dedup_local, "
                                         "dedup_hf, optimized"):
        DataConfig(data_source="hub")


@pytest.mark.parametrize("preset_name", list(PRESET_NAMES))
@pytest.mark.parametrize(("given", "expected"), [("hf", "hf"), ("local", "hf"), ("dedup_local", "dedup_hf")])
def test_each_preset_name_resolves_and_builds_its_hub_source(preset_name, given, expected):
    dataset, subset = PRESET_NAMES[preset_name]
    preset = resolve_preset(preset_name)
    assert preset is BUILTIN_PRESETS[preset_name.replace(":", "/")]
    cfg = apply_to_config(DataConfig(data_source=given, max_seq_len=512), preset_name)  # a name works as well
    assert (cfg.data_source, cfg.dataset_name, cfg.dataset_config) == (expected, dataset, subset)
    assert (cfg.dataset_split, cfg.text_column) == ("train", "text")
    if expected == "dedup_hf":
        with pytest.warns(UserWarning, match="in-memory only"):
            built = build_text_source(cfg).inner
    else:
        built = build_text_source(cfg)
    assert isinstance(built, HFStreamTextSource)  # lazy: nothing is downloaded
    assert (built.dataset_name, built.dataset_config, built.split) == (dataset, subset, "train")


def _sha(text: str) -> str:
    return hashlib.sha256(normalize(text).encode()).hexdigest()


@pytest.mark.filterwarnings("ignore:DedupTextSource is running with in-memory only state")  # read-only file
@pytest.mark.parametrize("name", ["dedup_local", "dedup_hf"])
def test_reset_cross_run_seen_reads_earlier_runs_records_again_on_each_dedup_source(tmp_path, name):
    seen = tmp_path / "seen.txt"
    seen.write_text(f"{_sha('gamma')}\n{_sha('delta')}\n")  # an earlier run of the guide's framework saw these
    before = seen.read_bytes()
    cfg = DataConfig(data_source=name, seen_hashes_path=str(seen), **keys(name, corpus(tmp_path)))
    source = build_text_source(cfg)
    assert list(source.iter_texts()) == ["alpha  beta"]  # the earlier run's records are skipped
    source.reset_cross_run_seen()
    assert list(source.iter_texts()) == UNIQUE  # read again; repeats within the pass still dropped
    assert seen.read_bytes() == before  # write_seen_hashes is off: the file is never touched


@pytest.mark.parametrize("name", ["dedup_local", "dedup_hf"])
def test_with_write_seen_hashes_the_file_does_not_grow_on_every_pass(tmp_path, name):
    seen = tmp_path / "seen.txt"
    cfg = DataConfig(data_source=name, seen_hashes_path=str(seen), write_seen_hashes=True,
                     **keys(name, corpus(tmp_path)))
    source = build_text_source(cfg)
    assert list(source.iter_texts()) == UNIQUE
    written = seen.read_text()
    assert written.split() == [_sha(t) for t in UNIQUE]
    assert list(source.iter_texts()) == UNIQUE  # a second pass starts from the baseline the source was made with
    source.reset_cross_run_seen()
    assert list(source.iter_texts()) == UNIQUE
    assert seen.read_text() == written  # each digest once, however many passes
    assert list(build_text_source(cfg).iter_texts()) == []  # a new process skips them all


@pytest.mark.filterwarnings("ignore:DedupTextSource is running with in-memory only state")  # read-only file
def test_reset_cross_run_seen_on_a_mixture_with_dedup_entries(tmp_path):
    seen = tmp_path / "seen.txt"
    seen.write_text(f"{_sha('gamma')}\n")
    other = tmp_path / "other.txt"
    other.write_text("gamma\nepsilon\n")
    cfg = DataConfig(datasets=[{"data_source": "dedup_local", "dataset_path": str(corpus(tmp_path))},
                               {"data_source": "dedup_local", "dataset_path": str(other)}],
                     seen_hashes_path=str(seen))
    source = build_text_source(cfg)
    assert sorted(source.iter_texts()) == ["alpha  beta", "delta", "epsilon"]  # one seen-set for the mixture
    source.reset_cross_run_seen()
    assert sorted(source.iter_texts()) == ["alpha  beta", "delta", "epsilon", "gamma"]  # gamma once, both sources
