"""Record and template mistakes in an SFT stream: one sentence naming the file and line (or the template's file)."""

from __future__ import annotations

import json
import logging

import pytest

from llm.data.inputs.errors import InputError
from llm.data.sft.stream import StreamingSFTDataModule
from llm.data.tokenize.tokenizers import train_bpe_tokenizer
from llm.training.core.data_config import DataConfig, DatasetEntry

GOOD = {"messages": [{"role": "user", "content": "Hi?"}, {"role": "assistant", "content": "Hello."}]}
ALPACA = {"instruction": "Say hi.", "input": "", "output": "hi"}
TURNS = "{% for m in messages %}{{ m['role'] + ': ' + m['content'] }}\n{% endfor %}"
REFUSE = "{% if messages[0]['role'] == 'user' %}{{ raise_exception('Conversations must start with a system turn') }}{% endif %}" + TURNS

# (case, file suffix, lines of the file, type, tokenizer_config.json text or None, expected message)
CASES = [
    ("a record missing a field", ".jsonl", [ALPACA, ALPACA, {"instruction": "x"}], "alpaca", None,
     "datasets[0]: the record at {file} line 3 does not fit type alpaca: record field 'output' is missing"),
    ("a .txt file of plain lines", ".txt", ["just some text"], "alpaca", None,
     "datasets[0]: the record at {file} line 1 is not JSON (Expecting value)"),
    ("a .txt line of invalid JSON", ".txt", ['{"instruction": "a\tb"}'], "alpaca", None,
     "datasets[0]: the record at {file} line 1 is not JSON (Invalid control character); fine-tuning records"),
    ("a .jsonl line of invalid JSON", ".jsonl", ['{"instruction": "a\tb"}'], "alpaca", None,
     "{file}:1: invalid JSON (Invalid control character at column 19)"),  # the column once
    ("a JSON line that is not an object", ".jsonl", [ALPACA, [1, 2]], "alpaca", None,
     "{file}:2: expected a JSON object (a whole record), got an array"),  # the line reader says it
    ("a tokenizer_config.json that is not JSON", ".jsonl", [GOOD], "chat", "{chat_template: oops",
     "{config} is not valid JSON (Expecting property name"),
    ("a Jinja syntax error", ".jsonl", [GOOD], "chat", {"chat_template": "{% for m in messages %}{{ m }}"},
     "the chat template of {config} has a Jinja syntax error at line 1 (Unexpected end of template"),
    ("raise_exception in the template", ".jsonl", [GOOD], "chat", {"chat_template": REFUSE},
     "datasets[0]: the record at {file} line 1 does not fit type chat: the chat template of {config} refused this "
     "conversation: Conversations must start with a system turn"),
    ("a sandbox violation", ".jsonl", [GOOD], "chat", {"chat_template": "{{ messages.append(1) }}" + TURNS},
     "the chat template of {config} did something the sandbox forbids"),
    ("a named template list without the one asked for", ".jsonl", [GOOD], "chat",
     {"chat_template": [{"name": "tool_use", "template": TURNS}]},
     "{config}: chat_template has no template named 'default' (it has: tool_use)"),
]


@pytest.fixture(scope="module")
def bpe_file(tmp_path_factory):
    folder = tmp_path_factory.mktemp("bpe")
    return train_bpe_tokenizer([TURNS, "user assistant Hi? Hello. Say hi."] * 30, 300, folder / "tokenizer.json")


def stream(tmp_path, bpe_file, suffix: str, lines: list, kind: str, config) -> tuple[StreamingSFTDataModule | None, dict]:
    data = tmp_path / f"data{suffix}"
    data.write_text("".join((x if isinstance(x, str) else json.dumps(x)) + "\n" for x in lines))
    folder = tmp_path / "tok"
    folder.mkdir()
    (folder / "tokenizer.json").write_bytes(bpe_file.read_bytes())
    if config is not None:
        (folder / "tokenizer_config.json").write_text(config if isinstance(config, str) else json.dumps(config))
    names = {"file": str(data.resolve()), "config": str(folder / "tokenizer_config.json")}
    cfg = DataConfig(datasets=[DatasetEntry(path=str(data), type=kind)], max_seq_len=256,
                     tokenizer_type="hf", tokenizer_path=str(folder))
    return cfg, names


@pytest.mark.parametrize("case, suffix, lines, kind, config, expected", CASES, ids=[c[0] for c in CASES])
def test_mistakes_name_the_file_and_line(tmp_path, bpe_file, case, suffix, lines, kind, config, expected):
    cfg, names = stream(tmp_path, bpe_file, suffix, lines, kind, config)
    with pytest.raises(InputError) as caught:
        list(StreamingSFTDataModule(cfg, batch_size=2, loop=False).train_dataloader())
    message = str(caught.value)
    assert expected.format(**names) in message and "\n" not in message, message


def test_a_named_template_list_takes_default_and_says_so(tmp_path, bpe_file, caplog):
    other = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    config = {"chat_template": [{"name": "tool_use", "template": other}, {"name": "default", "template": TURNS}]}
    cfg, names = stream(tmp_path, bpe_file, ".jsonl", [GOOD], "chat", config)
    with caplog.at_level(logging.WARNING, logger="llm.data.sft.prompts"):
        module = StreamingSFTDataModule(cfg, batch_size=2, loop=False)
    assert f"{names['config']}: using the chat template named 'default' of tool_use, default" in caplog.text
    (batch,) = list(module.train_dataloader())
    assert module.tokenizer.decode(batch["input_ids"][0].tolist()).startswith("user: Hi?\nassistant: Hello.\n")


def test_a_bad_record_read_by_a_worker_is_the_same_sentence(tmp_path, bpe_file):
    import multiprocessing

    multiprocessing.set_start_method("fork", force=True)
    _, suffix, lines, kind, config, expected = CASES[0]
    cfg, names = stream(tmp_path, bpe_file, suffix, lines, kind, config)
    cfg = cfg.model_copy(update={"num_workers": 2})
    with pytest.raises(InputError) as caught:
        list(StreamingSFTDataModule(cfg, batch_size=2, loop=False).train_dataloader())
    assert expected.format(**names) in str(caught.value) and "Traceback" not in str(caught.value)
