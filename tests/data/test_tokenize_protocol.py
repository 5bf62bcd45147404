"""The declared `Tokenizer` protocol: every tokenizer of ours offers all of it, an ability a tokenizer
lacks is declared absent by `BaseTokenizer`, and nothing in `src/` probes a tokenizer with
`getattr`/`hasattr` instead."""

from __future__ import annotations

import ast
import base64
from collections.abc import Iterable
from pathlib import Path

import numpy as np
import pytest

from llm.data.sft.collator import StreamingDataCollator
from llm.data.sft.prompts import read_tokenizer_config
from llm.data.tokenize import engines as tb
from llm.data.tokenize.bpe_vocab import read_byte_level_bpe, tiktoken_ranks
from llm.data.tokenize.documents import encode_each, tokenize_documents
from llm.data.tokenize.protocol import BaseTokenizer, Tokenizer
from llm.data.tokenize.tokenizers import SimpleTokenizer, load_tokenizer, train_bpe_tokenizer

SRC = Path(__file__).resolve().parents[2] / "src"
TEXTS = ["Hello, world!", "", "naïve café 東京 🙂", "def f(x):\n    return x ** 2\n"] * 3


@pytest.fixture(scope="module")
def bpe_json(tmp_path_factory) -> Path:
    return train_bpe_tokenizer(TEXTS * 20, 300, tmp_path_factory.mktemp("tok") / "tokenizer.json")


@pytest.fixture(scope="module")
def tokenizers(bpe_json, tmp_path_factory) -> dict[str, BaseTokenizer]:
    """One of each kind of ours: bytes, a tokenizer.json, and (where tiktoken is installed) a .tiktoken file."""
    found = {"simple": load_tokenizer("simple"), "json": load_tokenizer(str(bpe_json), "tokenizers")}
    if tb.installed("tiktoken"):
        ranks, _ = tiktoken_ranks(read_byte_level_bpe(bpe_json))
        path = tmp_path_factory.mktemp("tt") / "trained.tiktoken"
        path.write_text("".join(f"{base64.b64encode(t).decode()} {r - 1}\n" for t, r in sorted(ranks.items(), key=lambda kv: kv[1])))
        found["tiktoken"] = load_tokenizer(str(path), "tiktoken")
    return found


def test_every_tokenizer_of_ours_declares_the_protocol(tokenizers):
    for name, tok in tokenizers.items():
        assert isinstance(tok, BaseTokenizer) and isinstance(tok, Tokenizer), name
        assert tok.eos_id < tok.vocab_size and tok.backend and tok.spec, name
        assert tok.pad_id is None, name  # none of ours has a padding token: the collator pads with EOS
        assert (tok.path is None) == (name == "simple"), name
        ids = tok.encode_batch(TEXTS)
        assert ids == [tok.encode(t) for t in TEXTS], name
        assert tok.decode(ids[0]) == TEXTS[0], name
        assert tok.fingerprint() == load_tokenizer(tok.spec).fingerprint(), name


def test_the_byte_tokenizer_declares_a_flat_encoder_that_gives_its_ids():
    tok = SimpleTokenizer()
    ids, offsets = tok.encode_flat(TEXTS)
    assert ids.dtype == np.uint8 and offsets.dtype == np.int64 and len(offsets) == len(TEXTS) + 1
    assert [ids[a:b].tolist() for a, b in zip(offsets[:-1], offsets[1:])] == tok.encode_batch(TEXTS)
    empty_ids, empty_offsets = tok.encode_flat([])
    assert len(empty_ids) == 0 and empty_offsets.tolist() == [0]


class Words(BaseTokenizer):
    """A tokenizer that declares only the required part: ids are word lengths, 0 is EOS."""

    spec = backend = "words"
    eos_id = 0
    vocab_size = 100

    def encode(self, text: str) -> list[int]:
        return [len(w) for w in text.split()]

    def decode(self, ids: Iterable[int]) -> str:
        return " ".join("x" * i for i in ids)

    def fingerprint(self) -> dict:
        return {"type": "words"}


def test_a_tokenizer_lacking_abilities_gets_the_declared_defaults_and_every_stage_serves_it():
    tok = Words()
    assert isinstance(tok, Tokenizer)
    assert tok.encode_flat is None and tok.pad_id is None and tok.path is None
    assert tok.encode_batch(["a bb", "ccc"]) == [[1, 2], [3]]
    assert [a.tolist() for a in encode_each(tok, ["a bb", "ccc"])] == [[1, 2], [3]]
    flat, lengths = tokenize_documents(tok, ["a bb", "ccc"])
    assert flat.tolist() == [1, 2, 0, 3, 0] and lengths.tolist() == [3, 2]
    assert read_tokenizer_config(tok) == ({}, "the built-in layout")
    assert StreamingDataCollator(tok, 16).pad_id == 0  # no pad id declared: EOS pads


def test_a_declared_pad_id_pads():
    class Padded(Words):
        pad_id = 7

    assert StreamingDataCollator(Padded(), 16).pad_id == 7


def test_the_base_refuses_a_tokenizer_missing_a_required_method():
    class NoDecode(BaseTokenizer):
        def encode(self, text: str) -> list[int]:
            return []

        def fingerprint(self) -> dict:
            return {}

    with pytest.raises(TypeError, match="decode"):
        NoDecode()


def test_the_flat_path_and_the_batch_path_give_the_same_documents(tokenizers):
    for name, tok in tokenizers.items():
        flat, lengths = tokenize_documents(tok, TEXTS)
        want = [np.asarray([*tok.encode(t), tok.eos_id]) for t in TEXTS]
        assert lengths.tolist() == [len(w) for w in want], name
        assert np.array_equal(flat, np.concatenate(want)), name


# The one probe left on a tokenizer-like object, and why: it reads the third-party `tokenizers`
# library's optional fast method (0.20+), and we declare `tokenizers>=0.15`.
ALLOWED_PROBES = {("llm/data/tokenize/encoders.py", "getattr(tok, 'encode_batch_fast', tok.encode_batch)")}


def tokenizer_probes(src: Path = SRC) -> set[tuple[str, str]]:
    """(file, call) for every getattr/hasattr whose object is spelled like a tokenizer (`tok`, `tokenizer`, ...)."""
    found = set()
    for path in sorted((src / "llm").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("getattr", "hasattr")
                    and node.args and "tok" in ast.unparse(node.args[0]).lower()):
                found.add((path.relative_to(src).as_posix(), ast.unparse(node)))
    return found


def test_the_probe_finder_sees_a_probe(tmp_path):
    (tmp_path / "llm").mkdir()
    (tmp_path / "llm" / "m.py").write_text("def f(self):\n    return getattr(self.tokenizer, 'pad_id', None)\n")
    assert tokenizer_probes(tmp_path) == {("llm/m.py", "getattr(self.tokenizer, 'pad_id', None)")}


def test_no_tokenizer_is_probed_for_an_ability():
    assert tokenizer_probes() == ALLOWED_PROBES
