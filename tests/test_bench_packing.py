"""bench/packing.py on a tiny corpus: its counts are right, best fit cuts fewer documents, the table renders."""

from __future__ import annotations

import json
from pathlib import Path

from bench import packing


def test_packing_scenario_counts_on_a_tiny_corpus(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(packing, "MAX_SEQ_LEN", 64)
    docs = tmp_path / "docs"
    docs.mkdir()
    with open(docs / "part-00000.jsonl", "w") as f:
        for i in range(120):
            f.write(json.dumps({"text": "\n\n".join(f"paragraph {i}.{k} " + "x" * (i % 23) for k in range(3))}) + "\n")
    paras = packing.paragraphs([str(docs / "part-00000.jsonl")], tmp_path / "paras")
    rows = packing.compare({"paragraphs": paras}, "simple", repeat=1, say=lambda _: None)
    by_mode = {r["packing"]: r for r in rows if "packing" in r}
    assert by_mode["greedy"]["documents"] == by_mode["best_fit"]["documents"] == 360  # one EOS target each
    assert by_mode["best_fit"]["cuts"] == 0  # every paragraph fits a block: none is cut
    assert by_mode["greedy"]["cuts"] > 100
    texts = [json.loads(line)["text"] for line in (Path(paras) / "part-00000.jsonl").read_text().splitlines()]
    best = by_mode["best_fit"]
    assert best["slots"] - best["padding"] == sum(len(t.encode()) for t in texts)  # n bytes + EOS: n targets
    md = "\n".join(packing.markdown(rows))
    assert "| paragraphs | best_fit | 360 |" in md and "goal >= 5" in md
