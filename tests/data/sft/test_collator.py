"""StreamingDataCollator and the prompt formats on every edge, with a real trained BPE and the byte tokenizer."""

from __future__ import annotations

import json

import pytest
import torch

from llm.data.sft import (
    ALPACA_TEMPLATE,
    ALPACA_TEMPLATE_NO_INPUT,
    AlpacaPrompter,
    ChatPrompter,
    CompletionPrompter,
    StreamingDataCollator,
    prompter_for,
)
from llm.data.sft.prompts import RecordError
from llm.data.tokenize.tokenizers import SimpleTokenizer, load_tokenizer, train_bpe_tokenizer

ALPACA = {"instruction": "Name a colour.", "input": "", "output": "Blue."}
ALPACA_IN = {"instruction": "Add the numbers.", "input": "2 and 3", "output": "5"}
CHAT = {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi?"},
                     {"role": "assistant", "content": "Hello."}, {"role": "user", "content": "Bye?"},
                     {"role": "assistant", "content": "Bye."}]}


@pytest.fixture(scope="module")
def bpe(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tok")
    texts = [ALPACA_TEMPLATE, ALPACA_TEMPLATE_NO_INPUT, "Blue. Hello. Bye. Add the numbers 2 and 3 5"] * 50
    return load_tokenizer(str(train_bpe_tokenizer(texts, 400, folder / "tokenizer.json")))


def decode_targets(tok, ids: torch.Tensor, labels: torch.Tensor) -> str:
    return tok.decode([int(i) for i, lab in zip(ids, labels) if lab != -100 and int(i) != tok.eos_id])


@pytest.mark.parametrize("record, prompt", [(ALPACA, ALPACA_TEMPLATE_NO_INPUT.format(instruction="Name a colour.")),
                                            (ALPACA_IN, ALPACA_TEMPLATE.format(instruction="Add the numbers.", input="2 and 3"))])
def test_alpaca_masks_the_prompt(bpe, record, prompt):
    batch = StreamingDataCollator(bpe, 512)([record])
    ids, labels = batch["input_ids"][0], batch["labels"][0]
    n_prompt = len(bpe.encode(prompt))
    assert bpe.decode(ids[:n_prompt].tolist()) == prompt
    assert (labels[:n_prompt] == -100).all() and (labels[n_prompt:] != -100).all()
    assert decode_targets(bpe, ids, labels) == record["output"]
    assert int(ids[-1]) == bpe.eos_id and int(labels[-1]) == bpe.eos_id  # the model learns to stop
    full = StreamingDataCollator(bpe, 512, train_on_inputs=True)([record])
    assert (full["labels"] == full["input_ids"]).all()


def test_padding_truncation_and_no_pad_token():
    tok = SimpleTokenizer()  # no pad token: EOS pads
    collate = StreamingDataCollator(tok, 12, prompter=CompletionPrompter(), pad_to_multiple_of=8)
    batch = collate([{"text": "abc"}, {"text": "a much longer text than twelve"}])
    assert batch["input_ids"].shape == (2, 16)  # 12 rounded up to a multiple of 8
    assert batch["input_ids"][0, :4].tolist() == [97, 98, 99, tok.eos_id]
    assert (batch["input_ids"][0, 4:] == tok.eos_id).all() and (batch["labels"][0, 4:] == -100).all()
    assert batch["attention_mask"][0].tolist() == [1] * 4 + [0] * 12
    assert batch["attention_mask"][1].sum() == 12 and (batch["labels"][1, 12:] == -100).all()  # truncated
    assert bytes(batch["input_ids"][1, :12].tolist()).decode() == "a much longe"
    custom = StreamingDataCollator(tok, 12, label_pad_token_id=-1, padding="max_length")([{"text": "x"}])
    assert custom["input_ids"].shape == (1, 12) and (custom["labels"][0, 2:] == -1).all()
    with pytest.raises(ValueError, match="padding=False but the batch holds samples of 2 to 4 tokens"):
        StreamingDataCollator(tok, 12, padding=False)([{"text": "x"}, {"text": "xyz"}])


def test_an_empty_batch_is_one_eos_sample():
    tok = SimpleTokenizer()
    batch = StreamingDataCollator(tok, 8)([])
    assert batch["input_ids"].tolist() == [[tok.eos_id]] and batch["attention_mask"].tolist() == [[1]]


def test_chat_without_a_template_trains_on_assistant_turns(bpe):
    batch = StreamingDataCollator(bpe, 512)([CHAT])
    ids, labels = batch["input_ids"][0], batch["labels"][0]
    text = bpe.decode(ids.tolist())
    assert text.startswith("<|system|>\nBe brief.\n<|user|>\nHi?\n<|assistant|>\nHello.\n")
    assert decode_targets(bpe, ids, labels) == "<|assistant|>\nHello.\n<|assistant|>\nBye.\n"


def test_chat_with_the_tokenizers_template(bpe, tmp_path):
    template = ("{% for m in messages %}{{ '[' + m['role'] + '] ' + m['content'] }}\n{% endfor %}")
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": template}))
    (tmp_path / "tokenizer.json").write_bytes(bpe.path.read_bytes())
    tok = load_tokenizer(str(tmp_path))
    prompter = prompter_for("chat", tok)
    assert isinstance(prompter, ChatPrompter) and prompter.chat_template == template
    batch = StreamingDataCollator(tok, 512, prompter=prompter)([CHAT])
    ids, labels = batch["input_ids"][0], batch["labels"][0]
    assert tok.decode(ids.tolist()).startswith("[system] Be brief.\n[user] Hi?\n[assistant] Hello.\n")
    assert decode_targets(tok, ids, labels) == "[assistant] Hello.\n[assistant] Bye.\n"


def test_packing_restarts_positions_and_never_crosses_samples():
    tok = SimpleTokenizer()
    collate = StreamingDataCollator(tok, 10, prompter=CompletionPrompter(), sample_packing=True)
    batch = collate([{"text": "abc"}, {"text": "de"}, {"text": "fghij"}, {"text": "k"}])
    # rows: "abc<e>de<e>" (7) then "fghij<e>k<e>" (8): each row at most 10 tokens
    assert batch["input_ids"].shape == (2, 8)
    assert batch["position_ids"][0].tolist() == [0, 1, 2, 3, 0, 1, 2, 0]
    assert batch["position_ids"][1].tolist() == [0, 1, 2, 3, 4, 5, 0, 1]
    assert batch["labels"][0, 4] == -100 and batch["labels"][1, 6] == -100  # a sample's first token
    assert batch["attention_mask"][0].tolist() == [1] * 7 + [0]


def test_bad_records_name_the_field():
    tok = SimpleTokenizer()
    with pytest.raises(RecordError, match="record 1 of the batch \\(alpaca\\): record field 'output' is missing"):
        StreamingDataCollator(tok, 64, prompter=AlpacaPrompter())([ALPACA, {"instruction": "x"}])
    with pytest.raises(RecordError, match="message 0 of 'messages' must be"):
        StreamingDataCollator(tok, 64)([{"messages": [{"role": "robot", "content": "x"}]}])
    with pytest.raises(ValueError, match="dataset type 'sharegpt' is not known; use one of: alpaca, chat, chat_template, completion"):
        prompter_for("sharegpt")
    with pytest.raises(ValueError, match="max_length must be a positive integer"):
        StreamingDataCollator(tok, 0)


def test_a_prompt_longer_than_sequence_len_is_skipped_counted_and_warned_once(monkeypatch):
    from llm.data.sft import collator as module

    tok = SimpleTokenizer()  # the alpaca template alone is longer than 64 bytes
    collate = StreamingDataCollator(tok, 64, prompter=AlpacaPrompter())
    with pytest.warns(module.UntrainableSampleWarning, match="skipped 1 sample.*sequence_len=64") as caught:
        samples = collate.encode_each([ALPACA, ALPACA, ALPACA])
    assert samples == [None, None, None] and collate.skipped == 3 and len(caught) == 1  # once per N
    batch = collate([ALPACA])
    assert batch["input_ids"].tolist() == [[tok.eos_id]]  # nothing trainable left: the empty-batch sample
    monkeypatch.setattr(module, "WARN_EVERY", 2)
    with pytest.warns(module.UntrainableSampleWarning) as caught:
        collate.encode_each([ALPACA] * 4)
    assert len(caught) == 2  # samples 5 and 7 of this collator
    kept = StreamingDataCollator(tok, 300, prompter=AlpacaPrompter()).encode([ALPACA])
    assert len(kept) == 1 and any(lab != -100 for lab in kept[0][1][1:])


class AxolotlCfg:  # what Axolotl passes: an object with attributes (its DictDefault)
    sequence_len = 16
    train_on_inputs = True
    sample_packing = False


@pytest.mark.parametrize("cfg", [AxolotlCfg(), {"sequence_len": 16, "train_on_inputs": True}])
def test_axolotls_signature_tokenizer_cfg_prompter(cfg):
    tok = SimpleTokenizer()
    collate = StreamingDataCollator(tokenizer=tok, cfg=cfg, prompter=None)
    assert (collate.max_length, collate.train_on_inputs, collate.sample_packing) == (16, True, False)
    batch = collate([{"text": "x" * 40}])
    assert batch["input_ids"].shape == (1, 16) and (batch["labels"] == batch["input_ids"]).all()
    assert StreamingDataCollator(tok, 8, cfg=cfg).max_length == 8  # an argument beats cfg
    padded = StreamingDataCollator(tokenizer=tok, cfg={"sequence_len": 8, "pad_to_sequence_len": True})
    assert padded([{"text": "x"}])["input_ids"].shape == (1, 8)
    with pytest.raises(ValueError, match="cfg.sequence_len must be a positive integer, got None"):
        StreamingDataCollator(tokenizer=tok, cfg={"train_on_inputs": True})
