"""llm-train's messages point at the right fix: the task before its keys, close keys, its own flags, honest resume counts.

Issue 37 item 4. User-facing messages are read from an `llm-train` subprocess; a config error
is also checked to come before torch is imported (so it is printed at once).
"""

from __future__ import annotations

import ast
import importlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

from llm.training.cli_hints import for_llm_train
from llm.training.core.loading import ConfigError, build_config
from tests.training.test_axolotl import lora_yaml
from tests.training.test_sft import axolotl_tree, write_alpaca
from tests.training.test_trainer import tiny_tree, write_corpus

# runs llm-train's main in a fresh interpreter, then says whether torch was imported by then
_PROBE = ("import sys; from llm.training.train import main; rc = main(sys.argv[1:]); "
          "print('torch imported' if 'torch' in sys.modules else 'torch not imported'); sys.exit(rc)")


def llm_train(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-c", _PROBE, *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=300)


def error_of(proc: subprocess.CompletedProcess) -> str:
    """The one error line; the run must have stopped before importing torch."""
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert "torch not imported" in proc.stdout, proc.stdout
    lines = [line for line in proc.stderr.splitlines() if line.startswith("llm-train: error: ")]
    assert len(lines) == 1, proc.stderr
    return lines[0].removeprefix("llm-train: error: ")


def write_yaml(path: Path, tree: dict) -> str:
    path.write_text(yaml.safe_dump(tree))
    return str(path)


def test_the_task_is_checked_against_the_config_before_its_keys(tmp_path: Path) -> None:
    sft = write_yaml(tmp_path / "sft.yaml", axolotl_tree(write_alpaca(tmp_path / "a.jsonl", 20), tmp_path / "out"))
    # was: "data.steps_per_epoch is required for --task stream_lm ..." (the SFT config has no steps_per_epoch)
    message = error_of(llm_train(["--task", "stream_lm", "--config-path", sft], tmp_path))
    assert message == f"{sft} holds fine-tuning records (datasets: entries of type alpaca): use --task sft"
    assert "use --task sft" in error_of(llm_train(["--task", "lm", "--config-path", sft], tmp_path))
    text = write_yaml(tmp_path / "text.yaml", tiny_tree(write_corpus(tmp_path / "c.txt")))
    message = error_of(llm_train(["--task", "sft", "--config-path", text], tmp_path))
    assert message.startswith(f"{text} holds a text stream (data.data_source: local), not fine-tuning records: "
                              "use --task stream_lm")
    shards = write_yaml(tmp_path / "shards.yaml", tiny_tree("shards", data={"data_source": "optimized"}))
    assert "holds token shards (data.data_source: optimized), not fine-tuning records: use --task stream_lm or lm" in (
        error_of(llm_train(["--task", "sft", "--config-path", shards], tmp_path)))
    hub = write_yaml(tmp_path / "hub.yaml", tiny_tree("", data={"data_source": "hf", "dataset_name": "c4"}))
    assert error_of(llm_train(["--task", "lm", "--config-path", hub], tmp_path)).endswith("use --task stream_lm")
    # the right task, a missing key of its own: still named, still before torch
    assert "data.steps_per_epoch is required for --task stream_lm" in error_of(
        llm_train(["--task", "stream_lm", "--config-path", text], tmp_path))


@pytest.mark.parametrize(("section", "typo", "close"), [
    (None, "sequence_lenght", "sequence_len"),
    ("data", "max_seq_lenght", "max_seq_len"),
    ("model", "d_modle", "d_model"),
    ("training", "bach_size", "batch_size"),
    ("checkpoint", "save_interval_step", "save_interval_steps"),
    ("datasets", "typ", "type"),
])
def test_every_section_suggests_the_close_key(tmp_path: Path, section: str | None, typo: str, close: str) -> None:
    tree = axolotl_tree(write_alpaca(tmp_path / "a.jsonl", 20), tmp_path / "out")
    if section is None:
        tree[typo] = tree.pop(close)
    elif section == "datasets":
        tree["datasets"][0][typo] = "x"
    else:
        tree.setdefault(section, {})[typo] = 1
    with pytest.raises(ConfigError) as info:
        build_config(tree, source="c.yaml")
    assert f"(did you mean {close!r}?)" in str(info.value) and typo in str(info.value)


def test_a_top_level_typo_is_one_sentence_naming_key_place_and_suggestion(tmp_path: Path) -> None:
    tree = axolotl_tree(write_alpaca(tmp_path / "a.jsonl", 20), tmp_path / "out")
    tree["sequence_lenght"] = tree.pop("sequence_len")
    cfg = write_yaml(tmp_path / "typo.yaml", tree)
    # was: "... in the top level; valid keys are: ...; did you mean 'sequence_len'?; remove them"
    assert error_of(llm_train(["--config-path", cfg], tmp_path)) == (
        f"{cfg}: unknown key 'sequence_lenght' (did you mean 'sequence_len'?) at the top level; valid keys are: "
        "data, model, training, checkpoint, logging (sections) or Axolotl's keys (docs/sft.md)")


def _llm_train_modules() -> list[str]:
    """The llm modules a training run imports (read in a fresh interpreter): where llm-train's messages come from."""
    probe = ("import importlib, sys, llm.training.train, llm.training.trainer; from llm.training.tasks import TASKS; "
             "[importlib.import_module(t.split(':')[0]) for t in TASKS.values()]; "
             "print('\\n'.join(m for m in sys.modules if m.startswith('llm.')))")
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    names = sorted(proc.stdout.split())
    assert "llm.data.inputs.records" in names and "llm.training.generate" not in names  # llm-generate's own
    for name in names:
        importlib.import_module(name)
    return names


def _strings(path: str) -> list[tuple[int, str]]:
    """Every string constant of a module but its docstrings (f-strings' literal parts included)."""
    tree = ast.parse(Path(path).read_text(encoding="utf-8"))
    docs = {id(node.body[0].value) for node in ast.walk(tree)
            if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef) and node.body
            and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)}
    return [(node.lineno, node.value) for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs]


def test_every_flag_a_message_names_is_a_flag_of_llm_train() -> None:
    from llm.training.train import build_parser

    flags = set(build_parser()._option_string_actions)
    flag = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*")
    wrong = []
    for name in _llm_train_modules():
        path = getattr(sys.modules[name], "__file__", None)
        if not path or not path.endswith(".py"):  # a compiled module (the ledger's C kernel) prints no messages
            continue
        for line, text in _strings(path):
            for part in for_llm_train(text).splitlines():
                if "llm-data" in part or "llm-generate" in part:  # another command's example, named as such
                    continue
                wrong += [f"{name}:{line}: {f}" for f in flag.findall(part) if f not in flags]
    assert not wrong, wrong  # was: --text-column, --allow-empty, --mode, --wait (llm-data's flags)


def test_a_missing_text_column_names_llm_trains_way_to_set_it(tmp_path: Path) -> None:
    records = tmp_path / "r.jsonl"
    records.write_text("".join(json.dumps({"body": f"line {i}"}) + "\n" for i in range(50)))
    cfg = write_yaml(tmp_path / "c.yaml", tiny_tree(records, data={"steps_per_epoch": 2}))
    proc = llm_train(["--task", "lm", "--config-path", cfg], tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert "missing text column 'text'" in proc.stderr and "--set data.text_column=COLUMN" in proc.stderr
    assert "--text-column" not in proc.stderr  # llm-data's flag: llm-train would reject it


def test_ignoring_base_model_says_the_run_uses_the_byte_tokenizer(tmp_path: Path) -> None:
    tree = lora_yaml(write_alpaca(tmp_path / "a.jsonl", 20), tmp_path / "out")
    tree["learning_rate"] = tree.pop("learning_rat")
    warned: list[str] = []
    build_config(tree, ignore_unsupported=True, warn=warned.append)
    assert "trains a new model from scratch with the byte tokenizer" in warned[0]
    assert "set tokenizer_config: PATH (data.tokenizer_path" in warned[0]
    (tmp_path / "tok").mkdir()
    warned.clear()
    build_config({**tree, "tokenizer_config": str(tmp_path / "tok")}, ignore_unsupported=True, warn=warned.append)
    assert "byte tokenizer" not in warned[0] and f"with the tokenizer {tmp_path / 'tok'}" in warned[0]


def _trained_after(metrics: Path, step: int) -> list[dict]:
    records = [json.loads(line) for line in metrics.read_text().splitlines()]
    return [r for r in records if "loss" in r and r["step"] > step]


@pytest.mark.slow  # two llm-train runs; test_a_resume_plan_names_what_the_trainer_trains is the quick one
def test_a_resume_to_a_higher_max_steps_says_the_steps_it_trains(tmp_path: Path) -> None:
    corpus = write_corpus(tmp_path / "c.txt")
    tree = tiny_tree(corpus, data={"steps_per_epoch": 25}, model={"n_layers": 1},
                     training={"max_steps": 20, "device": "cpu"},
                     checkpoint={"checkpoint_dir": "ck", "save_interval_steps": 5})
    cfg = write_yaml(tmp_path / "c.yaml", tree)
    first = llm_train(["--task", "stream_lm", "--config-path", cfg], tmp_path)
    assert first.returncode == 0, first.stderr
    again = llm_train(["--task", "stream_lm", "--config-path", cfg, "--set", "training.max_steps=25",
                       "--set", "checkpoint.resume_from_checkpoint=ck/latest"], tmp_path)
    assert again.returncode == 0, again.stderr
    trained = _trained_after(tmp_path / "ck" / "metrics.jsonl", 20)
    # was: "training 25 more steps (1 epoch)" and "(0 epochs done)", while it trained 5
    plans = re.findall(r"training (\d+) more steps?, to step (\d+)", again.stdout)
    assert plans == [(str(len(trained)), "25")], again.stdout
    summary = re.search(r"trained (\d+) steps to step (\d+) \((\d+) epochs? done", again.stdout)
    assert summary and (int(summary[1]), int(summary[2])) == (len(trained), trained[-1]["step"]) == (5, 25)
    assert int(summary[3]) == trained[-1]["epoch"]  # the epochs metrics.jsonl records as done
    assert f"{trained[-1]['step'] - 20} of 25 steps into epoch {trained[-1]['epoch'] + 1}" in again.stdout


def test_a_resume_plan_names_what_the_trainer_trains(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from llm.training.trainer import Trainer

    monkeypatch.chdir(tmp_path)
    tree = tiny_tree(write_corpus(tmp_path / "c.txt"), data={"steps_per_epoch": 4}, model={"n_layers": 1},
                     training={"max_steps": 3, "device": "cpu"}, checkpoint={"checkpoint_dir": "ck"})
    first = Trainer(build_config(tree), "stream_lm", log=lambda line: None)
    first.fit()
    first.close()
    for max_steps, expected in [
        (5, "checkpoint ck/step_3 had finished its schedule; training 2 more steps, to step 5: max_steps 5 is the "
            "total (as in Axolotl and Hugging Face)"),
        (None, "checkpoint ck/step_3 had finished its schedule; training 4 more steps, to step 7 (1 epoch)"),
    ]:
        lines: list[str] = []
        again = build_config(tree, {"training.max_steps": max_steps, "checkpoint.resume_from_checkpoint": "ck/step_3",
                                    "checkpoint.checkpoint_dir": f"ck{max_steps}"})
        trainer = Trainer(again, "stream_lm", log=lines.append)
        result = trainer.fit()
        trainer.close()
        assert expected in lines, lines
        assert result.steps == int(re.search(r"training (\d+) more", expected)[1])  # what it said is what it did


def test_a_loader_state_from_another_block_size_names_block_size(tmp_path: Path) -> None:
    from llm.data import StreamingDataLoader, StreamingDataset, TokensLoader, optimize
    from llm.data.stage import StateError

    optimize(lambda i: np.arange(50, dtype=np.int64) + i, list(range(20)), tmp_path / "ds", item_loader=TokensLoader(),
             num_workers=0, progress=False)
    saved = StreamingDataLoader(StreamingDataset(tmp_path / "ds", item_loader=TokensLoader(block_size=16)), batch_size=4)
    next(iter(saved))
    state = saved.state_dict()
    other = StreamingDataset(tmp_path / "ds", item_loader=TokensLoader(block_size=32))
    with pytest.raises(StateError) as info:  # was: "num_samples is 63 in the state but 32 here" alone
        StreamingDataLoader(other, batch_size=4).load_state_dict(state)
    message = str(info.value)
    assert "TokensLoader(block_size=32)" in message and "blocks of block_size 16" in message
    assert message.endswith("resume with the block_size it was saved with")


def test_an_unreachable_hub_dataset_is_said_before_torch_and_the_model(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    config = Path(__file__).resolve().parents[2] / "configs" / "streaming_c4.yaml"
    error = error_of(llm_train(["--task", "stream_lm", "--config-path", str(config)], tmp_path))
    assert error.startswith("allenai/c4 is a Hugging Face hub dataset and the hub cannot be reached (HF_HUB_OFFLINE")
    assert "data_source: dedup_local" in error and "configs/streaming_c4_local.yaml" in error
