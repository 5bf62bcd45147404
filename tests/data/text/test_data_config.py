"""DataConfig: defaults, the guide's error sentences, unknown keys, keys of custom sources."""

import pytest
import yaml
from pydantic import ValidationError

from llm.data.text.sources import SOURCE_REGISTRY, TextSource
from llm.training.core.config import DataConfig


def test_defaults():
    cfg = DataConfig(dataset_path="data/demo.txt")
    assert cfg.data_source == "local" and cfg.dataset_split == "train" and cfg.text_column == "text"
    assert cfg.max_seq_len == 512 and cfg.hash_algo == "sha256" and cfg.tokenizer_type == "simple"
    assert cfg.dataset_config is None and cfg.seen_hashes_path is None and cfg.write_seen_hashes is False
    assert cfg.steps_per_epoch is None and cfg.num_workers == 0 and cfg.tokenizer_spec() == "simple"


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({}, "dataset_path is required when data_source='local'"),
        ({"data_source": "dedup_local"}, "dataset_path is required when data_source='dedup_local'"),
        ({"data_source": "hf"}, "dataset_name is required when data_source='hf'"),
        ({"data_source": "dedup_hf"}, "dataset_name is required when data_source='dedup_hf'"),
        ({"dataset_path": "x", "datset_split": "train"}, "unknown data key 'datset_split'; valid keys are: data_source"),
        ({"dataset_path": "x", "data_source": "s4"}, "data_source 's4' is not known; use one of: local, hf"),
        ({"dataset_path": "x", "hash_algo": "md7"}, "hash_algo 'md7' is not a hashlib algorithm or xxh3_128"),
        ({"dataset_path": "x", "tokenizer_type": "hf"}, "tokenizer_path is required when tokenizer_type='hf'"),
        ({"dataset_path": "x", "write_seen_hashes": True}, "seen_hashes_path is required when write_seen_hashes"),
        ({"dataset_path": "x", "max_seq_len": 0}, "max_seq_len"),
        ({"dataset_path": "x", "steps_per_epoch": -1}, "steps_per_epoch"),
    ],
)
def test_config_errors(kwargs, message):
    with pytest.raises(ValidationError, match=message) as info:
        DataConfig(**kwargs)
    assert len(info.value.errors()) == 1  # one clear sentence, not a cascade


def test_hash_algos():
    assert DataConfig(dataset_path="x", hash_algo="xxh3_128").hash_algo == "xxh3_128"
    assert DataConfig(dataset_path="x", hash_algo="blake2b").hash_algo == "blake2b"


class _Listed(TextSource):
    def __init__(self, bucket: str, key: str):
        self.bucket, self.key = bucket, key

    def iter_texts(self, skip=0):
        yield from []

    def source_fingerprint(self):
        return {"type": "listed", "bucket": self.bucket, "key": self.key}


def test_custom_source_keys_pass_through_yaml():
    SOURCE_REGISTRY.register("cfgtest", lambda cfg: _Listed(cfg.dataset_bucket, cfg.dataset_key))
    text = "data_source: cfgtest\ndataset_bucket: corpus\ndataset_key: part-0.txt\nsteps_per_epoch: 2\n"
    cfg = DataConfig(**yaml.safe_load(text))
    assert (cfg.dataset_bucket, cfg.dataset_key) == ("corpus", "part-0.txt")
    assert SOURCE_REGISTRY.build(cfg).source_fingerprint()["key"] == "part-0.txt"
    with pytest.raises(ValidationError, match="unknown data key 'dataset_bukket'.*dataset_bucket"):
        DataConfig(data_source="cfgtest", dataset_bukket="corpus", dataset_key="k")
    # keys declared for one source are still unknown for another
    with pytest.raises(ValidationError, match="unknown data key 'dataset_bucket'"):
        DataConfig(dataset_path="x", dataset_bucket="corpus")


def test_explicit_config_keys():
    SOURCE_REGISTRY.register("cfgtest2", lambda cfg: _Listed(cfg.extra("b"), ""), config_keys=["b"])
    assert DataConfig(data_source="cfgtest2", b="bucket").extra("b") == "bucket"
    with pytest.raises(ValidationError, match="unknown data key 'c'"):
        DataConfig(data_source="cfgtest2", c=1)
