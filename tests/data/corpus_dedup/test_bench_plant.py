"""bench.dedup's ground truth: planted near copies really are at Jaccard 0.8-0.9, and scoring counts what was removed."""

from __future__ import annotations

import json
import random
from pathlib import Path

from bench.dedup import jaccard, plant, score


def test_planted_copies_follow_their_originals_at_the_promised_similarity(tmp_path: Path) -> None:
    rng = random.Random(0)
    texts = [" ".join(rng.choices([f"w{i}" for i in range(3000)], k=rng.randint(200, 600))) for _ in range(60)]
    corpus = plant(texts, tmp_path)
    records = [json.loads(line) for f in corpus["files"] for line in Path(f).read_text().splitlines()]
    order = {r["id"]: i for i, r in enumerate(records)}
    by_id = {r["id"]: r["text"] for r in records}
    kinds = {p["kind"] for p in corpus["planted"].values()}
    assert kinds == {"exact", "changed", "tail"} and len(records) == 60 + len(corpus["planted"])
    for cid, p in corpus["planted"].items():
        assert order[p["of"]] < order[cid]
        truth = jaccard(by_id[p["of"]], by_id[cid])
        assert truth == p["jaccard"] and (truth == 1.0 if p["kind"] == "exact" else 0.8 <= truth <= 0.9)
    everything = [r["id"] for r in records]
    assert score(everything, corpus)["near_recall"] == 0.0
    originals_only = [i for i in everything if i.startswith("o")]
    result = score(originals_only, corpus)
    assert result["near_recall"] == result["exact_recall"] == 1.0 and result["originals_kept"] == 1.0
    assert result["in_input_order"]
