"""The stages' parts alone: MinHash estimates (both engines), exact digests, band choice, the bounded k-way merge, union-find."""

from __future__ import annotations

import hashlib
import random
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from llm.data.corpus_dedup.clusters import components
from llm.data.corpus_dedup.exact import WIDE_SPACES, digest_rows, normalised_texts
from llm.data.corpus_dedup.lsh import candidate_probability, choose_bands
from llm.data.corpus_dedup.minhash import MinHasher, estimated_jaccard
from llm.data.corpus_dedup.runs import merge_runs, sort_rows
from llm.data.inputs.dedup import collapse_whitespace

ROW = np.dtype([("key", "<u8"), ("id", "<u8")])


def _shingles(text: str, n: int = 5) -> set:
    words = text.lower().split()
    return {tuple(words[i : i + n]) for i in range(max(1, len(words) - n + 1))}


ENGINES = ["numpy", "rensa"]


def _engine(name: str) -> str:
    if name == "rensa":
        pytest.importorskip("rensa")  # an optional extra, in `dev`: CI runs both
    return name


@pytest.mark.parametrize("engine", ENGINES)
def test_signatures_estimate_the_jaccard_of_word_5grams_and_do_not_depend_on_batching(engine: str) -> None:
    rng = random.Random(1)
    vocab = [f"v{i}" for i in range(500)]
    base = [rng.choice(vocab) for _ in range(400)]
    hasher = MinHasher(256, 5, seed=3, engine=_engine(engine))
    for every in (10, 25, 60):
        other = [("x" + w) if i % every == 0 else w for i, w in enumerate(base)]
        a, b = " ".join(base), " ".join(other)
        truth = len(_shingles(a) & _shingles(b)) / len(_shingles(a) | _shingles(b))
        sig = hasher.signatures([a, "short text", b])
        assert abs(float(estimated_jaccard(sig[[0]], sig[[2]])[0]) - truth) < 0.08, (every, truth)
        assert (hasher.signatures([b])[0] == sig[2]).all()  # alone or in a batch: the same signature
    # whitespace and case do not matter; a text shorter than n words is one shingle
    sig = hasher.signatures(["The cat\tSAT", "the  cat sat", "the cat"])
    assert (sig[0] == sig[1]).all() and not (sig[0] == sig[2]).all()


@pytest.mark.parametrize("engine", ENGINES)
def test_signatures_of_a_chunk_are_the_same_in_small_batches(monkeypatch, engine: str) -> None:
    import llm.data.corpus_dedup.minhash as minhash

    rng = random.Random(2)
    texts = [" ".join(rng.choices(["a", "b", "c", "dd", "ee"], k=rng.randint(1, 300))) for _ in range(200)]
    whole = MinHasher(32, 5, seed=1, engine=_engine(engine)).signatures(texts)
    other = MinHasher(32, 5, seed=1, engine=ENGINES[1 - ENGINES.index(engine)]).signatures(texts)
    assert not (other == whole).all()  # the engines are two sketches
    monkeypatch.setattr(minhash, "_BATCH_CHARS", 500)  # the memory bound: many batches
    assert (MinHasher(32, 5, seed=1, engine=engine).signatures(texts) == whole).all()


def test_the_same_seed_gives_the_same_signature_in_any_process() -> None:
    # pinned: a change of hashing would silently make new runs disagree with committed work
    sig = MinHasher(8, 5, seed=1).signatures(["one two three four five six seven"])[0]
    assert sig.tolist() == PINNED


PINNED = [17657824, 2165900472, 921143653, 230421588, 330335319, 577199653, 600113762, 115434440]
# texts with every kind of word boundary: the signatures of both engines, pinned (sha256 of their bytes)
VARIED = ["one two three four five six seven", "", "x", "The cat\tSAT\non the MAT", "naïve  été\u00a0à x\x1cy\x1fz",
          "a\ud800b c", " ".join(f"w{i % 37}" for i in range(500)), "ÉCOLE École école", "tab\there\r\nand\x0bthere\x0c."]
PINNED_VARIED = {"numpy": "3fe1310580d8097b", "rensa": "e56f93f406b24051"}


@pytest.mark.parametrize("engine", ENGINES)
def test_signatures_of_varied_texts_are_pinned(engine: str) -> None:
    sig = MinHasher(64, 5, seed=7, engine=_engine(engine)).signatures(VARIED)
    assert hashlib.sha256(sig.tobytes()).hexdigest()[:16] == PINNED_VARIED[engine]


_PIECES = ["a", "Bé", "€", "𝄞", "\ud800", "\x00", "\u200b", " ", "\t", "\n\r", "\x1c", "\x1f", "\x0b\x0c",
           *map(chr, WIDE_SPACES)]


@given(st.lists(st.lists(st.sampled_from(_PIECES), max_size=12).map("".join), max_size=8))
def test_the_chunks_normalised_texts_are_collapse_whitespace_of_each(texts: list[str]) -> None:
    """The vectorised whitespace collapse against the dedup source's, and so the same digests."""
    out, starts, ends, odd = normalised_texts(texts)
    want = [collapse_whitespace(t).encode("utf-8", "replace") for t in texts]
    for i, text in enumerate(texts):
        if i not in odd:
            assert bytes(out[starts[i]:ends[i]]) == want[i], text
        else:  # only what a stripped record never is: empty, or ending in whitespace
            assert not text or text[-1].isspace()
    rows = digest_rows(texts, np.arange(len(texts), dtype=np.uint64), "sha256")
    digests = np.frombuffer(b"".join(hashlib.sha256(w).digest()[:16] for w in want), ">u8").reshape(-1, 2)
    assert rows["hi"].tolist() == digests[:, 0].tolist() and rows["lo"].tolist() == digests[:, 1].tolist()


def test_the_wide_spaces_are_every_whitespace_above_ascii() -> None:
    """What str.split() splits on, from this Python's Unicode database (the list in exact.py must follow it)."""
    assert [c for c in range(128, sys.maxunicode + 1) if chr(c).isspace()] == list(WIDE_SPACES)


def test_bands_for_a_threshold_make_pairs_above_it_candidates() -> None:
    bands, rows = choose_bands(0.8, 128)
    assert bands * rows <= 128
    assert candidate_probability(0.9, bands, rows) > 0.99 and candidate_probability(0.85, bands, rows) > 0.95
    assert candidate_probability(0.5, bands, rows) < 0.05
    low, high = choose_bands(0.5, 128), choose_bands(0.95, 128)
    assert low[1] < rows < high[1]  # a higher threshold: longer bands


def test_the_known_band_choices_are_what_the_search_finds() -> None:
    from llm.data.corpus_dedup.lsh import KNOWN_BANDS, search_bands

    assert len(KNOWN_BANDS) == 20
    for (threshold, num_perm), chosen in KNOWN_BANDS.items():
        assert search_bands(threshold, num_perm) == chosen, (threshold, num_perm)


def test_band_choice_needs_no_numpy_2_name(monkeypatch) -> None:
    """NumPy 1.x (pyproject's floor) has no `np.trapezoid`: the choice is the same without it."""
    from llm.data.corpus_dedup.lsh import search_bands

    monkeypatch.delattr(np, "trapezoid", raising=False)
    search_bands.cache_clear()
    try:
        assert search_bands(0.8, 128) == (14, 9)  # the module docstring's example
    finally:
        search_bands.cache_clear()  # nothing computed here outlives the patch


@given(st.lists(st.lists(st.integers(0, 30), max_size=60), max_size=6), st.integers(1, 9))
def test_merging_sorted_runs_in_small_blocks_gives_every_row_in_order_without_splitting_a_key(
    runs: list[list[int]], block: int
) -> None:
    with tempfile.TemporaryDirectory() as folder:
        _check_merge(Path(folder), runs, block)


def _check_merge(folder: Path, runs: list[list[int]], block: int) -> None:
    slices, everything, next_id = [], [], 0
    path = folder / "runs.bin"
    with open(path, "wb") as f:
        offset = 0
        for keys in runs:
            rows = np.zeros(len(keys), ROW)
            rows["key"], rows["id"] = keys, np.arange(next_id, next_id + len(keys))
            next_id += len(keys)
            rows = sort_rows(rows)
            f.write(rows.tobytes())
            slices.append((path, offset, len(rows)))
            offset += len(rows)
            everything.append(rows)
    out = list(merge_runs(slices, ROW, ("key",), block_rows=block))
    expected = sort_rows(np.concatenate(everything)) if everything else np.zeros(0, ROW)
    got = np.concatenate(out) if out else np.zeros(0, ROW)
    assert got.tolist() == expected.tolist()
    assert all(a["key"][-1] != b["key"][0] for a, b in zip(out, out[1:]))


def test_union_find_labels_every_node_with_the_smallest_of_its_component() -> None:
    rng = np.random.default_rng(0)
    a = rng.integers(0, 400, 300).astype(np.uint64) * 7
    b = rng.integers(0, 400, 300).astype(np.uint64) * 7
    nodes, root = components(a, b)
    # reference: plain Python union-find
    parent: dict[int, int] = {}

    def find(x: int) -> int:
        while parent.setdefault(x, x) != x:
            x = parent[x]
        return x

    for u, v in zip(a.tolist(), b.tolist()):
        ru, rv = find(u), find(v)
        parent[max(ru, rv)] = min(ru, rv)
    assert nodes.tolist() == sorted(parent)
    assert root.tolist() == [find(x) for x in nodes.tolist()]


@pytest.mark.parametrize("block", [1, 7, 64, 1 << 20])
@pytest.mark.parametrize("ending", [b"\n", b"", b"\r\n"])
def test_copy_lines_in_blocks_is_the_line_by_line_copy(tmp_path: Path, monkeypatch, block: int, ending: bytes) -> None:
    """The write stage's block copy picks the same lines as reading line by line: lines across block edges, CRLF,
    invalid UTF-8 (repaired), a last line without its newline."""
    import io

    from llm.data.corpus_dedup import output

    rows = [b'{"text": "a"}', b'{"text": "caf\xe9"}\r', b'{"text": "' + b"x" * 100 + b'"}', b"", b'{"text": "b"}']
    path = tmp_path / "in.jsonl"
    path.write_bytes(b"\n".join(rows) + ending)
    monkeypatch.setattr(output, "COPY_BLOCK", block)
    for keep in ([1, 2, 3, 5], [5], [2], []):
        out = io.BytesIO()
        assert output._copy_lines(path, np.array(keep, dtype="<u8"), out) == len(keep)
        want = [rows[i - 1].rstrip(b"\r") for i in keep]
        want = [output.repaired(r) if b"\xe9" in r else r for r in want]
        assert out.getvalue() == b"".join(r + b"\n" for r in want), (keep, block, ending)


@given(st.lists(st.tuples(st.integers(0, 5), st.integers(0, 5)), max_size=40))
def test_distinct_counts_different_pairs_and_the_verified_ones(pairs: list[tuple[int, int]]) -> None:
    from llm.data.corpus_dedup.bands import EDGE_ROW
    from llm.data.corpus_dedup.clusters import _distinct

    edges = np.zeros(len(pairs), dtype=EDGE_ROW)
    edges["a"], edges["b"] = [p[0] for p in pairs], [p[1] for p in pairs]
    edges["sim"] = [(3 * a + b) % 7 / 6 for a, b in pairs]  # a pair's similarity: the same in every band
    assert _distinct(edges, None) == (len(set(pairs)), len(set(pairs)))
    assert _distinct(edges, 0.5) == (len(set(pairs)), len({p for p in pairs if np.float32((3 * p[0] + p[1]) % 7 / 6) >= np.float32(0.5)}))


def test_removed_list_lines_are_json_dumps_of_each_record(tmp_path: Path) -> None:
    """The removed list's formatted lines are byte for byte `json.dumps` of each record (names with quotes, a
    backslash and non-ASCII letters; exact and near; similarities rounded to 4 places)."""
    import json

    from llm.data.corpus_dedup.clusters import REMOVED_ROW
    from llm.data.corpus_dedup.output import write_removed_list

    names = ['a "b".jsonl', "c\\d.jsonl", "été/ü.jsonl"]
    removed = np.zeros(5, dtype=REMOVED_ROW)
    removed["id"], removed["of"] = [1, 2, 3, 4, 5], [0, 0, 1, 2, 3]
    removed["sim"], removed["near"] = [1.0, 0.8125, 1 / 3, 0.9999, 0.5], [0, 1, 1, 1, 1]
    lines = lambda ids: (np.asarray(ids, np.int64) % 3, np.asarray(ids, np.int64) * 10 + 1)  # noqa: E731
    write_removed_list(tmp_path / "removed.jsonl", removed, lines, names, block=2)
    want = [json.dumps({"file": names[i % 3], "line": i * 10 + 1, "duplicate_of": {"file": names[o % 3], "line": o * 10 + 1},
                        "reason": "near" if n else "exact", "similarity": round(float(s), 4)}, ensure_ascii=False)
            for i, o, s, n in zip([1, 2, 3, 4, 5], [0, 0, 1, 2, 3], removed["sim"], removed["near"])]
    assert (tmp_path / "removed.jsonl").read_text(encoding="utf-8").splitlines() == want
