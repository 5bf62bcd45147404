"""Tokenizer backends side by side: the same text, the same vocabulary, every engine, in one run.

    python -m bench.encoders                          # GPT-2 (.bench_cache/gpt2.tiktoken) + trained BPE, 20 MB
    python -m bench.encoders --vocab gpt2 --corpus-mb 5 --rounds 3
    python -m bench.encoders --vocab path/to/tokenizer.json --threads 2

For each vocabulary (GPT-2's as .tiktoken and as tokenizer.json; the bench's trained byte-level BPE
as tokenizer.json) it loads one tokenizer per installed backend (`load_tokenizer(path, backend)`),
warms each up on the first ~1 MB, then times `encode_batch` over the whole corpus in batches of
64 documents, backends interleaved (A B C A B C ...), `--rounds` times. It prints the median MB/s of
wall time and of CPU time (the machine may be shared: CPU time is steadier), the ratio to the
reference engine of that file, and checks that every backend gave the reference's ids.
One encoder thread by default, as in `optimize` workers (`--threads` to change).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CACHE = REPO / ".bench_cache"
BATCH = 64


def gpt2_files(cache: Path) -> list[Path]:
    """GPT-2's ranks (see bench/cli.py for where to get them) and the same vocabulary as tokenizer.json."""
    ranks_path = cache / "gpt2.tiktoken"
    if not ranks_path.exists():
        print(f"encoders: {ranks_path} is missing (python -m bench --tokenizer gpt2 says how to get it); "
              "skipping GPT-2", file=sys.stderr)
        return []
    json_path = cache / "gpt2.tokenizer.json"
    if not json_path.exists():
        import base64

        from llm.data.tokenize.bpe_vocab import tokenizer_json_from_ranks

        ranks = {}
        for line in ranks_path.read_bytes().splitlines():
            if line.strip():
                token, rank = line.split()
                ranks[base64.b64decode(token)] = int(rank)
        data = tokenizer_json_from_ranks(ranks, {"<|endoftext|>": max(ranks.values()) + 1})
        tmp = json_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(data, ensure_ascii=False))
        os.replace(tmp, json_path)
    return [ranks_path, json_path]


def vocab_files(which: str, cache: Path, corpus_files: list[str]) -> list[Path]:
    files: list[Path] = []
    if which in ("all", "gpt2"):
        files += gpt2_files(cache)
    if which in ("all", "bpe"):
        from bench.tok import train_tokenizer

        files.append(Path(train_tokenizer(cache, corpus_files)))
    if which not in ("all", "gpt2", "bpe"):
        files.append(Path(which))
    return files


def _digest(docs: list[list[int]]) -> tuple[str, int]:
    import hashlib

    import numpy as np

    h = hashlib.sha256()
    for d in docs:
        h.update(np.asarray(d, dtype=np.int64).tobytes())
        h.update(b"|")
    return h.hexdigest()[:16], sum(len(d) for d in docs)


def run_vocab(path: Path, texts: list[str], mb: float, rounds: int) -> list[dict]:
    from llm.data.tokenize.engines import BACKENDS, installed
    from llm.data.tokenize.tokenizers import load_tokenizer

    toks = []
    for backend in BACKENDS:
        if not installed(backend):
            print(f"  {backend}: not installed", file=sys.stderr)
            continue
        try:
            started = time.perf_counter()
            tok = load_tokenizer(str(path), backend)
            toks.append((tok, time.perf_counter() - started))
        except ValueError as e:
            print(f"  {backend}: {e}", file=sys.stderr)
    batches = [texts[i : i + BATCH] for i in range(0, len(texts), BATCH)]
    warm = []
    size = 0
    for b in batches:  # ~1 MB, untimed: regex JIT, word caches
        warm.append(b)
        size += sum(len(t) for t in b)
        if size > 1 << 20:
            break
    for tok, _ in toks:
        for b in warm:
            tok.encode_batch(b)
    wall: dict[str, list[float]] = {tok.backend: [] for tok, _ in toks}
    cpu: dict[str, list[float]] = {tok.backend: [] for tok, _ in toks}
    ids: dict[str, tuple[str, int]] = {}  # backend -> (digest of every id and length, tokens)
    for r in range(rounds):
        for tok, _ in toks:  # interleaved: A B C A B C ...
            c0, t0 = time.process_time(), time.perf_counter()
            out = [x for b in batches for x in tok.encode_batch(b)]
            wall[tok.backend].append(time.perf_counter() - t0)
            cpu[tok.backend].append(time.process_time() - c0)
            if r == 0:
                ids[tok.backend] = _digest(out)
            print(f"  round {r + 1} {tok.backend:10s} {mb / wall[tok.backend][-1]:7.2f} MB/s", file=sys.stderr)
    reference = toks[0][0].backend if toks else None
    rows = []
    for tok, load_s in toks:
        name = tok.backend
        rows.append({
            "vocab": path.name, "backend": name, "load_s": round(load_s, 2),
            "mb_per_s": mb / statistics.median(wall[name]), "mb_per_cpu_s": mb / statistics.median(cpu[name]),
            "min_max_mb_per_s": [mb / max(wall[name]), mb / min(wall[name])],
            "identical": ids[name] == ids[reference], "tokens": ids[name][1], "reference": reference,
        })
    for row in rows:
        ref = next(x for x in rows if x["backend"] == reference)
        row["x_wall"] = row["mb_per_s"] / ref["mb_per_s"]
        row["x_cpu"] = row["mb_per_cpu_s"] / ref["mb_per_cpu_s"]
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.encoders", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--vocab", default="all", help="all | gpt2 | bpe | a tokenizer.json or .tiktoken path")
    p.add_argument("--corpus-mb", type=float, default=20.0)
    p.add_argument("--rounds", type=int, default=3, help="timed passes per backend, interleaved (median)")
    p.add_argument("--threads", type=int, default=1, help="encoder threads per backend (default 1)")
    p.add_argument("--cache-dir", type=Path, default=CACHE)
    p.add_argument("--json", type=Path, default=None, help="also write the rows here")
    args = p.parse_args(argv)
    for var in ("LLM_TOKENIZER_THREADS", "RAYON_NUM_THREADS", "FASTOKENS_BPE_THREADS"):
        os.environ[var] = str(args.threads)
    os.environ["TOKENIZERS_PARALLELISM"] = "true" if args.threads > 1 else "false"

    from bench.corpus import build_corpus, corpus_paths, iter_texts

    meta = build_corpus(args.cache_dir, args.corpus_mb)
    files = corpus_paths(meta)
    texts = [t for f in files for t in iter_texts(f)]
    mb = sum(len(t.encode("utf-8")) for t in texts) / 1e6
    print(f"encoders: {len(texts):,} documents, {mb:.1f} MB, {args.rounds} rounds, {args.threads} thread(s)", file=sys.stderr)
    rows = []
    for path in vocab_files(args.vocab, args.cache_dir, files):
        print(f"{path.name}:", file=sys.stderr)
        rows += run_vocab(path, texts, mb, args.rounds)
    print(f"\n{mb:.1f} MB of text, median of {args.rounds}, {args.threads} thread(s); x = vs the file's reference engine")
    print(f"{'vocabulary':22s} {'backend':10s} {'MB/s':>7s} {'x':>6s} {'MB/cpu-s':>9s} {'x':>6s} {'load s':>7s}  identical")
    for r in rows:
        print(f"{r['vocab']:22s} {r['backend']:10s} {r['mb_per_s']:7.2f} {r['x_wall']:6.2f} "
              f"{r['mb_per_cpu_s']:9.2f} {r['x_cpu']:6.2f} {r['load_s']:7.2f}  {'yes' if r['identical'] else 'NO'}")
    if args.json:
        args.json.write_text(json.dumps({"corpus_mb": mb, "threads": args.threads, "rows": rows}, indent=1))
    return 0 if all(r["identical"] for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
