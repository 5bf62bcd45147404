"""Every tokenizer backend gives the reference's ids, on real text and on random Unicode, with and
without special tokens, for tokenizer.json and .tiktoken files and for a vocabulary lacking byte
symbols; `auto` picks the fastest that does; unsupported vocabularies and failed self-checks fall
back; the fingerprint and the dataset do not depend on the backend."""

from __future__ import annotations

import base64
import gzip
import json
import logging
import pickle
import sysconfig
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from llm.data.shards.format.manifest import Manifest
from llm.data.shards.prepare.optimize_text import optimize_text
from llm.data.tokenize import engines as tb
from llm.data.tokenize.bpe_vocab import (
    Unsupported,
    byte_decoder,
    read_byte_level_bpe,
    tiktoken_ranks,
)
from llm.data.tokenize.tokenizers import load_tokenizer, train_bpe_tokenizer
from tests.data.shards.helpers import real_lines, write_jsonl

HAS_FASTOKENS = tb.installed("fastokens")
HAS_TIKTOKEN = tb.installed("tiktoken")
HAS_GIGATOKEN = tb.installed("gigatoken")
needs_gigatoken = pytest.mark.skipif(not HAS_GIGATOKEN, reason="gigatoken is not installed (pip install 'llm-stream-data[gigatoken]')")
needs_fastokens = pytest.mark.skipif(not HAS_FASTOKENS, reason="fastokens is not installed (pip install 'llm-stream-data[fastokens]')")
needs_tiktoken = pytest.mark.skipif(not HAS_TIKTOKEN, reason="tiktoken is not installed (pip install 'llm-stream-data[tiktoken]')")
GPT2 = Path(__file__).resolve().parents[2] / ".bench_cache" / "gpt2.tiktoken"  # bench/cli.py says how to get it


def real_corpus(limit: int = 400_000) -> list[str]:
    """Real text in many scripts: Debian copyright files (Latin, Cyrillic, Malayalam, Hebrew, Arabic,
    CJK names), CPython's CJK test texts and changelogs, then Python sources; stable order."""
    docs: list[str] = []
    size = 0
    test_dir = Path(sysconfig.get_paths()["stdlib"]) / "test"
    sources = [
        *sorted((test_dir / "cjkencodings").glob("*-utf8.txt")),
        *sorted(Path("/usr/share/doc").glob("*/copyright")),
        *sorted(Path("/usr/share/doc").glob("*/changelog.Debian.gz"))[:40],
    ]
    for path in sources:
        try:
            raw = gzip.open(path).read() if path.suffix == ".gz" else path.read_bytes()
        except OSError:
            continue
        text = raw.decode("utf-8", errors="replace")[:20_000]
        if text.strip():
            docs.append(text)
            size += len(text)
        if size >= limit:
            break
    lines = real_lines(3000)
    docs += ["\n".join(lines[i : i + 50]) for i in range(0, len(lines), 50)]
    return docs


@pytest.fixture(scope="module")
def corpus() -> list[str]:
    return real_corpus()


@pytest.fixture(scope="module")
def bpe_json(tmp_path_factory, corpus) -> Path:
    """A GPT-2-like byte-level BPE (ByteLevel pre-tokenizer, `<|endoftext|>` added) trained on the corpus."""
    return train_bpe_tokenizer(corpus, 3000, tmp_path_factory.mktemp("tok") / "tokenizer.json")


@pytest.fixture(scope="module")
def specials_json(tmp_path_factory, bpe_json) -> Path:
    """The trained file with more added tokens, special and not, matched anywhere in text."""
    data = json.loads(bpe_json.read_text())
    next_id = 1 + max(data["model"]["vocab"].values())
    for i, (content, special) in enumerate([("<|im_start|>", True), ("<|im_end|>", True), ("[SEP]", True),
                                            ("<tool>", False)]):
        data["added_tokens"].append({"id": next_id + i, "content": content, "single_word": False, "lstrip": False,
                                     "rstrip": False, "normalized": False, "special": special})
    out = tmp_path_factory.mktemp("specials") / "tokenizer.json"
    out.write_text(json.dumps(data, ensure_ascii=False))
    return out


def train_without_byte_alphabet(texts: list[str], path: Path) -> Path:
    """A byte-level BPE as many train one: `models.BPE()` + `BpeTrainer` with no `initial_alphabet`."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(texts, trainers.BpeTrainer(vocab_size=1500, special_tokens=["<|endoftext|>"],
                                                       show_progress=False))
    path.parent.mkdir(parents=True, exist_ok=True)
    tok.save(str(path))
    return path


@pytest.fixture(scope="module")
def nobytes_json(tmp_path_factory, corpus) -> Path:
    """Trained on the English part of the corpus only: bytes of other scripts are not in its vocabulary."""
    path = train_without_byte_alphabet(corpus[-40:], tmp_path_factory.mktemp("nobytes") / "tokenizer.json")
    assert read_byte_level_bpe(path).missing_bytes, "the vocabulary should lack some byte symbols"
    return path


def write_ranks(path: Path, ranks: dict[bytes, int]) -> Path:
    path.write_text("".join(f"{base64.b64encode(t).decode()} {r}\n" for t, r in sorted(ranks.items(), key=lambda kv: kv[1])))
    return path


@pytest.fixture(scope="module")
def ranks_file(tmp_path_factory, bpe_json) -> Path:
    """The same merges as a .tiktoken ranks file (ids 0..n-1: id 0 was `<|endoftext|>`)."""
    ranks, _ = tiktoken_ranks(read_byte_level_bpe(bpe_json))
    assert sorted(ranks.values()) == list(range(1, len(ranks) + 1))
    return write_ranks(tmp_path_factory.mktemp("tt") / "trained.tiktoken", {t: r - 1 for t, r in ranks.items()})


ALL_JSON = ("tokenizers", "tiktoken", "fastokens", "gigatoken")
ALL_TIKTOKEN = ("tiktoken", "fastokens", "gigatoken")


@pytest.fixture(scope="module")
def vocabs(bpe_json, ranks_file, specials_json, nobytes_json) -> dict[str, tuple[Path, tuple[str, ...]]]:
    """name -> (file, backends that can load it; the reference first)."""
    found = {"json": (bpe_json, ALL_JSON), "tiktoken": (ranks_file, ALL_TIKTOKEN),
             "json+specials": (specials_json, ALL_JSON), "json without every byte": (nobytes_json, ALL_JSON)}
    if GPT2.is_file():  # the real GPT-2 vocabulary, where a developer has it (bench/cli.py says how)
        found["gpt2"] = (GPT2, ALL_TIKTOKEN)
    return found


def vocabularies(bpe_json: Path, ranks_file: Path) -> dict[str, tuple[Path, tuple[str, ...]]]:
    """name -> (file, backends that can load it): the two trained files."""
    return {"json": (bpe_json, ALL_JSON), "tiktoken": (ranks_file, ALL_TIKTOKEN)}


def installed_backends(names: tuple[str, ...]) -> list[str]:
    return [n for n in names if tb.installed(n)]


def with_special_tokens(corpus: list[str], seed: int = 0) -> list[str]:
    """Real documents with added-token text spliced in at random places (inside words too)."""
    rng = np.random.default_rng(seed)
    tokens = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "[SEP]", "<tool>", "<|im_start", "[SEP"]
    out = []
    for doc in corpus[::3]:
        cuts = sorted(rng.integers(0, len(doc) + 1, size=3).tolist())
        parts = [doc[a:b] for a, b in zip([0, *cuts], [*cuts, len(doc)])]
        out.append("".join(p + (str(rng.choice(tokens)) if i < len(cuts) else "") for i, p in enumerate(parts)))
    return out


def test_every_backend_matches_the_reference_on_real_text(vocabs, corpus):
    texts = corpus + with_special_tokens(corpus)
    for name, (path, backends) in vocabs.items():
        reference = load_tokenizer(str(path), backends[0])
        assert reference.backend == backends[0]
        want = reference.encode_batch(texts)
        assert sum(map(len, want)) > 50_000, "the corpus should be real text, and plenty of it"
        for backend in installed_backends(backends):
            tok = load_tokenizer(str(path), backend)
            assert tok.backend == backend
            assert tok.encode_batch(texts) == want, f"{name}: {backend} differs from {backends[0]}"
            assert [tok.encode(t) for t in texts[:20]] == want[:20]
            if tok.encode_flat is not None:
                ids, offsets = tok.encode_flat(texts)
                assert [ids[a:b].tolist() for a, b in zip(offsets[:-1], offsets[1:])] == want, f"{name}: {backend} flat"
            assert tok.fingerprint() == reference.fingerprint()
            assert (tok.eos_id, tok.vocab_size) == (reference.eos_id, reference.vocab_size)


# Text that stresses pre-tokenization: special-token text, whitespace runs, contractions, digits, scripts.
PIECES = [
    "<|endoftext|>", "<|endoftext", "endoftext|>", "<|", "|>", "<s>", "</s>", " ", "  ", "   ", "\n", "\n\n", "\t",
    "\r\n", "\r", "\u00a0", "\u2003", "\u3000", "\u200b", "\u0085", "\u2028", "\x0b", "\x0c", "'s", "'S", "'ll", "'VE",
    "'re", "'d", "'m", "'t", "n't", "'", "123", "4567890", "١٢٣", "Ⅻ", "½", "x²", "hello", " world", "Ünïcödé",
    "日本語のテキスト", "中文", "한국어", "русский", "ελληνικά", "עברית", "العربية", "हिन्दी", "ไทย", "😀",
    "👩\u200d👩\u200d👧", "🇫🇷", "e\u0301", "\ufeff", "\ufffd", "\x00", "\x7f", "...", "—", "$$", "{}",
]
# Characters regex engines classify differently (Unicode version, `\s` definitions): U+180E was a
# space before Unicode 6.3, and fastokens' own .tiktoken loader still splits it as one.
EDGES = "\u180e\u200b\u1680\u2000\u2007\u202f\u205f\u2028\x1c\x1d\x1e\x1f\x85\U0001e4d0\U00010d40\U0002ebf0\U000e0020"
PIECES += list(EDGES)


def test_characters_regex_engines_disagree_on(vocabs):
    texts = [t.format(c=c) for c in EDGES for t in ("x{c}'ll", "{c}'s", " {c} ", "{c}\n", "a{c}1", "{c}{c}'ve")]
    for name, (path, backends) in vocabs.items():
        want = load_tokenizer(str(path), backends[0]).encode_batch(texts)
        for backend in installed_backends(backends[1:]):
            assert load_tokenizer(str(path), backend).encode_batch(texts) == want, f"{name}: {backend}"
random_text = st.lists(
    st.one_of(st.sampled_from(PIECES), st.text(st.characters(min_codepoint=0, max_codepoint=0x10FFFF), max_size=12)),
    max_size=12,
).map(lambda parts: "".join(parts).encode("utf-8", "surrogatepass").decode("utf-8", "replace"))  # as readers do


@pytest.fixture(scope="module")
def loaded(vocabs) -> list[tuple[str, object, list[object]]]:
    """(name, reference, [other backends]) per vocabulary, loaded once for the random-text test."""
    out = []
    for name, (path, backends) in vocabs.items():
        others = [load_tokenizer(str(path), b) for b in installed_backends(backends[1:])]
        out.append((name, load_tokenizer(str(path), backends[0]), others))
    return out


# 400 random texts through the encode_batch of every backend that the real-text test above runs in make test: CI.
@pytest.mark.slow
@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(texts=st.lists(random_text, min_size=1, max_size=8))
def test_every_backend_matches_the_reference_on_random_unicode(loaded, texts):
    for name, reference, others in loaded:
        want = reference.encode_batch(texts)
        for tok in others:
            assert tok.encode_batch(texts) == want, f"{name}: {tok.backend} differs on {texts!r}"


@needs_fastokens
def test_auto_picks_fastokens_for_both_kinds_of_vocabulary(bpe_json, ranks_file):
    assert load_tokenizer(str(bpe_json)).backend == "fastokens"
    assert load_tokenizer(str(bpe_json.parent)).backend == "fastokens"  # a folder holding tokenizer.json
    assert load_tokenizer(str(ranks_file), "auto").backend == "fastokens"


@needs_gigatoken
def test_auto_without_fastokens_takes_gigatoken(bpe_json, ranks_file, monkeypatch):
    real = tb.installed
    monkeypatch.setattr(tb, "installed", lambda name: name != "fastokens" and real(name))
    assert load_tokenizer(str(bpe_json)).backend == "gigatoken"
    assert load_tokenizer(str(ranks_file)).backend == "gigatoken"


def test_auto_without_fastokens_takes_tiktoken_then_tokenizers(bpe_json, ranks_file, monkeypatch):
    real = tb.installed
    monkeypatch.setattr(tb, "installed", lambda name: name not in ("fastokens", "gigatoken") and real(name))
    expected = "tiktoken" if HAS_TIKTOKEN else "tokenizers"
    assert load_tokenizer(str(bpe_json)).backend == expected
    with pytest.raises(ValueError, match=r"backend 'fastokens' cannot serve .*not installed \(pip install 'llm-stream-data\[fastokens\]'\)"):
        load_tokenizer(str(bpe_json), "fastokens")
    monkeypatch.setattr(tb, "installed", lambda name: name == "tokenizers")
    assert load_tokenizer(str(bpe_json)).backend == "tokenizers"


def test_an_engine_that_fails_to_load_a_vocabulary_is_skipped(bpe_json, tmp_path):
    # Ranks with a gap (0 unused): tiktoken takes them, fastokens refuses them at load.
    ranks, _ = tiktoken_ranks(read_byte_level_bpe(bpe_json))
    path = write_ranks(tmp_path / "gap.tiktoken", ranks)
    assert load_tokenizer(str(path)).backend == "tiktoken"
    if HAS_FASTOKENS:
        with pytest.raises(ValueError, match="backend 'fastokens' cannot serve .*failed to load it"):
            load_tokenizer(str(path), "fastokens")


def test_tokenizers_cannot_load_a_tiktoken_file(ranks_file):
    with pytest.raises(ValueError, match="backend 'tokenizers' cannot load .*trained.tiktoken; use fastokens or gigatoken or tiktoken"):
        load_tokenizer(str(ranks_file), "tokenizers")


def test_backend_names_are_checked_and_the_environment_variable_is_read(bpe_json, monkeypatch):
    with pytest.raises(ValueError, match="unknown tokenizer backend 'rust'"):
        load_tokenizer(str(bpe_json), "rust")
    with pytest.raises(ValueError, match="unknown tokenizer backend 'nope'"):
        load_tokenizer("simple", "nope")
    monkeypatch.setenv("LLM_TOKENIZER_BACKEND", "tokenizers")
    assert load_tokenizer(str(bpe_json)).backend == "tokenizers"
    assert load_tokenizer("simple").backend == "simple"
    monkeypatch.setenv("LLM_TOKENIZER_BACKEND", "bogus")
    with pytest.raises(ValueError, match=r"\$LLM_TOKENIZER_BACKEND"):
        load_tokenizer(str(bpe_json))


def edited(bpe_json: Path, tmp_path: Path, edit) -> Path:
    data = json.loads(bpe_json.read_text())
    edit(data)
    out = tmp_path / "edited.json"
    out.write_text(json.dumps(data))
    return out


@pytest.mark.parametrize(
    ("what", "edit"),
    [
        ("normalizer", lambda d: d.update(normalizer={"type": "NFC"})),
        ("dropout", lambda d: d["model"].update(dropout=0.1)),
        ("prefix space", lambda d: d["pre_tokenizer"].update(add_prefix_space=True)),
        ("not ByteLevel", lambda d: d.update(pre_tokenizer={"type": "Whitespace"})),
        ("lstrip", lambda d: d["added_tokens"][0].update(lstrip=True)),
        ("truncation", lambda d: d.update(truncation={"direction": "Right", "max_length": 8, "strategy": "LongestFirst", "stride": 0})),
    ],
)
def test_structures_outside_the_verified_one_fall_back_to_tokenizers(bpe_json, tmp_path, what, edit):
    path = edited(bpe_json, tmp_path, edit)
    assert load_tokenizer(str(path)).backend == "tokenizers"
    for backend in installed_backends(("tiktoken", "fastokens", "gigatoken")):
        with pytest.raises(ValueError, match=f"backend '{backend}' cannot serve"):
            load_tokenizer(str(path), backend)


def abc_vocabulary(tmp_path: Path, bpe_json: Path, merges: list[list[str]]) -> Path:
    """The trained file with only the 256 byte symbols and `merges` over a, b, c (ids in merge order)."""
    data = json.loads(bpe_json.read_text())
    byte_symbols = sorted((s for s in data["model"]["vocab"] if len(s) == 1), key=lambda s: data["model"]["vocab"][s])
    vocab = {"<|endoftext|>": 0, **{s: i + 1 for i, s in enumerate(byte_symbols)}}
    for left, right in merges:
        vocab[left + right] = len(vocab)
    data["model"].update(vocab=vocab, merges=merges)
    data["added_tokens"][0]["id"] = 0
    out = tmp_path / "abc.json"
    out.write_text(json.dumps(data))
    return out


@needs_tiktoken
def test_tiktoken_is_refused_where_rank_order_merging_would_differ(bpe_json, tmp_path):
    # "abc" is listed as a + bc, but rank order merges a + b first: tokenizers stops at [ab, c],
    # tiktoken would go on to "abc". The structure check refuses it; fastokens follows the merge list.
    path = abc_vocabulary(tmp_path, bpe_json, [["a", "b"], ["b", "c"], ["a", "bc"]])
    with pytest.raises(Unsupported, match="rank-order merging does not split b'abc'"):
        tiktoken_ranks(read_byte_level_bpe(path))
    with pytest.raises(ValueError, match="backend 'tiktoken' cannot serve"):
        load_tokenizer(str(path), "tiktoken")
    reference = load_tokenizer(str(path), "tokenizers")
    assert reference.encode("abc") == [reference._tok.token_to_id("ab"), reference._tok.token_to_id("c")]
    assert load_tokenizer(str(path)).backend == ("fastokens" if HAS_FASTOKENS else "tokenizers")
    ok = abc_vocabulary(tmp_path, bpe_json, [["a", "b"], ["b", "c"], ["ab", "c"]])
    texts = ["abc ab bc abcabc", "cab bca", "aabbcc"]
    assert load_tokenizer(str(ok), "tiktoken").encode_batch(texts) == load_tokenizer(str(ok), "tokenizers").encode_batch(texts)


@needs_fastokens
def test_a_failed_self_check_falls_back_under_auto_and_is_an_error_when_asked_for(bpe_json, monkeypatch, caplog):
    real = tb.FastokensEncoder.encode_batch
    monkeypatch.setattr(tb.FastokensEncoder, "encode_batch", lambda self, texts: [ids[::-1] for ids in real(self, texts)])
    with caplog.at_level(logging.WARNING, logger="llm.data.tokenize.tokenizers"):
        tok = load_tokenizer(str(bpe_json))
    assert tok.backend == ("gigatoken" if HAS_GIGATOKEN else "tiktoken" if HAS_TIKTOKEN else "tokenizers")
    assert "fastokens not used" in caplog.text and "self-check" in caplog.text
    with pytest.raises(ValueError, match="backend 'fastokens' cannot serve .*self-check"):
        load_tokenizer(str(bpe_json), "fastokens")


def test_a_pickled_tokenizer_keeps_its_backend(bpe_json, ranks_file):
    for path in (bpe_json, ranks_file):
        for backend in installed_backends(ALL_JSON):
            if backend == "tokenizers" and path.suffix == ".tiktoken":
                continue
            tok = load_tokenizer(str(path), backend)
            copy = pickle.loads(pickle.dumps(tok))
            assert copy.backend == backend and copy.encode("héllo <|endoftext|> wörld") == tok.encode("héllo <|endoftext|> wörld")


def test_the_dataset_is_the_same_whichever_backend_made_it(bpe_json, corpus, tmp_path):
    src = write_jsonl(tmp_path / "in.jsonl", corpus[:60])
    backends = installed_backends(ALL_JSON)
    made = {}
    for backend in backends:
        optimize_text([str(src)], tmp_path / backend, str(bpe_json), num_workers=0, progress=False,
                      chunk_bytes="64KB", tokenizer_backend=backend)
        made[backend] = Manifest.load(tmp_path / backend)
        assert made[backend].tokenizer_backend == backend
    first = made[backends[0]]
    for backend, manifest in made.items():
        assert [(s.checksum, s.tokens, s.documents) for s in manifest.shards] == [
            (s.checksum, s.tokens, s.documents) for s in first.shards
        ], backend
        assert manifest.tokenizer == first.tokenizer
        # The fingerprint names shard files (fresh run ids each run), never the backend.
        before = manifest.fingerprint()
        manifest.tokenizer_backend = "something else"
        assert manifest.fingerprint() == before
    # An append by another engine records both; an old manifest without the field still loads.
    other = backends[-1]
    optimize_text([str(src)], tmp_path / backends[0], str(bpe_json), num_workers=1, progress=False,
                  mode="append", tokenizer_backend=other)
    appended = Manifest.load(tmp_path / backends[0])
    assert appended.tokenizer_backend == ",".join(dict.fromkeys([backends[0], other]))
    index = tmp_path / backends[0] / "index.json"
    data = json.loads(index.read_text())
    del data["tokenizer_backend"]
    index.write_text(json.dumps(data))
    assert Manifest.load(tmp_path / backends[0]).tokenizer_backend is None


def test_llm_data_info_says_which_backend_encoded(bpe_json, corpus, tmp_path, capsys):
    from llm.cli.data import main

    src = write_jsonl(tmp_path / "in.jsonl", corpus[:10])
    assert main(["optimize", str(src), "-o", str(tmp_path / "ds"), "--tokenizer", str(bpe_json), "--no-progress",
                 "--num-workers", "0", "--tokenizer-backend", "tokenizers"]) == 0
    capsys.readouterr()
    assert main(["info", str(tmp_path / "ds")]) == 0
    out = capsys.readouterr().out
    assert "  encoded by   tokenizers" in out.splitlines()
    assert main(["info", str(tmp_path / "ds"), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["tokenizer_backend"] == "tokenizers"


@pytest.mark.parametrize("backend", [pytest.param("fastokens", marks=needs_fastokens),
                                     pytest.param("gigatoken", marks=needs_gigatoken)])
@pytest.mark.parametrize("which", ["json", "tiktoken"])
def test_the_flat_batch_path_gives_the_same_documents(bpe_json, ranks_file, corpus, which, backend):
    from llm.data.tokenize.documents import encode_each, tokenize_documents

    tok = load_tokenizer(str(bpe_json if which == "json" else ranks_file), backend)
    assert tok.encode_flat is not None
    texts = corpus[:300] + ["", "<|endoftext|> inside", "x\u180e'll"]
    reference = [np.asarray(ids, dtype=np.int64) for ids in tok.encode_batch(texts)]
    assert all(np.array_equal(a, b) for a, b in zip(encode_each(tok, texts), reference, strict=True))
    flat, lengths = tokenize_documents(tok, texts)
    expected = np.concatenate([np.append(r, tok.eos_id) for r in reference])
    assert np.array_equal(flat, expected) and lengths.tolist() == [len(r) + 1 for r in reference]


def test_a_ranks_file_is_converted_for_fastokens_once_and_a_damaged_conversion_is_redone(ranks_file, corpus, tmp_path,
                                                                                         monkeypatch):
    if not tb.installed("fastokens"):
        pytest.skip("fastokens is not installed (pip install 'llm-stream-data[fastokens]')")
    monkeypatch.setenv("LLM_CACHE_DIR", str(tmp_path / "cache"))
    conversions: list[int] = []
    real = tb.tokenizer_json_from_ranks
    monkeypatch.setattr(tb, "tokenizer_json_from_ranks", lambda ranks: (conversions.append(len(ranks)), real(ranks))[1])
    want = load_tokenizer(str(ranks_file), "tiktoken").encode_batch(corpus[:50])
    first = load_tokenizer(str(ranks_file), "fastokens")
    cached = list((tmp_path / "cache" / "tokenizers").glob("*.json"))
    assert len(conversions) == 1 and len(cached) == 1
    second = load_tokenizer(str(ranks_file), "fastokens")
    assert len(conversions) == 1  # read back, not converted again
    cached[0].write_text(cached[0].read_text()[:1000])  # a torn file: converted again, ids unchanged
    third = load_tokenizer(str(ranks_file), "fastokens")
    assert len(conversions) == 2
    for tok in (first, second, third):
        assert tok.backend == "fastokens" and tok.encode_batch(corpus[:50]) == want


def test_a_vocabulary_without_every_byte_symbol_is_served_fast_and_identically(nobytes_json, corpus, caplog):
    # tokenizers drops the bytes such a vocabulary lacks; the fast engines refuse the file as it is.
    # They get it completed with those symbols, and every document holding one is encoded again by
    # tokenizers (ids checked on real text and random Unicode by the tests above).
    reference = load_tokenizer(str(nobytes_json), "tokenizers")
    fast = installed_backends(("fastokens", "gigatoken", "tiktoken"))
    with caplog.at_level(logging.INFO, logger="llm.data.tokenize.tokenizers"):
        tok = load_tokenizer(str(nobytes_json))
    assert tok.backend == (fast[0] if fast else "tokenizers")
    if not fast:
        return
    assert "lacks some of the 256 byte symbols" in caplog.text
    encoder = tok._encoder
    encoder.documents_redone = 0
    english, other = corpus[-40:], corpus[:40]  # the text it was trained on, and text in other scripts
    assert tok.encode_batch(english) == reference.encode_batch(english)
    assert encoder.documents_redone == 0, "text within the vocabulary's bytes is encoded by the fast engine alone"
    assert tok.encode_batch(other) == reference.encode_batch(other)
    assert 0 < encoder.documents_redone <= len(other)
    # Tokens either side of dropped bytes merge in tokenizers ("th" + "e"), which the completed
    # vocabulary alone would keep apart: "ж" (D0 B6) is a letter whose bytes it lacks.
    symbols = {b: c for c, b in byte_decoder().items()}
    assert {symbols[b] for b in "ж".encode()} <= set(read_byte_level_bpe(nobytes_json).missing_bytes)
    assert reference.encode("thжe") == reference.encode("the")
    assert tok.encode("thжe") == reference.encode("thжe") and tok.encode_batch(["thжe"]) == [reference.encode("the")]


@needs_gigatoken
def test_gigatoken_is_rebuilt_after_its_character_budget_and_keeps_its_ids(bpe_json, corpus):
    # gigatoken 0.10 caches every pre-token it meets, without a bound: the encoder builds a new
    # tokenizer (and drops the caches) after a budget of characters, with the same ids.
    reference = load_tokenizer(str(bpe_json), "tokenizers")
    tok = load_tokenizer(str(bpe_json), "gigatoken")
    encoder = tok._encoder
    encoder._rebuild_chars = 50_000
    before = encoder._tok
    want = reference.encode_batch(corpus)
    got = [ids for i in range(0, len(corpus), 16) for ids in tok.encode_batch(corpus[i : i + 16])]
    assert got == want
    assert encoder.rebuilds > 1 and encoder._tok is not before
