"""A small corpus with planted duplicates in every input kind, and a tree comparison for byte identity."""

from __future__ import annotations

import gzip
import json
import random
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import zstandard

WORDS = [f"w{i}" for i in range(2000)] + ["the", "of", "and", "a", "to", "in", "is", "été", "naïve"]


def doc(rng: random.Random, n: int | None = None) -> str:
    return " ".join(rng.choices(WORDS, k=n or rng.randint(40, 160)))


def near_copy(text: str, rng: random.Random) -> str:
    """About 1% of the words changed (at least one): Jaccard of 5-grams about 0.9."""
    words = text.split()
    for i in rng.sample(range(len(words)), max(1, len(words) // 100)):
        words[i] = "CHANGED" + str(i)
    return " ".join(words)


def write_corpus(folder: Path, seed: int = 0) -> dict:
    """Inputs of every kind with planted duplicates; returns what was planted: {"exact": [...], "near": [...]}.

    Planted entries are (file, line) of the copy; originals come first in input order.
    """
    rng = random.Random(seed)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "sub").mkdir(exist_ok=True)
    originals = [doc(rng) for _ in range(60)]
    a = [{"text": t, "id": i, "meta": {"k": [i, "x"]}} for i, t in enumerate(originals[:30])]
    a.insert(12, {"text": "  " + originals[3].replace(" ", " \t "), "id": "exact-of-3"})  # exact after normalising
    a.insert(20, {"text": near_copy(originals[5], rng), "id": "near-of-5"})
    lines_a = [json.dumps(r, ensure_ascii=False) for r in a]
    lines_a.insert(7, "")  # a blank line: not a record, its line number still counts
    (folder / "a.jsonl").write_text("\n".join(lines_a) + "\n", encoding="utf-8")
    b = [{"text": t, "n": i} for i, t in enumerate(originals[30:50])] + [{"text": originals[31], "n": "exact-of-31"},
                                                                         {"text": originals[8] + " with a short tail", "n": "tail-of-8"}]
    (folder / "b.jsonl.zst").write_bytes(zstandard.ZstdCompressor().compress(
        "".join(json.dumps(r) + "\n" for r in b).encode()))
    (folder / "sub" / "c.txt").write_text("\n".join([originals[50], originals[51], originals[0], originals[52]]) + "\n")
    pq.write_table(pa.table({"text": [originals[53], originals[54], near_copy(originals[40], rng)], "score": [1.5, 2.5, 3.5]}),
                   folder / "sub" / "d.parquet")
    (folder / "e.jsonl.gz").write_bytes(gzip.compress(
        "".join(json.dumps({"text": t}) + "\n" for t in originals[55:60]).encode()))
    return {"a.jsonl": a, "b.jsonl.zst": b}


def tree(folder: Path) -> dict[str, bytes]:
    """Every file under a folder by relative path (the lock file excluded): equal trees, equal bytes."""
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file() and p.name != ".llm-data.lock"}
