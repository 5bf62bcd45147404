"""The MinHash engines (`--minhash auto|rensa|numpy`): each deterministic, both finding the planted copies,
the engine recorded and a rerun held to it; the vectorised band keys and word hashes against their definitions."""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pytest

import llm.data.corpus_dedup.minhash as minhash
from llm.cli.data import main as data_main
from llm.data import dedup_corpus
from llm.data.corpus_dedup.lsh import all_band_keys, band_keys
from llm.data.corpus_dedup.minhash import MinHasher, estimated_jaccard, resolve_engine
from llm.data.corpus_dedup.pipeline import DedupRunMismatch
from tests.data.corpus_dedup.helpers import tree, write_corpus


def _needs_rensa() -> None:
    pytest.importorskip("rensa")  # an optional extra, in `dev`: CI runs these


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("corpus")
    write_corpus(folder)
    return folder


def _removed(out: Path) -> list[tuple[str, int, str]]:
    rows = [json.loads(line) for line in (out / "dedup-removed.jsonl").read_text().splitlines()]
    return [(Path(r["file"]).name, r["line"], r["reason"]) for r in rows]


def test_both_engines_find_the_planted_copies_and_the_report_names_the_engine(corpus: Path, tmp_path: Path) -> None:
    _needs_rensa()
    found = {}
    for engine in ("rensa", "numpy"):
        report = dedup_corpus([str(corpus)], tmp_path / engine, near=0.8, num_workers=0, progress=False, minhash=engine)
        assert report["parameters"]["minhash"] == engine
        found[engine] = _removed(tmp_path / engine)
    assert found["rensa"] == found["numpy"] and len(found["rensa"]) == 6
    # auto takes rensa when it is installed
    report = dedup_corpus([str(corpus)], tmp_path / "auto", near=0.8, num_workers=0, progress=False)
    assert report["parameters"]["minhash"] == "rensa"


@pytest.mark.parametrize("engine", ["rensa", "numpy"])
def test_an_engine_gives_the_same_bytes_whatever_the_workers_and_chunks(corpus: Path, tmp_path: Path, engine: str) -> None:
    _needs_rensa()
    dedup_corpus([str(corpus)], tmp_path / "one", near=0.8, num_workers=0, progress=False, minhash=engine)
    dedup_corpus([str(corpus)], tmp_path / "two", near=0.8, num_workers=2, progress=False, minhash=engine,
                 chunk_records=7)
    one, two = tree(tmp_path / "one"), tree(tmp_path / "two")
    for t in (one, two):
        t.pop(".dedup-plan.json")
        t.pop("dedup.json")
    assert one == two


def test_a_rerun_with_another_engine_is_refused(corpus: Path, tmp_path: Path) -> None:
    _needs_rensa()
    dedup_corpus([str(corpus)], tmp_path / "out", near=0.8, num_workers=0, progress=False, minhash="numpy")
    with pytest.raises(DedupRunMismatch, match="other inputs or parameters"):
        dedup_corpus([str(corpus)], tmp_path / "out", near=0.8, num_workers=0, progress=False, minhash="rensa")


def test_engine_names_are_checked_in_one_sentence(monkeypatch, corpus: Path, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"minhash engine must be one of auto, rensa, numpy, got 'fast'"):
        dedup_corpus([str(corpus)], tmp_path / "out", near=0.8, progress=False, minhash="fast")
    with pytest.raises(ValueError, match=r"minhash engine must be one of"):
        dedup_corpus([str(corpus)], tmp_path / "out", progress=False, minhash="fast")  # exact only: still checked
    monkeypatch.setattr(minhash, "rensa_available", lambda: False)
    assert resolve_engine("auto") == "numpy"
    with pytest.raises(ValueError, match=r"'rensa' is not installed: pip install 'llm-stream-data\[dedup-fast\]'"):
        resolve_engine("rensa")
    # exact only: no signatures, so a missing engine does not matter
    report = dedup_corpus([str(corpus)], tmp_path / "exact", progress=False, num_workers=0, minhash="rensa")
    assert report["removed"] == 3 and "minhash" not in report["parameters"]


def test_the_cli_takes_minhash(corpus: Path, tmp_path: Path, capsys) -> None:
    assert data_main(["dedup", str(corpus), "--output", str(tmp_path / "o"), "--near", "0.8", "--num-workers", "0",
                      "--no-progress", "--minhash", "numpy"]) == 0
    assert json.loads((tmp_path / "o" / "dedup.json").read_text())["parameters"]["minhash"] == "numpy"
    with pytest.raises(SystemExit):
        data_main(["dedup", str(corpus), "--output", str(tmp_path / "p"), "--near", "0.8", "--minhash", "fast"])
    assert "invalid choice: 'fast'" in capsys.readouterr().err


def _shingles(text: str, n: int = 5) -> set:
    words = text.lower().split()
    return {tuple(words[i : i + n]) for i in range(max(1, len(words) - n + 1))}


def test_rensa_signatures_estimate_the_same_jaccard_and_do_not_depend_on_batching(monkeypatch) -> None:
    _needs_rensa()
    rng = random.Random(1)
    vocab = [f"v{i}" for i in range(500)]
    base = [rng.choice(vocab) for _ in range(400)]
    hasher = MinHasher(256, 5, seed=3, engine="rensa")
    for every in (10, 25, 60):
        other = [("x" + w) if i % every == 0 else w for i, w in enumerate(base)]
        a, b = " ".join(base), " ".join(other)
        truth = len(_shingles(a) & _shingles(b)) / len(_shingles(a) | _shingles(b))
        sig = hasher.signatures([a, "short text", b])
        assert abs(float(estimated_jaccard(sig[[0]], sig[[2]])[0]) - truth) < 0.08, (every, truth)
    texts = [" ".join(rng.choices(["a", "b", "c", "dd", "ee"], k=rng.randint(1, 300))) for _ in range(200)]
    whole = MinHasher(32, 5, seed=1, engine="rensa").signatures(texts)
    monkeypatch.setattr(minhash, "_BATCH_CHARS", 500)
    assert (MinHasher(32, 5, seed=1, engine="rensa").signatures(texts) == whole).all()
    assert not (MinHasher(32, 5, seed=1, engine="numpy").signatures(texts) == whole).all()  # another sketch


def test_word_hashes_are_the_polynomial_hash_of_each_word() -> None:
    """The prefix-sum shortcut against the definition, word by word (ASCII whitespace splits, case folded)."""
    texts = ["The cat\tSAT\n", "", "  naïve   été x\x1cy ", "a" * 300 + " b"]
    hashes, counts = MinHasher(8, 5, seed=1).word_hashes(texts)
    words = [w for t in texts for w in t.lower().encode().split() for w in w.split(b"\x1c")]
    assert counts.tolist() == [3, 0, 4, 2] and len(hashes) == len(words)
    base, mask = 0x100000001B3, (1 << 64) - 1
    for word, got in zip(words, hashes.tolist()):
        total = sum((byte + 1) * pow(base, i, 1 << 64) for i, byte in enumerate(word)) & mask
        mixed = minhash.mix64(np.array([total ^ ((len(word) * 0xC2B2AE3D27D4EB4F) & mask)], dtype=np.uint64))
        assert got == int(mixed[0]), word


def test_all_band_keys_are_each_bands_key() -> None:
    signatures = np.random.default_rng(0).integers(0, 2**32, size=(300, 128), dtype=np.uint32)
    keys = all_band_keys(signatures, 14, 9)
    assert keys.shape == (14, 300)
    for band in range(14):
        assert (keys[band] == band_keys(signatures, band, 9)).all()
