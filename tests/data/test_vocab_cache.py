"""A .tiktoken file's converted vocabulary is kept by its digest, trusted only when its recorded hash matches."""

from __future__ import annotations

import base64
from pathlib import Path

import pytest

from llm.data.tokenize import engines


def _ranks() -> dict[bytes, int]:
    ranks = {bytes([b]): b for b in range(256)}
    for i, pair in enumerate((b"th", b"he", b"the", b"in")):
        ranks[pair] = 256 + i
    return ranks


@pytest.fixture
def cache(tmp_path: Path, monkeypatch) -> Path:
    monkeypatch.setattr(engines, "cache_home", lambda: tmp_path)
    return tmp_path / "tokenizers"


def test_a_kept_conversion_is_reused_and_a_damaged_one_converted_again(cache: Path, monkeypatch):
    ranks = _ranks()
    first = engines.converted_vocabulary(ranks, "d1")
    kept = cache / f"d1-ranks-v{engines._CONVERSION_VERSION}.json"
    assert kept.read_text() == first and kept.with_name(kept.name + ".xxh3").is_file()

    calls = []
    real = engines.tokenizer_json_from_ranks
    monkeypatch.setattr(engines, "tokenizer_json_from_ranks", lambda r: calls.append(1) or real(r))
    assert engines.converted_vocabulary(ranks, "d1") == first and calls == []  # read back, not converted

    damaged = bytearray(kept.read_bytes())
    damaged[len(damaged) // 2] ^= 1  # one bit: still the right size, maybe still JSON
    kept.write_bytes(bytes(damaged))
    assert engines.converted_vocabulary(ranks, "d1") == first and calls == [1]
    assert kept.read_text() == first  # and written again whole

    kept.with_name(kept.name + ".xxh3").unlink()  # a crash between the two writes
    assert engines.converted_vocabulary(ranks, "d1") == first and calls == [1, 1]


def test_a_tiktoken_file_loads_the_same_ids_from_the_kept_conversion(cache: Path, tmp_path: Path):
    from llm.data.tokenize.tokenizers import load_tokenizer

    path = tmp_path / "tiny.tiktoken"
    path.write_text("".join(f"{base64.b64encode(t).decode()} {r}\n" for t, r in _ranks().items()))
    text = "the thin hen in the inn"
    cold = load_tokenizer(str(path))
    warm = load_tokenizer(str(path))  # the conversion from the cache, when an engine takes one
    assert list(cold.encode(text)) == list(warm.encode(text))
    assert cold.decode(cold.encode(text)) == text
