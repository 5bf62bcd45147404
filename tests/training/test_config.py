"""Config mistakes are one clear sentence naming the file and key, never a traceback; flags override YAML."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from llm.cli.train import main
from llm.training.core.config import DataConfig, ModelConfig, TrainConfig
from llm.training.core.loading import ConfigError, load_config

REPO = Path(__file__).resolve().parents[2]


def _write(tmp_path: Path, tree: dict | str) -> Path:
    path = tmp_path / "cfg.yaml"
    path.write_text(tree if isinstance(tree, str) else yaml.safe_dump(tree))
    return path


def _error_line(capsys: pytest.CaptureFixture, argv: list[str]) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "Traceback" not in err, err
    assert err.startswith("llm-train: error: ")
    return err


GOOD = {"data": {"data_source": "local", "dataset_path": "demo.txt", "steps_per_epoch": 2, "max_seq_len": 16}}


@pytest.mark.parametrize(
    ("tree", "expected"),
    [
        ({"data": {"data_source": "local"}}, "dataset_path is required when data_source='local'"),
        ({"data": {"data_source": "hf"}}, "dataset_name is required when data_source='hf'"),
        ({"data": {"data_source": "optimized"}}, "dataset_path is required when data_source='optimized'"),
        ({**GOOD, "training": {"lrr": 0.1}}, "unknown key 'training.lrr' (did you mean 'lr'?) in section 'training'; valid keys are: batch_size"),
        ({**GOOD, "checkpoint": {"keep_last": 2}}, "unknown key 'checkpoint.keep_last'"),
        ({**GOOD, "optimiser": {}}, "unknown key 'optimiser' (did you mean 'optimizer'?) at the top level; valid keys are: data, model, training, "
         "checkpoint"),
        ({"data": {**GOOD["data"], "bucket": "b"}}, "unknown data key 'bucket'"),
        ({**GOOD, "training": {"lr": "fast"}}, "training.lr = 'fast' is invalid"),
        ({**GOOD, "training": {"batch_size": 0}}, "training.batch_size = 0 is invalid"),
        ({**GOOD, "model": {"d_model": 30, "n_heads": 4}}, "model.d_model (30) must be divisible by model.n_heads (4)"),
        ({**GOOD, "training": {"device": "tpu"}}, "training.device 'tpu' is not one of auto, cpu"),
        ({**GOOD, "training": {"amp_dtype": "int8"}}, "training.amp_dtype = 'int8' is invalid"),
    ],
)
def test_config_mistakes_name_the_key(tmp_path: Path, capsys: pytest.CaptureFixture, tree: dict, expected: str) -> None:
    path = _write(tmp_path, tree)
    err = _error_line(capsys, ["--task", "lm", "--config-path", str(path)])
    assert expected in err
    assert str(path) in err


def test_missing_file_bad_yaml_and_non_mapping(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    err = _error_line(capsys, ["--task", "lm", "--config-path", str(tmp_path / "none.yaml")])
    assert "none.yaml does not exist" in err
    err = _error_line(capsys, ["--task", "lm", "--config-path", str(_write(tmp_path, "data: [1, 2\n"))])
    assert "is not valid YAML at line" in err
    err = _error_line(capsys, ["--task", "lm", "--config-path", str(_write(tmp_path, "- 1\n- 2\n"))])
    assert "must hold a mapping" in err


def test_runtime_mistakes_are_one_sentence(tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    # the data file named in the YAML does not exist
    path = _write(tmp_path, GOOD)
    err = _error_line(capsys, ["--task", "lm", "--config-path", str(path)])
    assert "demo.txt: no such input file" in err
    # streaming needs steps_per_epoch
    (tmp_path / "demo.txt").write_text("\n".join(f"line {i}" for i in range(200)))
    path = _write(tmp_path, {"data": {"dataset_path": "demo.txt", "max_seq_len": 16}})
    err = _error_line(capsys, ["--task", "stream_lm", "--config-path", str(path)])
    assert "data.steps_per_epoch is required for --task stream_lm" in err
    # resuming from a checkpoint that does not exist
    path = _write(tmp_path, {**GOOD, "checkpoint": {"resume_from_checkpoint": "ck/latest"}})
    err = _error_line(capsys, ["--task", "lm", "--config-path", str(path)])
    assert "checkpoint ck/latest does not exist" in err
    # a vocabulary smaller than the tokenizer's
    path = _write(tmp_path, {**GOOD, "model": {"vocab_size": 100}})
    err = _error_line(capsys, ["--task", "lm", "--config-path", str(path)])
    assert "model.vocab_size 100 is smaller than the tokenizer's vocabulary (257)" in err


TWO = [{"dataset_path": "a.txt"}, {"dataset_path": "b.txt"}]


@pytest.mark.parametrize(
    ("build", "expected"),
    [
        (lambda: DataConfig(max_seq_len=0), "max_seq_len = 0 is invalid (Input should be greater than 0)"),
        (lambda: DataConfig(steps_per_epoch=None, num_workers="two"),
         "num_workers = 'two' is invalid (Input should be a valid integer, unable to parse string as an integer)"),
        (lambda: DataConfig(datasets=TWO, streaming_dataset_mixing_strategy="weighted",
                            streaming_mixing_schedule=[{"step": 0, "weights": [1.0]}]),
         "streaming_mixing_schedule[0].weights has 1 weight but there are 2 datasets; give one weight per dataset"),
        (lambda: DataConfig(datasets=[{"path": "a.jsonl", "typo": 1}]),
         "unknown key 'datasets[0].typo' (did you mean 'type'?) in entry 'datasets[0]'; valid keys are: path, type, split, "
         "data_files, name, chat_template, field_messages, message_property_mappings, message_field_role, message_field_content, "
         "roles_to_train, train_on_eos"),
        (lambda: TrainConfig(training={"batch_size": 0}), "training.batch_size = 0 is invalid (Input should be greater than 0)"),
        (lambda: TrainConfig.model_validate({"data": {"max_seq_len": -1}}),
         "data.max_seq_len = -1 is invalid (Input should be greater than 0)"),
        (lambda: ModelConfig(d_model=30, n_heads=4), "model.d_model (30) must be divisible by model.n_heads (4)"),
    ],
)
def test_config_mistakes_in_python_are_the_sentence_alone(build, expected: str) -> None:
    with pytest.raises(ConfigError) as info:  # was pydantic's "1 validation error for DataConfig ... [type=...]"
        build()
    assert str(info.value) == expected
    assert isinstance(info.value, ValueError)  # `except ValueError` around a config keeps working
    assert info.value.__cause__ is None and info.value.__suppress_context__


def test_flags_override_yaml(tmp_path: Path) -> None:
    path = _write(tmp_path, {**GOOD, "training": {"epochs": 3, "lr": 0.1, "batch_size": 4}})
    cfg = load_config(path, {"training.epochs": 1, "data.steps_per_epoch": 7, "checkpoint.keep_last_n": 5})
    assert (cfg.training.epochs, cfg.data.steps_per_epoch, cfg.training.batch_size) == (1, 7, 4)
    assert cfg.training.lr == 0.1 and cfg.checkpoint.keep_last_n == 5
    # None is the user's `null`: it sets the key, where the key allows it
    cfg = load_config(path, {"checkpoint.checkpoint_dir": None, "checkpoint.keep_last_n": None})
    assert cfg.checkpoint.checkpoint_dir is None and cfg.checkpoint.keep_last_n is None
    with pytest.raises(ConfigError, match=r"cfg.yaml: training.batch_size cannot be null; give it a value or leave it out$"):
        load_config(path, {"training.batch_size": None})
    with pytest.raises(ConfigError, match="cannot set 'data.dataset_path.x' because 'dataset_path' is not a section"):
        load_config(path, {"data.dataset_path.x": 1})


@pytest.mark.parametrize(
    "name", ["streaming_local_demo.yaml", "streaming_c4.yaml", "streaming_c4_local.yaml", "optimized_demo.yaml",
             "lm_local_demo.yaml"]
)
def test_shipped_configs_validate_offline(name: str) -> None:
    cfg = load_config(REPO / "configs" / name)
    assert cfg.checkpoint.checkpoint_dir
    assert cfg.data.dataset_path or cfg.data.dataset_name
    assert cfg.data.steps_per_epoch or cfg.data.data_source in ("optimized", "local")
    # every key the file sets arrives in the config with its value (not only "it parses")
    tree = yaml.safe_load((REPO / "configs" / name).read_text())
    for section, values in tree.items():
        for key, value in values.items():
            assert getattr(getattr(cfg, section), key) == value, f"{name}: {section}.{key}"


def test_c4_config_offline_fails_with_one_line(tmp_path: Path, capsys: pytest.CaptureFixture,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    import datasets.config
    import huggingface_hub.constants

    for name in ("HF_DATASETS_OFFLINE", "HF_HUB_OFFLINE"):
        monkeypatch.setenv(name, "1")
    # In process (a subprocess spent ~10 s importing): both libraries read the switch when first imported,
    # which an earlier test may have done.
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(datasets.config, "HF_DATASETS_OFFLINE", True)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.chdir(tmp_path)
    small = ["--set", "model.d_model=32", "--set", "model.n_layers=1", "--set", "model.n_heads=2",
             "--set", f"checkpoint.checkpoint_dir={tmp_path / 'ck'}", "--set", f"data.seen_hashes_path={tmp_path / 'seen'}"]
    err = _error_line(capsys, ["--task", "stream_lm", "--config-path", str(REPO / "configs" / "streaming_c4.yaml"), *small])
    assert "allenai/c4" in err
