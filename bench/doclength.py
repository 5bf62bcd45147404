"""The bench corpus re-cut into documents of about one length (~0.5 KB or ~7 KB), for on-the-fly runs.

Per-document costs (a dataset example, a Python list, a packing step) weigh more on short
documents and less on long ones; the same text cut both ways shows both. Lines are kept whole
and in corpus order, each document stripped of surrounding whitespace like the corpus's own
documents: a document ends at the first line break after `target_bytes` (a source
document's tail runs on into the next one, so nearly every document has the length asked for).
"""

from __future__ import annotations

import json
from pathlib import Path

from bench.corpus import SHARD_BYTES, corpus_paths, iter_texts

LENGTHS = {"short": 512, "long": 7 * 1024}  # bytes of text per document, at least (then to the line's end)


def recut_corpus(meta: dict, cache_dir: Path, name: str) -> dict:
    """The corpus `meta` as documents of ~LENGTHS[name] bytes, JSONL shards under cache_dir; cached."""
    target = LENGTHS[name]
    out = cache_dir / f"{Path(meta['dir']).name}-{name}"
    meta_path = out / "corpus.json"
    if meta_path.exists():
        cached = json.loads(meta_path.read_text())
        if cached.get("source_sha256") == meta["sha256"]:
            cached["dir"] = str(out.resolve())
            return cached
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob("*"):
        old.unlink()
    files: list[str] = []
    fh = None
    shard_bytes = docs = total = 0

    def emit(text: str) -> None:
        nonlocal fh, shard_bytes, docs, total
        text = text.strip()  # as the corpus's documents are (and as readers of text strip them)
        if not text:
            return
        if fh is None or shard_bytes >= SHARD_BYTES:
            if fh is not None:
                fh.close()
            files.append(f"part-{len(files):05d}.jsonl")
            fh = open(out / files[-1], "w", encoding="utf-8")
            shard_bytes = 0
        fh.write(json.dumps({"text": text}, ensure_ascii=False) + "\n")
        n = len(text.encode("utf-8"))
        shard_bytes, docs, total = shard_bytes + n, docs + 1, total + n

    pending: list[str] = []
    size = 0
    for path in corpus_paths(meta):
        for text in iter_texts(path):
            for line in (text + "\n\n").splitlines(keepends=True):
                pending.append(line)
                size += len(line.encode("utf-8"))
                if size >= target:
                    emit("".join(pending))
                    pending, size = [], 0
    if pending:
        emit("".join(pending))
    if fh is not None:
        fh.close()
    new = {"dir": str(out.resolve()), "files": files, "documents": docs, "text_bytes": total,
           "sha256": f"{meta['sha256']}-{name}", "source_sha256": meta["sha256"], "cut": name,
           "target_bytes": target}
    meta_path.write_text(json.dumps(new, indent=1))
    return new
