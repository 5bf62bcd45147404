"""Axolotl's `type: chat_template`: field_messages, message_property_mappings, roles_to_train, train_on_eos."""

from __future__ import annotations

import json

import pytest

from llm.data.sft import StreamingDataCollator
from llm.data.sft.prompts import prompter_for
from llm.data.sft.stream import StreamingSFTDataModule
from llm.data.tokenize.tokenizers import SimpleTokenizer
from llm.training.core.data_config import DataConfig, DatasetEntry

TWO_TURNS = {"messages": [{"role": "user", "content": "Hi?"}, {"role": "assistant", "content": "Hello."}]}
RENDERED = "<|im_start|>user\nHi?<|im_end|>\n<|im_start|>assistant\nHello.<|im_end|>\n"


def label_mask(entry: DatasetEntry, record: dict) -> tuple[str, str]:
    """(the rendered text, its trained characters with '_' for masked ones); bytes are characters here."""
    tok = SimpleTokenizer()
    batch = StreamingDataCollator(tok, 512, prompter=prompter_for("chat_template", tok, entry))([record])
    ids, labels = batch["input_ids"][0].tolist(), batch["labels"][0].tolist()
    text = bytes(ids).decode()
    return text, "".join(ch if lab != -100 else "_" for ch, lab in zip(text, labels))


def expected(*trained: str) -> str:
    """RENDERED with everything but the given spans (found left to right) masked."""
    out, at = ["_"] * len(RENDERED), 0
    for span in trained:
        at = RENDERED.index(span, at)
        out[at : at + len(span)] = span
        at += len(span)
    return "".join(out)


@pytest.mark.parametrize("roles, train_on_eos, trained", [
    (["assistant"], "turn", ["Hello.<|im_end|>"]),
    (["assistant", "user"], "turn", ["Hi?<|im_end|>", "Hello.<|im_end|>"]),
    (["assistant"], "none", ["Hello."]),
    (["assistant"], "all", ["<|im_end|>", "Hello.<|im_end|>"]),
    (["user"], "last", ["Hi?", "Hello.<|im_end|>"]),  # the user's content and the last turn's EOS
])
def test_the_label_mask_is_exactly_the_trained_contents_and_their_eos(roles, train_on_eos, trained):
    entry = DatasetEntry(path="x.jsonl", type="chat_template", chat_template="chatml", roles_to_train=roles,
                         train_on_eos=train_on_eos)
    text, mask = label_mask(entry, TWO_TURNS)
    assert text == RENDERED  # no role header is trained, and no extra EOS is appended
    want = expected(*trained)
    assert mask == (want.replace("Hello.", "______") if train_on_eos == "last" else want)


def test_axolotls_field_and_property_mappings():
    record = {"conversations": [{"from": "human", "value": "Hi?"}, {"from": "gpt", "value": "Hello."}]}
    template = "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}{% endfor %}"
    for keys in ({"message_property_mappings": {"role": "from", "content": "value"}},
                 {"message_field_role": "from", "message_field_content": "value"}):
        entry = DatasetEntry(path="x.jsonl", type="chat_template", chat_template=template, roles_to_train=["gpt"],
                             field_messages="conversations", **keys)
        text, mask = label_mask(entry, record)
        assert text == RENDERED.replace("user", "human").replace("assistant", "gpt")
        assert mask.replace("_", "") == "Hello."  # an inline template knows no EOS text: content only


def test_mistakes_are_one_sentence():
    tok = SimpleTokenizer()
    with pytest.raises(ValueError, match="chat_template is tokenizer_default but the built-in layout has no chat_template"):
        prompter_for("chat_template", tok, DatasetEntry(path="x.jsonl", type="chat_template"))
    with pytest.raises(ValueError, match="train_on_eos"):
        DatasetEntry(path="x.jsonl", type="chat_template", train_on_eos="sometimes")
    entry = DatasetEntry(path="x.jsonl", type="chat_template", chat_template="chatml",
                         message_property_mappings={"role": "from"})
    with pytest.raises(ValueError, match="message 0 of 'messages' must have string fields 'from' and 'content'"):
        StreamingDataCollator(tok, 64, prompter=prompter_for("chat_template", tok, entry))([TWO_TURNS])


def test_a_chat_template_stream_with_the_top_level_template(tmp_path):
    path = tmp_path / "c.jsonl"
    path.write_text("".join(json.dumps(TWO_TURNS) + "\n" for _ in range(3)))
    data = DataConfig(datasets=[DatasetEntry(path=str(path), type="chat_template")], chat_template="chatml",
                      max_seq_len=256)
    (batch,) = list(StreamingSFTDataModule(data, batch_size=3, loop=False).train_dataloader())
    for ids, labels in zip(batch["input_ids"].tolist(), batch["labels"].tolist()):
        assert bytes(i for i, lab in zip(ids, labels) if lab != -100).decode() == "Hello.<|im_end|>"
