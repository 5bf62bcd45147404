"""The tokenizers users already have (a Hugging Face PreTrainedTokenizerFast, a tokenizers.Tokenizer, a
tiktoken.Encoding) at every entry point that takes a tokenizer, under our identity rule; hub names from the local cache.

Every tokenizer is built here, offline: a byte-level BPE trained on a few lines, and tiktoken ranks made
from bytes and a few merges. Nothing is downloaded (HF_HUB_OFFLINE=1).
"""

from __future__ import annotations

import base64
import json
import pickle
from pathlib import Path

import numpy as np
import pytest

from llm.data import TokensLoader, optimize
from llm.data.sft.collator import StreamingDataCollator
from llm.data.sft.prompts import AlpacaPrompter
from llm.data.sft.stream import StreamingSFTDataModule
from llm.data.shards.format.manifest import Manifest
from llm.data.shards.prepare.optimize_text import optimize_text
from llm.data.tokenize.bpe_vocab import GPT2_PATTERN
from llm.data.tokenize.foreign import as_tokenizer
from llm.data.tokenize.hub import missing_sentence
from llm.data.tokenize.tokenizers import (
    TiktokenEncodingTokenizer,
    load_tokenizer,
    train_bpe_tokenizer,
)
from llm.training.core.data_config import DataConfig, DatasetEntry

tiktoken = pytest.importorskip("tiktoken")
TEXTS = [f"the quick brown fox {i} jumps over the lazy dog; hello world number {i}" for i in range(200)]
RECORDS = [{"instruction": f"Say {i}.", "input": "", "output": f"hello {i} world"} for i in range(12)]
KINDS = ("transformers", "tokenizers", "tiktoken")


@pytest.fixture(autouse=True)
def _offline(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-hub"))  # never the user's own cache


@pytest.fixture(scope="module")
def tokenizer_json(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return train_bpe_tokenizer(TEXTS, 300, tmp_path_factory.mktemp("bpe") / "tokenizer.json")


def gpt2_style_ranks() -> dict[bytes, int]:
    """Every byte, then merges that each join two earlier tokens (what a .tiktoken file of GPT-2's family holds)."""
    ranks = {bytes([b]): b for b in range(256)}
    for merged in (b"he", b"ll", b"hell", b"hello", b" w", b"or", b" wor", b"ld", b" world", b"th", b"the"):
        ranks[merged] = len(ranks)
    return ranks


def tiktoken_file(ranks: dict[bytes, int], path: Path) -> Path:
    """A .tiktoken file in the format tiktoken writes and ships (`<base64 token> <rank>` per line)."""
    path.write_text("".join(f"{base64.b64encode(t).decode()} {r}\n" for t, r in sorted(ranks.items(), key=lambda kv: kv[1])))
    return path


def foreign(kind: str, tokenizer_json: Path, tmp_path: Path) -> tuple[object, object, int]:
    """(the foreign object, our own tokenizer for the same vocabulary file, the object's own EOS id)."""
    if kind == "transformers":
        transformers = pytest.importorskip("transformers")
        obj = transformers.PreTrainedTokenizerFast(tokenizer_file=str(tokenizer_json), eos_token="<|endoftext|>")
        return obj, load_tokenizer(str(tokenizer_json)), obj.eos_token_id
    if kind == "tokenizers":
        from tokenizers import Tokenizer

        obj = Tokenizer.from_file(str(tokenizer_json))
        return obj, load_tokenizer(str(tokenizer_json)), obj.token_to_id("<|endoftext|>")
    ranks = gpt2_style_ranks()
    obj = tiktoken.Encoding("toy", pat_str=GPT2_PATTERN, mergeable_ranks=ranks, special_tokens={"<|endoftext|>": len(ranks)})
    return obj, load_tokenizer(str(tiktoken_file(ranks, tmp_path / "toy.tiktoken"))), obj.eot_token


@pytest.mark.parametrize("kind", KINDS)
def test_a_foreign_tokenizer_has_the_identity_and_ids_of_our_own_for_the_same_file(kind, tokenizer_json, tmp_path):
    obj, ours, eos = foreign(kind, tokenizer_json, tmp_path)
    tok = as_tokenizer(obj)
    assert tok.fingerprint() == ours.fingerprint() and tok.eos_id == eos == ours.eos_id
    assert tok.encode_batch(TEXTS[:5]) == ours.encode_batch(TEXTS[:5])
    again = pickle.loads(pickle.dumps(tok))  # how it reaches worker processes
    assert again.fingerprint() == ours.fingerprint() and again.encode(TEXTS[7]) == ours.encode(TEXTS[7])
    assert load_tokenizer(str(tok.path)).fingerprint() == ours.fingerprint()  # the ledger's audit re-opens it by path
    assert as_tokenizer(ours) is ours and as_tokenizer(str(tokenizer_json)).fingerprint()["type"] == "hf"


def test_a_hugging_face_tokenizer_keeps_its_padding_token_and_its_folder(tokenizer_json, tmp_path):
    transformers = pytest.importorskip("transformers")
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "tokenizer.json").write_bytes(tokenizer_json.read_bytes())
    loaded = transformers.AutoTokenizer.from_pretrained(str(folder), eos_token="<|endoftext|>")
    loaded.add_special_tokens({"pad_token": "<|endoftext|>"})
    tok = as_tokenizer(loaded)
    assert tok.path == folder / "tokenizer.json"  # the very file: its tokenizer_config.json (chat template) beside it
    assert tok.pad_id == loaded.pad_token_id and tok.fingerprint() == load_tokenizer(str(folder)).fingerprint()
    loaded.add_tokens(["<tool>"])  # no longer the file's vocabulary: a file of its own, another identity
    grown = as_tokenizer(loaded)
    assert grown.path != tok.path and grown.vocab_size == tok.vocab_size + 1
    assert grown.fingerprint()["sha256"] != tok.fingerprint()["sha256"]
    assert grown.encode("a <tool> b") == loaded.encode("a <tool> b", add_special_tokens=False)


def test_a_tiktoken_encoding_of_another_pattern_is_kept_as_a_folder_load_tokenizer_reopens(tmp_path):
    ranks = gpt2_style_ranks()
    enc = tiktoken.Encoding("words", pat_str=r"\S+|\s+", mergeable_ranks=ranks,
                            special_tokens={"<|endoftext|>": 300, "<|pad|>": 301})
    tok = as_tokenizer(enc)
    assert isinstance(tok, TiktokenEncodingTokenizer) and (tok.eos_id, tok.vocab_size) == (300, 302)
    text = "hello world <|endoftext|> there"
    assert tok.encode(text) == enc.encode_ordinary(text)  # document text is ordinary text, as for .tiktoken files
    assert load_tokenizer(str(tok.path.parent)).fingerprint() == tok.fingerprint() == pickle.loads(pickle.dumps(tok)).fingerprint()
    other = as_tokenizer(tiktoken.Encoding("words2", pat_str=r"\S+", mergeable_ranks=ranks, special_tokens={"<|endoftext|>": 300}))
    assert other.fingerprint()["sha256"] != tok.fingerprint()["sha256"]  # the pattern is part of the identity


def test_missing_end_of_text_is_one_sentence(tmp_path):
    from tokenizers import Tokenizer, models

    bare = Tokenizer(models.BPE(vocab={"a": 0, "b": 1}, merges=[]))
    with pytest.raises(ValueError, match=r"^the tokenizers.Tokenizer has no end-of-text token \(none of <\|endoftext\|>, </s>, "
                                         r"<eos>.*\): add one with tok.add_special_tokens\(\['<\|endoftext\|>'\]\)$"):
        as_tokenizer(bare)
    no_eot = tiktoken.Encoding("x", pat_str=GPT2_PATTERN, mergeable_ranks=gpt2_style_ranks(), special_tokens={})
    with pytest.raises(ValueError, match=r"^the tiktoken.Encoding x has no <\|endoftext\|> special token"):
        as_tokenizer(no_eot)
    with pytest.raises(TypeError, match=r"^tokenizer must be .* a tiktoken.Encoding, got dict$"):
        as_tokenizer({"vocab": 1})


@pytest.mark.parametrize("kind", KINDS)
def test_the_collator_takes_each_kind_as_axolotl_passes_it(kind, tokenizer_json, tmp_path):
    obj, ours, eos = foreign(kind, tokenizer_json, tmp_path)
    cfg = {"sequence_len": 256, "train_on_inputs": False}
    batch = StreamingDataCollator(tokenizer=obj, cfg=cfg, prompter=AlpacaPrompter())(RECORDS[:3])
    expected = StreamingDataCollator(tokenizer=ours, cfg=cfg, prompter=AlpacaPrompter())(RECORDS[:3])
    for key in ("input_ids", "attention_mask", "labels"):
        assert batch[key].tolist() == expected[key].tolist(), key
    lengths = batch["attention_mask"].sum(1)
    assert all(batch["input_ids"][r, n - 1].item() == eos for r, n in enumerate(lengths.tolist()))
    assert (batch["labels"] != -100).any() and (batch["labels"] == -100).any()  # targets, and masked prompts


def write_alpaca(path: Path) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in RECORDS))
    return path


@pytest.mark.parametrize("kind", KINDS)
def test_the_sft_stream_takes_each_kind(kind, tokenizer_json, tmp_path):
    obj, ours, eos = foreign(kind, tokenizer_json, tmp_path)
    data = DataConfig(datasets=[DatasetEntry(path=str(write_alpaca(tmp_path / "a.jsonl")), type="alpaca")],
                      max_seq_len=256, num_workers=1 if kind == "tiktoken" else 0)  # one worker process: pickled across

    def batches(tokenizer: object) -> list[list[list[int]]]:
        module = StreamingSFTDataModule(data, batch_size=4, loop=False, tokenizer=tokenizer)
        return [b["input_ids"].tolist() for b in module.train_dataloader()]

    got = batches(obj)
    assert got == batches(ours) and len(got) == 3
    assert any(eos in row for row in got[0])


@pytest.mark.parametrize("kind", KINDS)
def test_optimize_records_the_same_identity_and_appends_with_our_own(kind, tokenizer_json, tmp_path):
    obj, ours, eos = foreign(kind, tokenizer_json, tmp_path)
    tok = as_tokenizer(obj)
    out = tmp_path / "ds"

    def encode(i: int) -> np.ndarray:
        return np.asarray(tok.encode(TEXTS[i]) + [tok.eos_id])

    optimize(encode, list(range(6)), out, num_workers=0, item_loader=TokensLoader(), tokenizer=obj, progress=False)
    manifest = Manifest.load(out)
    assert manifest.tokenizer == ours.fingerprint() and manifest.eos_id == eos
    # the identity rule: the same vocabulary through our own loader is the same tokenizer for an append
    optimize(encode, [6, 7], out, num_workers=0, item_loader=TokensLoader(), tokenizer=ours, mode="append", progress=False)
    assert Manifest.load(out).tokenizer == ours.fingerprint()


def test_optimize_text_takes_an_object_into_its_workers(tokenizer_json, tmp_path):
    from tokenizers import Tokenizer

    corpus = tmp_path / "c.txt"
    corpus.write_text("\n".join(TEXTS[:40]) + "\n")
    by_object = optimize_text([str(corpus)], tmp_path / "a", Tokenizer.from_file(str(tokenizer_json)), num_workers=2, progress=False)
    by_file = optimize_text([str(corpus)], tmp_path / "b", str(tokenizer_json), num_workers=2, progress=False)
    assert Manifest.load(tmp_path / "a").tokenizer == Manifest.load(tmp_path / "b").tokenizer
    assert by_object.tokens == by_file.tokens > 40


# -- hub names from the local Hugging Face cache ------------------------------------------------------


def fake_hub(root: Path, repo: str, tokenizer_json: Path, with_ref: bool = True) -> Path:
    """The hub cache layout huggingface_hub writes: models--ORG--NAME/{refs/main, snapshots/<commit>/tokenizer.json}."""
    model = root / f"models--{repo.replace('/', '--')}"
    snapshot = model / "snapshots" / "0123456789abcdef0123456789abcdef01234567"
    snapshot.mkdir(parents=True)
    (snapshot / "tokenizer.json").write_bytes(tokenizer_json.read_bytes())
    if with_ref:
        (model / "refs").mkdir()
        (model / "refs" / "main").write_text(snapshot.name)
    return snapshot / "tokenizer.json"


@pytest.mark.parametrize("with_ref", [True, False])
def test_a_hub_name_loads_from_the_local_cache(tokenizer_json, tmp_path, monkeypatch, with_ref):
    hub = tmp_path / "hub"
    cached = fake_hub(hub, "acme/tiny-bpe", tokenizer_json, with_ref)
    fake_hub(hub, "gpt2", tokenizer_json, with_ref)
    monkeypatch.setenv("HF_HUB_CACHE", str(hub))
    tok = load_tokenizer("acme/tiny-bpe")
    assert tok.path == cached and tok.fingerprint() == load_tokenizer(str(tokenizer_json)).fingerprint()
    assert load_tokenizer("gpt2").fingerprint() == tok.fingerprint()
    monkeypatch.delenv("HF_HUB_CACHE")
    monkeypatch.setenv("HF_HOME", str(tmp_path))  # HF_HOME/hub: the same cache
    assert load_tokenizer("acme/tiny-bpe").path == cached


def test_a_hugging_face_tokenizer_loaded_by_hub_name_is_that_cached_file(tokenizer_json, tmp_path, monkeypatch):
    transformers = pytest.importorskip("transformers")
    cached = fake_hub(tmp_path / "hub", "acme/tiny-bpe", tokenizer_json)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    loaded = transformers.PreTrainedTokenizerFast(tokenizer_file=str(cached), eos_token="<|endoftext|>",
                                                  name_or_path="acme/tiny-bpe")
    assert as_tokenizer(loaded).path == cached


def test_a_hub_name_not_in_the_cache_is_one_sentence(tmp_path):
    sentence = missing_sentence("acme/absent")
    assert sentence.count(". ") == 0 and "hf download acme/absent tokenizer.json" in sentence
    assert str(tmp_path / "empty-hub") in sentence
    with pytest.raises(ValueError) as caught:
        load_tokenizer("acme/absent")
    assert str(caught.value) == sentence
    with pytest.raises(ValueError, match=r"^tokenizer file not found: tok/tokenizer.json$"):
        load_tokenizer("tok/tokenizer.json")  # a file's name is a missing file, not a hub name


def test_both_clis_load_a_cached_hub_name_or_say_the_same_sentence(tokenizer_json, tmp_path, monkeypatch):
    from tests.cli.helpers import first_error, run

    (tmp_path / "notes.txt").write_text("\n".join(TEXTS[:20]) + "\n")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    fake_hub(tmp_path / "hub", "acme/tiny-bpe", tokenizer_json)
    made = run("llm-data", "optimize", "notes.txt", "-o", "ds", "--tokenizer", "acme/tiny-bpe", "--no-progress", cwd=tmp_path)
    assert made.returncode == 0, made.stderr
    assert Manifest.load(tmp_path / "ds").tokenizer == load_tokenizer(str(tokenizer_json)).fingerprint()
    data_cli = run("llm-data", "optimize", "notes.txt", "-o", "ds2", "--tokenizer", "gpt2", cwd=tmp_path)
    assert first_error(data_cli) == "llm-data: error: " + missing_sentence("gpt2")
    write_alpaca(tmp_path / "sft.jsonl")
    (tmp_path / "sft.yaml").write_text(
        "datasets:\n  - path: sft.jsonl\n    type: alpaca\nsequence_len: 64\nmicro_batch_size: 2\nmax_steps: 1\n"
        "tokenizer_config: gpt2\noutput_dir: ck\n")
    train_cli = run("llm-train", "--task", "sft", "--config-path", "sft.yaml", cwd=tmp_path)
    assert first_error(train_cli) == "llm-train: error: " + missing_sentence("gpt2")


def test_a_hugging_face_chat_template_reaches_the_chat_prompter_with_the_files_identity(tokenizer_json, tmp_path):
    transformers = pytest.importorskip("transformers")
    from llm.data.sft.prompts import ChatPrompter

    folder = tmp_path / "chat-model"
    folder.mkdir()
    (folder / "tokenizer.json").write_bytes(tokenizer_json.read_bytes())
    loaded = transformers.AutoTokenizer.from_pretrained(str(folder), eos_token="<|endoftext|>")
    assert ChatPrompter.for_tokenizer(loaded).chat_template is None  # the folder has no template
    loaded.chat_template = "{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}"
    tok = as_tokenizer(loaded)
    assert tok.fingerprint() == load_tokenizer(str(folder)).fingerprint()  # the file's bytes, beside the template
    assert ChatPrompter.for_tokenizer(loaded).chat_template == loaded.chat_template
    batch = StreamingDataCollator(loaded, 64)([{"messages": [{"role": "user", "content": "hi"},
                                                           {"role": "assistant", "content": "hello"}]}])
    assert tok.decode(batch["input_ids"][0].tolist()).startswith("<user>hi<assistant>hello")
