"""DataConfig: defaults, the guide's error sentences (when the source is built), unknown keys, custom sources."""


import pytest
import yaml

from llm.data.sources import SOURCE_REGISTRY, TextSource, build_text_source
from llm.training.core.config import Config
from llm.training.core.config import DataConfig as TrainingDataConfig
from llm.training.core.data_config import DataConfig
from llm.training.core.errors import ConfigError


def test_defaults():
    cfg = DataConfig(dataset_path="data/demo.txt")
    assert cfg.data_source == "local" and cfg.dataset_split == "train" and cfg.text_column == "text"
    assert cfg.max_seq_len == 512 and cfg.hash_algo == "sha256" and cfg.tokenizer_type == "simple"
    assert cfg.dataset_config is None and cfg.seen_hashes_path is None and cfg.write_seen_hashes is False
    assert cfg.steps_per_epoch is None and cfg.num_workers == 0 and cfg.tokenizer_spec() == "simple"


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"dataset_path": "x", "datset_split": "train"}, r"unknown data key 'datset_split' \(did you mean 'dataset_split'\?\); valid keys are: data_source"),
        ({"dataset_path": "x", "data_source": "s4"}, "data_source 's4' is not known; use one of: local, hf"),
        ({"dataset_path": "x", "hash_algo": "md7"}, "hash_algo 'md7' is unsupported"),
        ({"dataset_path": "x", "tokenizer_type": "hf"}, "tokenizer_path is required when tokenizer_type='hf'"),
        ({"dataset_path": "x", "write_seen_hashes": True}, "seen_hashes_path is required when write_seen_hashes"),
        ({"dataset_path": "x", "max_seq_len": 0}, "max_seq_len"),
        ({"dataset_path": "x", "steps_per_epoch": -1}, "steps_per_epoch"),
    ],
)
def test_config_errors(kwargs, message):
    with pytest.raises(ConfigError, match=message) as info:
        DataConfig(**kwargs)
    assert "\n" not in str(info.value)  # one clear sentence, not a cascade


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({}, "dataset_path is required when data_source='local'"),
        ({"data_source": "local", "max_seq_len": 512}, "dataset_path is required when data_source='local'"),
        ({"data_source": "dedup_local"}, "dataset_path is required when data_source='dedup_local'"),
        ({"data_source": "hf", "max_seq_len": 512}, "dataset_name is required when data_source='hf'"),
        ({"data_source": "dedup_hf"}, "dataset_name is required when data_source='dedup_hf'"),
    ],
)
def test_dataset_is_required_when_the_source_is_built(kwargs, message):
    cfg = DataConfig(**kwargs)  # the guide builds the config first and fills the dataset in later
    with pytest.raises(ValueError, match=message):
        build_text_source(cfg)
    with pytest.raises(ConfigError, match=message):  # a ValueError too
        cfg.check_source()


def test_llm_train_refuses_a_missing_dataset_before_any_work(tmp_path, capsys):
    # In process: llm-train's console script calls the same main (a subprocess spent ~2 s importing).
    from llm.training.train import main

    config = tmp_path / "run.yaml"
    config.write_text("data:\n  data_source: hf\n  steps_per_epoch: 2\n")
    assert main(["--task", "stream_lm", "--config-path", str(config)]) == 2
    assert capsys.readouterr().err.strip() == f"llm-train: error: {config}: dataset_name is required when data_source='hf'"


def test_config_names_of_the_framework():
    assert TrainingDataConfig is DataConfig  # the training import path still works
    run = Config()
    assert isinstance(run.data, DataConfig) and run.data.data_source == "local"


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
    # the guide's one-line factory declares nothing: its keys are checked when it is built
    SOURCE_REGISTRY.register("cfgtest", lambda cfg: _Listed(cfg.dataset_bucket, cfg.dataset_key))
    text = "data_source: cfgtest\ndataset_bucket: corpus\ndataset_key: part-0.txt\nsteps_per_epoch: 2\n"
    cfg = DataConfig(**yaml.safe_load(text))
    assert (cfg.dataset_bucket, cfg.dataset_key) == ("corpus", "part-0.txt")
    assert build_text_source(cfg).source_fingerprint()["key"] == "part-0.txt"
    misspelt = DataConfig(data_source="cfgtest", dataset_bukket="corpus", dataset_key="k")
    with pytest.raises(ValueError, match="data key 'dataset_bucket' is required by data_source 'cfgtest'"):
        build_text_source(misspelt)
    extra = DataConfig(data_source="cfgtest", dataset_bucket="b", dataset_key="k", dataset_kee="x")
    with pytest.raises(ValueError, match="unknown data key 'dataset_kee': data_source 'cfgtest' does not read it"):
        build_text_source(extra)
    # keys a custom source reads are still unknown for a built-in source
    with pytest.raises(ConfigError, match="unknown data key 'dataset_bucket'"):
        DataConfig(dataset_path="x", dataset_bucket="corpus")


class _Declared(TextSource):
    config_keys = ("dataset_bucket", "dataset_key")

    def __init__(self, dataset_bucket: str, dataset_key: str):
        self.bucket, self.key = dataset_bucket, dataset_key

    def iter_texts(self, skip=0):
        yield from ["one", "two"][skip:]

    def source_fingerprint(self):
        return {"type": "declared", "bucket": self.bucket}


def test_a_source_class_declares_its_keys():
    SOURCE_REGISTRY.register("declared", _Declared)
    cfg = DataConfig(data_source="declared", dataset_bucket="b", dataset_key="k")
    assert build_text_source(cfg).source_fingerprint() == {"type": "declared", "bucket": "b"}
    with pytest.raises(ConfigError, match="unknown data key 'dataset_bukket'.*dataset_bucket"):
        DataConfig(data_source="declared", dataset_bukket="b", dataset_key="k")


def test_registrations_do_not_leak_between_tests():
    assert "cfgtest" not in SOURCE_REGISTRY and "declared" not in SOURCE_REGISTRY


def test_explicit_config_keys():
    SOURCE_REGISTRY.register("cfgtest2", lambda cfg: _Listed(cfg.extra("b"), ""), config_keys=["b"])
    assert DataConfig(data_source="cfgtest2", b="bucket").extra("b") == "bucket"
    with pytest.raises(ConfigError, match="unknown data key 'c'"):
        DataConfig(data_source="cfgtest2", c=1)


def test_data_config_builds_the_typed_stream_configs(tmp_path):
    from llm.data.sft.settings import SftStreamConfig
    from llm.data.text.settings import TextStreamConfig
    from llm.data.text.stream import StreamingTextDataModule

    (tmp_path / "a.txt").write_text("alpha beta\ngamma delta\n")
    cfg = DataConfig(dataset_path=str(tmp_path / "a.txt"), max_seq_len=8, num_workers=0, steps_per_epoch=3)
    text = cfg.text_stream(seed=7)
    assert isinstance(text, TextStreamConfig) and (text.max_seq_len, text.steps_per_epoch, text.seed) == (8, 3, 7)
    module = text.build(batch_size=2)
    assert isinstance(module, StreamingTextDataModule) and module.seed == 7 and module.max_seq_len == 8
    sft = DataConfig(datasets=[{"path": "x.jsonl", "type": "alpaca"}], streaming_mixing_weights=None).sft_stream()
    assert isinstance(sft, SftStreamConfig) and sft.entries[0].type == "alpaca" and sft.mixture.strategy == "round_robin"


def test_a_mixture_entry_says_path_or_dataset_path_not_both(tmp_path):
    a, b = tmp_path / "a.txt", tmp_path / "b.txt"
    a.write_text("alpha\n")
    b.write_text("beta\n")
    by_path = DataConfig(datasets=[{"path": str(a)}, {"data_source": "local", "path": str(b)}])
    by_old_key = DataConfig(datasets=[{"dataset_path": str(a)}, {"data_source": "local", "dataset_path": str(b)}])
    assert by_path.datasets[1] == by_old_key.datasets[1]
    fingerprint = build_text_source(by_old_key).source_fingerprint()
    assert build_text_source(by_path).source_fingerprint() == fingerprint
    with pytest.raises(ConfigError, match=r"datasets\[1\] gives both path and dataset_path \(the same key\); keep one"):
        DataConfig(datasets=[{"path": str(a)}, {"path": str(b), "dataset_path": str(b)}])
