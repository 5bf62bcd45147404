"""Bad RANK / WORLD_SIZE values are one sentence naming the variable, on every path (never a division by zero)."""

from __future__ import annotations

import pytest

from llm.data import StreamingDataLoader, StreamingDataset, TokensLoader
from llm.data.text.stream import StreamingTextDataModule
from llm.data.topology import current_topology
from llm.training.core.data_config import DataConfig
from llm.training.train import main as llm_train
from tests.data.shards.helpers import make_token_dataset

BAD = [
    ({"WORLD_SIZE": "0"}, "world size 0 must be at least 1"),
    ({"WORLD_SIZE": "-2"}, "world size -2 must be at least 1"),
    ({"WORLD_SIZE": "two"}, "environment variable WORLD_SIZE='two' is not an integer"),
    ({"RANK": "x", "WORLD_SIZE": "2"}, "environment variable RANK='x' is not an integer"),
    ({"RANK": "2", "WORLD_SIZE": "2"}, "rank 2 must be in \\[0, 2\\)"),
    ({"RANK": "-1", "WORLD_SIZE": "2"}, "rank -1 must be in \\[0, 2\\)"),
]


@pytest.mark.parametrize("env, message", BAD)
def test_every_path_names_the_bad_value(tmp_path, monkeypatch, env, message):
    corpus = tmp_path / "c.txt"
    corpus.write_text("".join(f"line {i}\n" for i in range(50)))
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    with pytest.raises(ValueError, match=message):
        current_topology()
    module = StreamingTextDataModule(DataConfig(dataset_path=str(corpus), max_seq_len=8, steps_per_epoch=2), 2)
    with pytest.raises(ValueError, match=message):
        list(module.train_dataloader())


@pytest.fixture(scope="module")
def token_dataset(tmp_path_factory):
    return make_token_dataset(tmp_path_factory.mktemp("topo"), n_lines=200)


@pytest.mark.parametrize("env, message", BAD[:3])
def test_the_shard_loader_names_the_bad_value(token_dataset, monkeypatch, env, message):
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    dataset = StreamingDataset(token_dataset, item_loader=TokensLoader(block_size=32))
    with pytest.raises(ValueError, match=message):  # when the loader is built (it asks for the world size)
        next(iter(StreamingDataLoader(dataset, batch_size=2)))


def test_llm_train_exits_2_with_one_line(tmp_path, monkeypatch, capsys):
    corpus = tmp_path / "c.txt"
    corpus.write_text("".join(f"line {i}\n" for i in range(50)))
    cfg = tmp_path / "run.yaml"
    cfg.write_text(f"data: {{dataset_path: {corpus}, max_seq_len: 8, steps_per_epoch: 2}}\n"
                   "checkpoint: {checkpoint_dir: null}\n")
    monkeypatch.setenv("WORLD_SIZE", "0")
    assert llm_train(["--task", "stream_lm", "--config-path", str(cfg)]) == 2
    assert capsys.readouterr().err.strip() == "llm-train: error: RANK/WORLD_SIZE: world size 0 must be at least 1"
