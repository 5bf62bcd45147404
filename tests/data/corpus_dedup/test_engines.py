"""The MinHash engines (`--minhash auto|rensa|numpy`): each deterministic, both finding the planted copies,
the engine recorded and a rerun held to it; the vectorised band keys and word hashes against their definitions."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest

import llm.data.corpus_dedup.minhash as minhash
from llm.cli.data import main as data_main
from llm.data import dedup_corpus
from llm.data.corpus_dedup.lsh import all_band_keys, band_keys
from llm.data.corpus_dedup.minhash import MinHasher, resolve_engine
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


WHITESPACE_COPIES = ["naïve été {} words\u00a0of the first record", "naïve été {} words of\u3000the first\n\nrecord",
                     "naïve\x1cété {} words of the\u2028first record", "NAÏVE ÉTÉ {} WORDS OF THE FIRST RECORD",
                     "naïve été {} words of the first record\u0085and a tail"]


def _pinned_tree(out: Path, inputs: Path) -> str:
    """sha256 of the output (dedup.json's timings-free bytes included), the input folder's path taken out."""
    files = tree(out)
    files.pop(".dedup-plan.json")
    digest = hashlib.sha256()
    for name, data in files.items():
        digest.update(name.encode() + b"\0" + data.replace(str(inputs).encode(), b"IN") + b"\0")
    return digest.hexdigest()[:16]


PINNED_OUTPUT = {"numpy": "3f18093a3a6ecb9c", "rensa": "39b156f3785ffc67"}


@pytest.mark.parametrize("engine", ["numpy", "rensa"])
def test_the_output_of_each_engine_is_pinned_byte_for_byte(tmp_path: Path, engine: str) -> None:
    """Kept records, dedup.json and dedup-removed.jsonl: the same bytes as when this was pinned (a change of
    normalisation, hashing or signing shows here), with records only Unicode whitespace or case apart."""
    if engine == "rensa":
        _needs_rensa()
    inputs = tmp_path / "in"
    write_corpus(inputs)
    body = " ".join(f"w{i}" for i in range(60))
    lines = [json.dumps({"text": t.format(body)}, ensure_ascii=False) for t in WHITESPACE_COPIES]
    (inputs / "f.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    report = dedup_corpus([str(inputs)], tmp_path / "out", near=0.8, num_workers=0, progress=False, minhash=engine)
    assert report["exact_duplicates"] >= 5 and report["near_duplicates"] >= 3
    assert _pinned_tree(tmp_path / "out", inputs) == PINNED_OUTPUT[engine]
