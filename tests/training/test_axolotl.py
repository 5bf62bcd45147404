"""Axolotl YAMLs as written run with llm-train: task from the keys, pretraining_dataset, one error for every key."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
import yaml

from llm.data.inputs.errors import InputError
from llm.data.stage import StateError
from llm.training.core.axolotl import VAL_STREAMING, axolotl_task
from llm.training.core.axolotl_pretrain import STREAM_EPOCH_STEPS
from llm.training.core.loading import ConfigError, build_config
from llm.training.tasks.sft import SftData
from llm.training.train import main
from llm.training.trainer import Trainer
from tests.resume import check_resume, take_steps
from tests.training.test_sft import axolotl_tree, write_alpaca
from tests.training.test_trainer import REPO

TINY = {"model": {"d_model": 32, "n_layers": 1, "n_heads": 2}, "training": {"deterministic": True}}


def write_text(path: Path, n: int = 60) -> Path:
    path.write_text("".join(json.dumps({"text": f"document {i} says hello"}) + "\n" for i in range(n)))
    return path


def pretrain_tree(data: Path | str, out: Path, **extra) -> dict:
    return {"pretraining_dataset": {"path": str(data), "type": "pretrain"}, "max_steps": 4, "micro_batch_size": 2,
            "sequence_len": 32, "output_dir": str(out), **TINY, **extra}


def lora_yaml(data: Path, out: Path) -> dict:
    """A realistic Axolotl LoRA YAML (examples/llama-3/lora-8b.yml, trimmed), with one typo."""
    return {
        "base_model": "NousResearch/Meta-Llama-3-8B", "model_type": "LlamaForCausalLM",
        "tokenizer_type": "AutoTokenizer", "load_in_8bit": True, "load_in_4bit": False, "strict": False,
        "datasets": [{"path": str(data), "type": "alpaca"}], "dataset_prepared_path": None, "val_set_size": 0.05,
        "output_dir": str(out), "sequence_len": 512, "sample_packing": False, "pad_to_sequence_len": True,
        "adapter": "lora", "lora_model_dir": None, "lora_r": 32, "lora_alpha": 16, "lora_dropout": 0.05,
        "lora_target_linear": True, "lora_target_modules": ["q_proj", "v_proj"], "wandb_project": "demo",
        "wandb_entity": None, "gradient_accumulation_steps": 1, "micro_batch_size": 2, "num_epochs": 1,
        "optimizer": "adamw_bnb_8bit", "lr_scheduler": "cosine", "learning_rat": 2e-4,
        "train_on_inputs": False, "group_by_length": False, "bf16": "auto", "fp16": None, "tf32": False,
        "gradient_checkpointing": True, "logging_steps": 1, "flash_attention": True, "warmup_steps": 1,
        "evals_per_epoch": 4, "saves_per_epoch": 1, "weight_decay": 0.0, "special_tokens": {"pad_token": "<|end|>"},
        "seed": 7, **TINY,
    }


def test_the_task_follows_the_axolotl_keys(tmp_path):
    assert axolotl_task({"datasets": []}) == "sft"
    assert axolotl_task({"pretraining_dataset": {"path": "c4"}}) == "stream_lm"
    assert axolotl_task({"data": {"data_source": "local"}}) is None
    assert axolotl_task({"datasets": [{"data_source": "local", "dataset_path": "a.txt"}]}) == "stream_lm"


def test_llm_train_runs_an_axolotl_yaml_without_task(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    cfg = tmp_path / "a.yaml"
    cfg.write_text(yaml.safe_dump(pretrain_tree(write_text(tmp_path / "t.jsonl"), tmp_path / "out")))
    assert main(["--config-path", str(cfg)]) == 0
    assert (tmp_path / "out" / "step_4").is_dir()
    # an explicit --task still wins: lm reads the same local file
    assert main(["--task", "sft", "--config-path", str(cfg), "--overwrite"]) == 2
    assert "holds a text stream (data.data_source: local), not fine-tuning records" in capsys.readouterr().err
    plain = tmp_path / "plain.yaml"
    plain.write_text(yaml.safe_dump({"data": {"dataset_path": "x.txt"}}))
    assert main(["--config-path", str(plain)]) == 2
    assert "--task is required" in capsys.readouterr().err


def test_datasets_means_sft(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    tree = axolotl_tree(write_alpaca(tmp_path / "a.jsonl", 20), tmp_path / "out", max_steps=2, **TINY)
    cfg = tmp_path / "a.yaml"
    cfg.write_text(yaml.safe_dump(tree))
    assert main(["--config-path", str(cfg)]) == 0
    assert (tmp_path / "out" / "step_2").is_dir()


def test_pretraining_dataset_maps_onto_stream_lm(tmp_path):
    data = write_text(tmp_path / "t.jsonl")
    config = build_config(pretrain_tree(data, tmp_path / "out"))
    d = config.data
    assert (d.data_source, d.dataset_path, d.text_column) == ("local", str(data), "text")
    assert d.steps_per_epoch == STREAM_EPOCH_STEPS and config.training.max_steps == 4  # max_steps ends the run
    hub = build_config(pretrain_tree("allenai/c4", tmp_path / "o", pretraining_dataset=[
        {"path": "allenai/c4", "name": "en", "split": "validation", "text_column": "content"}]))
    assert (hub.data.data_source, hub.data.dataset_name, hub.data.dataset_config) == ("hf", "allenai/c4", "en")
    assert (hub.data.dataset_split, hub.data.text_column) == ("validation", "content")
    files = build_config(pretrain_tree("json", tmp_path / "o", pretraining_dataset={
        "path": "json", "data_files": [str(data), str(write_text(tmp_path / "u.jsonl"))]}))
    assert [e.dataset_path for e in files.data.datasets] == [str(data), str(tmp_path / "u.jsonl")]


def test_pretraining_dataset_streams_packed_blocks(tmp_path):
    trainer = Trainer(build_config(pretrain_tree(write_text(tmp_path / "t.jsonl"), tmp_path / "out")),
                      "stream_lm", log=lambda _: None)
    assert trainer.fit().steps == 4 and trainer.total_steps == 4


@pytest.mark.parametrize(("change", "message"), [
    ({"max_steps": None}, "max_steps must be set when using streaming datasets"),
    ({"pretraining_dataset": {"path": "missing/file.jsonl"}}, "missing/file.jsonl does not exist"),
    ({"pretraining_dataset": {"path": "./nowhere"}}, "./nowhere does not exist"),
    ({"pretraining_dataset": {"path": "c4", "txt_column": "t"}}, "unknown key 'txt_column' (did you mean 'text_column'?)"),
    ({"pretraining_dataset": {"path": "c4", "type": "alpaca"}}, "llm-train pretrains on raw text"),
    ({"datasets": [{"path": "a", "type": "alpaca"}]}, "not both"),
])
def test_pretraining_dataset_mistakes_are_one_sentence(tmp_path, change, message):
    tree = {k: v for k, v in {**pretrain_tree("c4", tmp_path / "o"), **change}.items() if v is not None}
    with pytest.raises(ConfigError, match=None) as info:
        build_config(tree)
    assert message in str(info.value) and "\n" not in str(info.value)


def test_val_set_size_with_streaming_logs_what_axolotl_logs(tmp_path):
    warned: list[str] = []
    build_config(pretrain_tree(write_text(tmp_path / "t.jsonl"), tmp_path / "o", val_set_size=0.05), warn=warned.append)
    assert warned == [VAL_STREAMING]
    tree = axolotl_tree(write_alpaca(tmp_path / "a.jsonl", 20), tmp_path / "o", streaming=False, val_set_size=0.1)
    warned.clear()
    assert build_config(tree, warn=warned.append).data.val_set_size == 0.1 and warned == []  # a real split
    assert build_config({**tree, "val_set_size": 0}, warn=warned.append).data.val_set_size == 0  # Axolotl's "none"
    assert warned == []


def decoded(rows: torch.Tensor) -> list[str]:
    """The trained-on bytes of each row (the `simple` tokenizer is bytes): an alpaca record's output."""
    return [bytes(int(x) for x in row if 0 <= x < 256).decode() for row in rows]


def held_out_run(tmp_path: Path, records: int = 38, seed: int = 1, **keys) -> tuple[Trainer, list[str]]:
    """A val_set_size run of 2 epochs over `records` alpaca records; the outputs of every trained row."""
    tree = axolotl_tree(write_alpaca(tmp_path / "a.jsonl", records), tmp_path / "out", streaming=False, num_epochs=2,
                        eval_steps=4, **keys)
    del tree["max_steps"]
    tree["training"]["seed"] = seed
    trainer = Trainer(build_config(tree), "sft", log=lambda _: None)
    trained: list[str] = []
    trainer.callbacks.append(lambda t, batch, loss: trained.extend(decoded(batch["labels"])))
    return trainer, trained


def test_val_set_size_without_streaming_holds_out_records_never_trained_on(tmp_path):
    trainer, trained = held_out_run(tmp_path, val_set_size=0.1, dataset_processes=2)
    result = trainer.fit()
    held = [t for b in trainer.val.batches for t in decoded(b["labels"]) if t]
    every = {str(i) for i in range(38)}
    assert len(held) == len(set(held)) == 4  # ceil(0.1 x 38), as HF's train_test_split
    assert set(held) <= every and not set(held) & set(trained)  # no validation record in any training batch
    per_epoch = [t for t in trained if t]
    assert sorted(per_epoch, key=int) == sorted([*(every - set(held))] * 2, key=int)  # the rest, once an epoch
    assert trainer.steps_per_epoch == 9 and result.steps == 18  # ceil(34 / 4) per epoch
    # at eval_steps 4, 8, 12, 16 and each epoch's end (9, 18)
    assert len(result.val_losses) == 6 and all(math.isfinite(v) for v in result.val_losses)


def test_val_set_size_draws_by_the_seed_a_fraction_or_a_count(tmp_path):
    def held(**keys) -> set[str]:
        trainer, _ = held_out_run(tmp_path, **keys)
        return {t for b in trainer.val.batches for t in decoded(b["labels"]) if t}

    first = held(val_set_size=5, seed=3)
    assert len(first) == 5 and held(val_set_size=5, seed=3) == first  # a count; the same every time
    assert held(val_set_size=5, seed=4) != first  # the seed draws them
    with pytest.raises(InputError, match=r"val_set_size=38 holds out 38 of the 38 records of datasets .*a\.jsonl"):
        held(val_set_size=38)
    with pytest.raises(ValueError, match="the val_set_size split has no record with a token to train on within "
                                         "sequence_len=128; raise sequence_len"):  # alpaca's prompt is 232 bytes
        held(val_set_size=5, sequence_len=128)
    with pytest.raises(ConfigError, match="non-zero val_set_size should not be used with test_datasets"):
        held(val_set_size=0.1, test_datasets=[{"path": str(tmp_path / "a.jsonl"), "type": "alpaca"}])


def run_held_out(config: dict, state: dict | None, steps: int | None) -> tuple[list, dict]:
    """tests/resume.py's pipeline: the training side of a val_set_size split, two epochs in all (as the trainer,
    the state carries the steps taken)."""
    tree = {k: v for k, v in config.items() if k != "ledger"}
    data = SftData(build_config(tree), rank=0, world_size=1)
    if config.get("ledger"):
        data.attach_ledger(config["ledger"], "held-out")  # as llm-train does, before the state
    taken = 0
    if state is not None:
        data.load_state_dict(state["data"])
        taken = state["taken"]
    left = 2 * data.steps_per_pass - taken
    out = take_steps(data.batches(), left if steps is None else min(steps, left))
    return out, {"data": data.state_dict(), "taken": taken + len(out)}


def test_val_set_size_split_is_the_same_after_a_resume(tmp_path):
    tree = axolotl_tree(write_alpaca(tmp_path / "a.jsonl", 30), tmp_path / "o", streaming=False, val_set_size=0.2,
                        dataset_processes=2)
    del tree["max_steps"]
    reference = check_resume(run_held_out, tree, stops=[2, 7])  # token for token, in fresh processes
    trained = {t for step in reference for t in decoded(torch.from_numpy(step["labels"])) if t}
    assert len(reference) == 12 and len(trained) == 24  # 30 records, 6 held out, 4 a step: 2 epochs of 6 steps
    # on another topology the rows regroup (a worker's last batch may be short), but never reach a held-out record
    head, state = run_held_out(tree, None, 3)
    tail, _ = run_held_out({**tree, "dataset_processes": 0}, state, None)
    assert {t for step in head + tail for t in decoded(torch.from_numpy(step["labels"])) if t} == trained
    moved = {**tree, "val_set_size": 0.3}
    with pytest.raises(StateError, match=r"held_out.val_set_size: 0.2 -> 0.3"):  # another split is refused
        run_held_out(moved, state, 1)


def test_datasets_stream_only_on_request_as_in_axolotl(tmp_path):
    tree = axolotl_tree(write_alpaca(tmp_path / "a.jsonl", 20), tmp_path / "o")
    del tree["streaming"]
    assert build_config(tree).data.streaming  # max_steps given: our streaming default
    del tree["max_steps"]
    assert not build_config(tree).data.streaming  # neither: Axolotl's one pass per epoch
    assert build_config({**tree, "streaming": True, "max_steps": 2}).data.streaming
    assert build_config({**tree, "training": {"max_steps": 2}}).data.streaming  # our key counts too


def test_every_key_llm_train_lacks_is_named_in_one_run(tmp_path):
    tree = lora_yaml(write_alpaca(tmp_path / "a.jsonl", 20), tmp_path / "out")
    with pytest.raises(ConfigError) as info:
        build_config(tree)
    message = str(info.value)
    assert ("Axolotl keys llm-train does not support (base_model, model_type, tokenizer_type, load_in_8bit, "
            "pad_to_sequence_len, adapter, lora_r, lora_alpha, lora_dropout, lora_target_linear, "
            "lora_target_modules, wandb_project, gradient_checkpointing, flash_attention, evals_per_epoch, "
            "saves_per_epoch, special_tokens)") in message
    assert "unknown key 'learning_rat' (did you mean 'learning_rate'?) at the top level" in message
    assert "--ignore-unsupported" in message and "\n" not in message
    assert "field_instructoin" not in message  # the entries are fine here: see the next test
    # load_in_4bit: false, lora_model_dir: null, tf32: false ask for nothing: not named
    assert "load_in_4bit" not in message and "lora_model_dir" not in message and "tf32" not in message


def test_the_same_run_names_a_typo_inside_an_entry(tmp_path):
    tree = lora_yaml(write_alpaca(tmp_path / "a.jsonl", 20), tmp_path / "out")
    tree["datasets"][0]["field_instructoin"] = "q"
    with pytest.raises(ConfigError) as info:
        build_config(tree)
    message = str(info.value)
    assert "does not support (base_model" in message and "unknown key 'learning_rat'" in message
    assert message.endswith("; and unknown key 'data.datasets[0].field_instructoin' in entry 'data.datasets[0]'; "
                            "valid keys are: path, type, split, data_files, name, chat_template, field_messages, "
                            "message_property_mappings, message_field_role, message_field_content, roles_to_train, "
                            "train_on_eos")


def test_ignore_unsupported_runs_with_a_warning(tmp_path, monkeypatch, capsys):
    tree = lora_yaml(write_alpaca(tmp_path / "a.jsonl", 20), tmp_path / "out")
    with pytest.raises(ConfigError, match="unknown key 'learning_rat'"):  # a typo is never ignored
        build_config(tree, ignore_unsupported=True)
    tree["learning_rate"] = tree.pop("learning_rat")
    warned: list[str] = []
    config = build_config(tree, ignore_unsupported=True, warn=warned.append)
    assert warned == ["config: ignoring Axolotl keys llm-train does not support: base_model, model_type, "
                      "tokenizer_type, load_in_8bit, pad_to_sequence_len, adapter, lora_r, lora_alpha, lora_dropout, "
                      "lora_target_linear, lora_target_modules, wandb_project, gradient_checkpointing, flash_attention, "
                      "evals_per_epoch, saves_per_epoch, special_tokens; without base_model this run trains a new "
                      "model from scratch with the byte tokenizer (data.tokenizer_type: simple), not base_model's; "
                      "set tokenizer_config: PATH (data.tokenizer_path: a tokenizer.json or its folder) to use that "
                      "tokenizer"]
    tc = config.training
    assert (tc.lr, tc.amp_dtype, tc.seed, tc.epochs, tc.warmup_steps, tc.weight_decay) == (2e-4, "bf16", 7, 1, 1, 0.0)
    assert (tc.log_interval_steps, config.data.max_seq_len, tc.batch_size, tc.max_steps) == (1, 512, 2, None)
    assert not config.data.streaming  # no streaming, no max_steps: Axolotl's one pass per epoch
    monkeypatch.chdir(tmp_path)
    cfg = tmp_path / "lora.yaml"
    cfg.write_text(yaml.safe_dump(tree))
    assert main(["--config-path", str(cfg), "--ignore-unsupported"]) == 0
    assert "llm-train: warning: " in capsys.readouterr().err
    assert (tmp_path / "out" / "step_10").is_dir()  # 20 records, 1 held out (val_set_size 0.05), 2 per step


@pytest.mark.parametrize(("keys", "expected"), [
    ({"bf16": False}, ("training.amp_dtype", "fp32")),
    ({"fp16": True}, ("training.amp_dtype", "fp16")),
    ({"warmup_ratio": 0.25}, ("training.warmup_steps", 2)),
    ({"cosine_min_lr_ratio": 0.2}, ("training.min_lr_ratio", 0.2)),
    ({"save_steps": 5, "eval_steps": 3}, ("checkpoint.save_interval_steps", 5)),
])
def test_trainer_keys_map_onto_ours(tmp_path, keys, expected):
    config = build_config({**axolotl_tree(write_alpaca(tmp_path / "a.jsonl", 20), tmp_path / "o"), **keys})
    section, key = expected[0].split(".")
    assert getattr(getattr(config, section), key) == expected[1]


def test_trainer_key_values_without_an_equivalent_are_named_together(tmp_path):
    tree = {**axolotl_tree(write_alpaca(tmp_path / "a.jsonl", 20), tmp_path / "o"),
            "optimizer": "lion_8bit", "lr_scheduler": "linear", "gradient_accumulation_steps": 4}
    with pytest.raises(ConfigError, match=r"\(gradient_accumulation_steps=4 \(raise micro_batch_size instead\), "
                                          r"optimizer=lion_8bit .*, lr_scheduler=linear"):
        build_config(tree)


@pytest.mark.parametrize(("entry", "message"), [
    ({"type": "alpaca", "field_instructoin": "q"},
     "unknown key 'data.datasets[0].field_instructoin' in entry 'data.datasets[0]'; valid keys are: path, type"),
    ({"data_source": "local", "dataset_pth": "x"},
     "unknown key 'data.datasets[1].dataset_pth' (did you mean 'dataset_path'?) in entry 'data.datasets[1]'; "
     "valid keys are: data_source, "),
])
def test_a_typo_inside_a_datasets_entry_names_the_entry_and_key(tmp_path, entry, message):
    data = str(write_alpaca(tmp_path / "a.jsonl", 20))
    first = {"path": data, "type": "alpaca"} if "type" in entry else {"data_source": "local", "dataset_path": data}
    entries = [first, entry] if "data_source" in entry else [{"path": data, **entry}]
    with pytest.raises(ConfigError) as info:
        build_config({**axolotl_tree(Path(data), tmp_path / "o"), "datasets": entries})
    assert message in str(info.value), str(info.value)


def test_max_steps_is_the_total_on_resume(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    tree = pretrain_tree(write_text(tmp_path / "t.jsonl"), tmp_path / "out", max_steps=3)
    cfg = tmp_path / "a.yaml"
    cfg.write_text(yaml.safe_dump(tree))
    assert main(["--config-path", str(cfg)]) == 0
    capsys.readouterr()
    cfg.write_text(yaml.safe_dump({**tree, "resume_from_checkpoint": str(tmp_path / "out" / "latest")}))
    assert main(["--config-path", str(cfg)]) == 0
    out = capsys.readouterr().out
    assert "nothing to train: checkpoint" in out and "is at step 3 and max_steps is 3" in out
    assert not (tmp_path / "out" / "step_6").exists()
    cfg.write_text(yaml.safe_dump({**tree, "max_steps": 5, "resume_from_checkpoint": str(tmp_path / "out" / "latest")}))
    assert main(["--config-path", str(cfg)]) == 0
    assert "training 2 more steps, to step 5" in capsys.readouterr().out
    assert (tmp_path / "out" / "step_5").is_dir() and not (tmp_path / "out" / "step_8").exists()


def test_the_shipped_axolotl_config_validates(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    tree = yaml.safe_load((REPO / "configs" / "axolotl_pretrain_demo.yaml").read_text())
    assert axolotl_task(tree) == "stream_lm"
    with pytest.raises(ConfigError, match="data/pretrain_demo.jsonl does not exist"):  # the data is made by hand
        build_config(tree)
    (tmp_path / "data").mkdir()
    write_text(tmp_path / "data" / "pretrain_demo.jsonl")
    config = build_config(tree)
    assert (config.data.dataset_path, config.training.max_steps) == ("data/pretrain_demo.jsonl", 50)


def test_every_unknown_key_of_a_section_is_named_at_once(tmp_path):
    tree = {**pretrain_tree(write_text(tmp_path / "t.jsonl"), tmp_path / "o"), "training": {"lrr": 1, "sead": 2}}
    with pytest.raises(ConfigError, match=r"unknown keys 'training.lrr' \(did you mean 'lr'\?\), 'training.sead' "
                                          r"\(did you mean 'seed'\?\) in section 'training'; valid keys are: batch_size"):
        build_config(tree)


def test_a_top_level_chat_template_is_the_data_sections() -> None:
    from llm.training.core.loading import build_config

    tree = {"datasets": [{"path": "chats.jsonl", "type": "chat_template"}], "chat_template": "chatml",
            "sequence_len": 64, "max_steps": 3}
    assert build_config(tree).data.chat_template == "chatml"
