"""Build (and cache) a real text corpus from text found on the machine, one document per JSONL record."""

from __future__ import annotations

import gzip
import hashlib
import html
import json
import os
import re
import sys
import sysconfig
from collections.abc import Iterator
from pathlib import Path

# Where real text lives on a Debian/Ubuntu machine with Python (+ python3.11-doc, linux-doc, headers).
_ROOTS = [
    Path(sysconfig.get_paths()["stdlib"]),
    Path(f"/usr/share/doc/python{sys.version_info.major}.{sys.version_info.minor}"),
    Path("/usr/share/doc/python3-doc"),
    Path("/usr/share/doc/linux-doc"),
    *sorted(Path("/usr/share/doc").glob("linux-doc-*")),
    *sorted(Path("/usr/src").glob("linux-doc-*")),
    Path("/usr/include"),  # C headers: real text, and enough of it for a 200 MB corpus
]
_TEXT_SUFFIXES = {".py", ".txt", ".rst", ".html", ".c", ".h", ".md", ".gz"}
_TAG = re.compile(r"<script.*?</script>|<style.*?</style>|<[^>]+>", re.S | re.I)
_BLANKS = re.compile(r"\n\s*\n+")
SHARD_BYTES = 2 << 20  # ~2 MB of text per input file: enough inputs to balance 2-4 processes


def _iter_files() -> Iterator[Path]:
    seen: set[Path] = set()
    for root in _ROOTS:
        if not root.is_dir():
            continue
        for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
            dirnames.sort()
            # site-packages is whatever someone installed; keep the corpus reproducible.
            dirnames[:] = [d for d in dirnames if d not in ("site-packages", "dist-packages", "__pycache__")]
            for name in sorted(filenames):
                p = Path(dirpath, name)
                real = p.resolve()
                if real in seen or p.suffix not in _TEXT_SUFFIXES or p.is_symlink():
                    continue
                seen.add(real)
                yield p


def _read_text(path: Path) -> str | None:
    try:
        if path.suffix == ".gz":
            inner = Path(path.stem).suffix
            if inner not in {".txt", ".rst", ".html", ".c", ".h", ".py", ".md", ""}:
                return None
            raw = gzip.open(path).read()
        else:
            raw = path.read_bytes()
    except (OSError, EOFError, gzip.BadGzipFile):
        return None
    if b"\x00" in raw[:4096]:
        return None
    text = raw.decode("utf-8", errors="replace")
    if path.suffix == ".html" or path.name.endswith(".html.gz"):
        text = _BLANKS.sub("\n\n", html.unescape(_TAG.sub(" ", text)))
    text = text.strip()
    return text if len(text) >= 64 else None


def iter_documents() -> Iterator[str]:
    """Every document found on the machine, in a deterministic order."""
    for path in _iter_files():
        text = _read_text(path)
        if text is not None:
            yield text


def build_corpus(cache_dir: Path, corpus_mb: float, copies: int = 1) -> dict:
    """Write ~corpus_mb MB of documents as JSONL shards under cache_dir; cached by size."""
    target = int(corpus_mb * (1 << 20))
    out = cache_dir / f"corpus-{corpus_mb:g}mb"
    meta_path = out / "corpus.json"
    if meta_path.exists():
        meta = json.loads(meta_path.read_text())
        meta["dir"] = str(out.resolve())  # wherever the cache lives now
        return meta
    tmp = out.with_name(out.name + ".tmp")
    tmp.mkdir(parents=True, exist_ok=True)
    for old in tmp.glob("*"):
        old.unlink()
    files: list[str] = []
    total = docs = 0
    h = hashlib.sha256()
    fh = None
    shard_bytes = 0
    for text in iter_documents():
        if total >= target:
            break
        if fh is None or shard_bytes >= SHARD_BYTES:
            if fh is not None:
                fh.close()
            name = f"part-{len(files):05d}.jsonl"
            files.append(name)
            fh = open(tmp / name, "w", encoding="utf-8")
            shard_bytes = 0
        line = json.dumps({"text": text}, ensure_ascii=False) + "\n"
        fh.write(line)
        n = len(text.encode("utf-8"))
        h.update(text.encode("utf-8"))
        total += n
        shard_bytes += n
        docs += 1
    if fh is not None:
        fh.close()
    if total < target * 0.9:
        print(f"bench: only {total / 1e6:.1f} MB of text found on this machine "
              f"(asked {corpus_mb:g} MB); install python3-doc/linux-doc for more", file=sys.stderr)
    meta = {"dir": str(out.resolve()), "files": files, "documents": docs, "text_bytes": total,
            "sha256": h.hexdigest()[:16], "asked_mb": corpus_mb}
    (tmp / "corpus.json").write_text(json.dumps(meta, indent=1))
    if out.exists():
        for old in out.glob("*"):
            old.unlink()
        out.rmdir()
    tmp.rename(out)
    return meta


def corpus_paths(meta: dict) -> list[str]:
    """Absolute paths of the corpus's JSONL shards."""
    return [str(Path(meta["dir"]) / f) for f in meta["files"]]


def iter_texts(path: str) -> Iterator[str]:
    """Documents of one JSONL shard."""
    with open(path, encoding="utf-8") as f:
        for line in f:
            yield json.loads(line)["text"]
