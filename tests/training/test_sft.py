"""`llm-train --task sft`: an Axolotl-style YAML accepted, prompt tokens masked, kill -9 and resume exact."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import yaml

from llm.training.core.loading import ConfigError, build_config, load_config
from llm.training.tasks.sft import shift_labels
from llm.training.train import main as train_main
from llm.training.trainer import Trainer
from tests.training.test_trainer import REPO, kill9_then_resume_matches_uninterrupted


def write_alpaca(path: Path, n: int = 200) -> Path:
    path.write_text("".join(json.dumps({"instruction": f"Echo {i}", "input": "", "output": f"{i}"}) + "\n" for i in range(n)))
    return path


def axolotl_tree(data: Path, out: Path, **extra) -> dict:
    return {
        "datasets": [{"path": str(data), "type": "alpaca"}],
        "sequence_len": 192, "micro_batch_size": 4, "max_steps": 8, "learning_rate": 3e-3,
        "output_dir": str(out), "train_on_inputs": False, "streaming": True,
        "model": {"d_model": 32, "n_layers": 2, "n_heads": 2},
        "training": {"warmup_steps": 2, "seed": 1, "deterministic": True},
        **extra,
    }


def test_an_axolotl_yaml_is_read(tmp_path):
    tree = axolotl_tree(write_alpaca(tmp_path / "a.jsonl"), tmp_path / "out", eval_steps=4,
                        test_datasets=[{"path": str(tmp_path / "a.jsonl"), "type": "alpaca"}])
    cfg = tmp_path / "axolotl.yaml"
    cfg.write_text(yaml.safe_dump(tree))
    config = load_config(cfg)
    assert (config.data.max_seq_len, config.training.batch_size, config.training.max_steps) == (192, 4, 8)
    assert config.training.lr == 3e-3 and config.checkpoint.checkpoint_dir == str(tmp_path / "out")
    assert config.data.datasets[0].type == "alpaca" and config.training.val_interval_steps == 4
    result = Trainer(config, "sft", log=lambda _: None).fit()
    assert result.steps == 8 and len(result.val_losses) == 2


def test_streaming_false_trains_epochs_of_one_pass_without_max_steps(tmp_path):
    tree = axolotl_tree(write_alpaca(tmp_path / "a.jsonl", n=38), tmp_path / "out", streaming=False, num_epochs=2)
    del tree["max_steps"]
    trainer = Trainer(build_config(tree), "sft", log=lambda _: None)
    assert trainer.steps_per_epoch == 10  # 38 records, 4 per step: ceil(38 / 4)
    seen: list[str] = []
    trainer.callbacks.append(lambda t, batch, loss: seen.extend(
        bytes(int(x) for x in row if 0 <= x < 256).decode() for row in batch["labels"]))
    result = trainer.fit()
    assert result.steps == 20 and result.epochs == 2
    first = [t for t in seen[:38] if t]
    assert sorted(first, key=int) == [str(i) for i in range(38)]  # the first epoch read every record once


def test_prompt_tokens_are_not_trained_on(tmp_path):
    config = build_config(axolotl_tree(write_alpaca(tmp_path / "a.jsonl"), tmp_path / "out"))
    trainer = Trainer(config, "sft", log=lambda _: None)
    batch = next(trainer.data.batches())
    for labels in batch["labels"]:
        targets = bytes(int(t) for t in labels if 0 <= t < 256).decode()
        assert targets.isdigit()  # only the output is a target: no template or instruction text
        assert int(labels[(labels != -100).nonzero()[-1]]) == 256  # the EOS after it too
    trainer.close()


def test_labels_are_shifted_for_our_model():
    import torch

    batch = {"input_ids": torch.tensor([[5, 6, 7, 8]]), "labels": torch.tensor([[-100, 6, 7, 8]])}
    assert shift_labels(batch)["labels"].tolist() == [[6, 7, 8, -100]]


def test_config_mistakes_are_one_sentence(tmp_path, capsys):
    data = write_alpaca(tmp_path / "a.jsonl", 20)
    cases = [
        ({"max_steps": None}, "max_steps must be set when using streaming datasets"),
        ({"datasets": [{"path": str(data), "type": "sharegpt"}]}, "dataset type 'sharegpt' is not known"),
        ({"micro_bach_size": 2}, "unknown key 'micro_bach_size' (did you mean 'micro_batch_size'?) at the top level"),
    ]
    for change, message in cases:
        tree = {**axolotl_tree(data, tmp_path / "out"), **change}
        tree = {k: v for k, v in tree.items() if v is not None}
        cfg = tmp_path / "bad.yaml"
        cfg.write_text(yaml.safe_dump(tree))
        assert train_main(["--task", "sft", "--config-path", str(cfg)]) == 2  # in-process: the CLI's own handling
        err = capsys.readouterr().err
        assert message in err.splitlines()[0] and "Traceback" not in err, err


@pytest.mark.slow  # end to end; `make test-all` and CI run it
def test_kill_9_and_resume_is_exact(tmp_path):
    tree = axolotl_tree(write_alpaca(tmp_path / "a.jsonl"), tmp_path / "unused")
    tree.pop("output_dir")
    tree["checkpoint"] = {"save_interval_steps": 2, "checkpoint_dir": str(tmp_path / "x")}
    tree["data"] = {"num_workers": 2}
    kill9_then_resume_matches_uninterrupted(tmp_path, "sft", tree)


def test_the_shipped_demo_config_validates():
    config = load_config(REPO / "configs" / "sft_local_demo.yaml")
    assert config.data.datasets[0].type == "alpaca" and config.training.max_steps == 20


def test_axolotl_keys_can_be_overridden_on_the_command_line(tmp_path):
    tree = axolotl_tree(write_alpaca(tmp_path / "a.jsonl"), tmp_path / "out")
    config = build_config(tree, {"sample_packing": True, "sequence_len": 128, "training.seed": 3})
    assert (config.data.sample_packing, config.data.max_seq_len, config.training.seed) == (True, 128, 3)
    with pytest.raises(ConfigError, match="unknown key 'sample_packin'"):
        build_config(tree, {"sample_packin": True})


def test_packed_sft_batches_carry_position_ids_to_the_model(tmp_path):
    tree = axolotl_tree(write_alpaca(tmp_path / "a.jsonl"), tmp_path / "out", sample_packing=True, max_steps=3,
                        sequence_len=640)
    trainer = Trainer(build_config(tree), "sft", log=lambda _: None)
    seen: list[torch.Tensor] = []
    trainer.callbacks.append(lambda t, batch, loss: seen.append(batch["position_ids"]))
    assert trainer.fit().steps == 3
    # several samples per row: positions restart inside rows, which the model turns into a per-sample mask
    assert all(((p[:, 1:] == 0) & (p[:, :-1] > 0)).any() for p in seen)


def test_prompts_longer_than_sequence_len_never_make_a_nan_loss(tmp_path):
    import math

    from llm.data.sft.collator import UntrainableSampleWarning
    from llm.training.metrics import read_metrics

    data = tmp_path / "a.jsonl"  # every other prompt leaves no room for its answer in 200 tokens
    data.write_text("".join(json.dumps({"instruction": "x" * (60 * (i % 2)), "input": "", "output": f"{i}"}) + "\n"
                            for i in range(40)))
    tree = axolotl_tree(data, tmp_path / "out", sequence_len=200, micro_batch_size=1, max_steps=6)
    with pytest.warns(UntrainableSampleWarning):
        result = Trainer(build_config(tree), "sft", log=lambda _: None).fit()
    assert result.steps == 6
    losses = [json.loads(line).get("loss") for line in (tmp_path / "out" / "metrics.jsonl").read_text().splitlines()]
    assert losses and all(isinstance(x, float) and math.isfinite(x) for x in losses), losses
    logged = [r for r in read_metrics(tmp_path / "out") if "loss" in r]  # sft reports the ingest figures too
    assert all(r["data_wait_p50_ms"] <= r["data_wait_p99_ms"] and r["data_tokens_per_s"] > 0 for r in logged)


@pytest.mark.parametrize("path", ["data/sft_demo.jsonl", "./missing", "~/nowhere/x.parquet", "/no/such/file.txt"])
def test_a_missing_local_file_is_one_sentence_at_once_not_a_hub_lookup(tmp_path, capsys, monkeypatch, path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # never the network, whatever happens
    monkeypatch.chdir(tmp_path)
    tree = axolotl_tree(tmp_path / "unused.jsonl", tmp_path / "out")
    tree["datasets"] = [{"path": path, "type": "alpaca"}]
    cfg = tmp_path / "sft.yaml"
    cfg.write_text(yaml.safe_dump(tree))
    assert train_main(["--task", "sft", "--config-path", str(cfg)]) == 2
    err = capsys.readouterr().err.strip()
    assert f"datasets[0] path {path!r} does not exist here" in err and "Hub" not in err, err
    assert len(err.splitlines()) == 1 and "Traceback" not in err
