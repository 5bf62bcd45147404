"""`llm.data.dedup.normalize` is the guide's framework's default dedup normalisation, character for character.

The guide's framework strips the record and collapses every whitespace run to one space
(`re.sub(r"\\s+", " ", text.strip())`), case-sensitive. Ours (`" ".join(text.split())`) gives the same
string for every input, so digests in the guide's seen-hashes files match ours, and the fingerprint's
name for it stays `collapse-whitespace` (saved states keep resuming).
"""

from __future__ import annotations

import hashlib
import re
import sys

from hypothesis import given, settings
from hypothesis import strategies as st

from llm.data.dedup import DedupTextSource, normalize, text_digest
from llm.data.sources import LocalLineTextSource

_RUN = re.compile(r"\s+")


def guide_normalize(text: str) -> str:
    """The guide's framework's `_default_dedup_normalize`, as its source defines it."""
    return _RUN.sub(" ", text.strip())


WHITESPACE = "".join(chr(c) for c in range(sys.maxunicode + 1) if chr(c).isspace() or _RUN.fullmatch(chr(c)))


def test_every_whitespace_code_point_is_whitespace_to_both():
    assert len(WHITESPACE) == 29  # \t-\r, \x1c-\x1f, space, \x85, \xa0, U+1680, U+2000-200A, ... U+3000
    for c in WHITESPACE:
        assert normalize(f"{c}a{c}{c}b{c}") == guide_normalize(f"{c}a{c}{c}b{c}") == "a b", hex(ord(c))
    assert normalize("a\u200bb") == guide_normalize("a\u200bb") == "a\u200bb"  # a zero-width space is not whitespace


@settings(max_examples=400, deadline=None)
@given(st.text(alphabet=st.one_of(st.sampled_from(WHITESPACE), st.sampled_from("aB\u00e9\u4e2d.\u200b"),
                                  st.characters()), max_size=40))
def test_normalize_equals_the_guides_for_any_text(text):
    assert normalize(text) == guide_normalize(text)


def test_case_is_kept_and_digests_match_the_guides_hex_lines(tmp_path):
    assert normalize("Apple") != normalize("apple")  # case-sensitive, as the guide's
    assert text_digest(" a\u3000 b\n", "sha256") == hashlib.sha256(b"a b").digest()[:16]
    path = tmp_path / "a.txt"
    path.write_text("Apple  pie\napple pie\n Apple\tpie \n")
    src = DedupTextSource(LocalLineTextSource(path), seen_hashes_path=tmp_path / "seen.txt", write_seen_hashes=True)
    assert list(src.iter_texts()) == ["Apple  pie", "apple pie"]
    want = [hashlib.sha256(guide_normalize(t).encode()).hexdigest() for t in ("Apple  pie", "apple pie")]
    assert (tmp_path / "seen.txt").read_text().splitlines() == want  # the file the guide's framework writes
    assert src.source_fingerprint()["normalize"] == "collapse-whitespace"  # unchanged: saved states resume
