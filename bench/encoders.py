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

`--fresh` measures what an `optimize` worker sees instead: each (engine, round) is its own process
that loads the vocabulary and makes ONE pass over the text (cold caches: engines that cache
pre-tokens are not flattered by seeing the same text again), engines interleaved. It reports the
load time, MB per CPU-second and wall-second, and the process's RSS before and after the pass
(the growth is the engines' caches). `--candidate NAME=DIR` adds an engine installed elsewhere
(`pip install --target DIR ...`), run with DIR first on its path: `tokenizers-rc=DIR` for a
`tokenizers` release candidate (tokenizer.json files), `bpe-openai=DIR` (its own vocabularies only).
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


def _rss_mb() -> float:
    return int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def _one_engine(engine: str) -> tuple[object, object]:
    """(flat or list batch encoder, the process's view of it) for one engine on $ENC_VOCAB."""
    path = os.environ["ENC_VOCAB"]
    if engine == "tokenizers-rc":
        import tokenizers

        tok = tokenizers.Tokenizer.from_file(path)
        return (lambda b: [e.ids for e in tok.encode_batch(b, add_special_tokens=False)]), tokenizers.__version__
    from importlib import metadata

    from llm.data.tokenize.tokenizers import load_tokenizer

    tok = load_tokenizer(path, engine)
    return (tok.encode_flat or tok.encode_batch), metadata.version(tok.backend)


def fresh_pass(engine: str, vocab: Path, files: list[str], mb_limit: float) -> dict:
    """One cold pass of `engine` over the first `mb_limit` MB of `files` (run in its own process)."""
    import hashlib

    import numpy as np

    from bench.corpus import iter_texts

    os.environ["ENC_VOCAB"] = str(vocab)
    rss0 = _rss_mb()
    t0 = time.perf_counter()
    encode, version = _one_engine(engine)
    load_s = time.perf_counter() - t0
    rss_loaded = _rss_mb()
    h = hashlib.sha256()
    cpu = wall = 0.0
    size = tokens = 0
    rss_marks = []
    for path in files:
        texts = list(iter_texts(path))
        for i in range(0, len(texts), BATCH):
            batch = texts[i : i + BATCH]
            c0, w0 = time.process_time(), time.perf_counter()
            out = encode(batch)
            cpu += time.process_time() - c0
            wall += time.perf_counter() - w0
            if isinstance(out, tuple):  # (flat ids, offsets)
                ids, offsets = out
                lengths = np.diff(offsets)
            else:
                ids = np.concatenate([np.asarray(x, dtype=np.int64) for x in out]) if out else np.zeros(0)
                lengths = np.array([len(x) for x in out], dtype=np.int64)
            h.update(np.asarray(ids, dtype=np.int64).tobytes())
            h.update(lengths.tobytes())
            tokens += len(ids)
        size += sum(len(t.encode("utf-8")) for t in texts)
        rss_marks.append(round(_rss_mb()))
        if size >= mb_limit * 1e6:
            break
    mb = size / 1e6
    return {"engine": engine, "version": str(version), "vocab": vocab.name, "mb": mb, "load_s": load_s,
            "mb_per_cpu_s": mb / cpu, "mb_per_s": mb / wall, "tokens": tokens, "digest": h.hexdigest()[:16],
            "rss_start_mb": rss0, "rss_loaded_mb": rss_loaded, "rss_end_mb": _rss_mb(),
            "rss_marks_mb": rss_marks}


def run_fresh(vocab: Path, files: list[str], mb: float, rounds: int, candidates: dict[str, str]) -> list[dict]:
    """Every installed engine (and candidate) that loads `vocab`, one cold pass per process, interleaved."""
    import subprocess

    from llm.data.tokenize.engines import BACKENDS, installed

    engines = [b for b in BACKENDS if installed(b)]
    if vocab.suffix == ".tiktoken":
        engines.remove("tokenizers")  # it cannot load one
    elif "tokenizers-rc" in candidates:
        engines.append("tokenizers-rc")
    runs: dict[str, list[dict]] = {}
    for r in range(rounds):
        for engine in engines:
            env = dict(os.environ)
            if engine in candidates:
                env["PYTHONPATH"] = os.pathsep.join([candidates[engine], env.get("PYTHONPATH", "")])
            code = ("import json, sys; from pathlib import Path; from bench.encoders import fresh_pass; "
                    "print(json.dumps(fresh_pass(sys.argv[1], Path(sys.argv[2]), sys.argv[3:-1], float(sys.argv[-1]))))")
            p = subprocess.run([sys.executable, "-c", code, engine, str(vocab), *files, str(mb)],
                               capture_output=True, text=True, env=env, cwd=REPO)
            if p.returncode != 0:
                print(f"  {engine}: failed: {(p.stderr.strip().splitlines() or ['?'])[-1]}", file=sys.stderr)
                continue
            row = json.loads(p.stdout.strip().splitlines()[-1])
            runs.setdefault(engine, []).append(row)
            print(f"  round {r + 1} {engine:14s} {row['mb_per_cpu_s']:7.1f} MB/cpu-s  {row['mb_per_s']:7.1f} MB/s  "
                  f"load {row['load_s']:.2f} s  RSS {row['rss_loaded_mb']:.0f} -> {row['rss_end_mb']:.0f} MB",
                  file=sys.stderr)
    reference = "tiktoken" if vocab.suffix == ".tiktoken" else "tokenizers"
    rows = []
    for engine, rs in runs.items():
        rows.append({
            "vocab": vocab.name, "backend": engine, "version": rs[0]["version"], "mb": rs[0]["mb"],
            "load_s": statistics.median(x["load_s"] for x in rs),
            "mb_per_cpu_s": statistics.median(x["mb_per_cpu_s"] for x in rs),
            "mb_per_s": statistics.median(x["mb_per_s"] for x in rs),
            "min_max_mb_per_cpu_s": [min(x["mb_per_cpu_s"] for x in rs), max(x["mb_per_cpu_s"] for x in rs)],
            "rss_growth_mb": statistics.median(x["rss_end_mb"] - x["rss_loaded_mb"] for x in rs),
            "rss_loaded_mb": statistics.median(x["rss_loaded_mb"] for x in rs),
            "identical": reference in runs and rs[0]["digest"] == runs[reference][0]["digest"],
            "tokens": rs[0]["tokens"], "reference": reference, "runs": rs,
        })
    ref = next((x for x in rows if x["backend"] == reference), None)
    for row in rows:
        row["x_cpu"] = row["mb_per_cpu_s"] / ref["mb_per_cpu_s"] if ref else None
        row["x_wall"] = row["mb_per_s"] / ref["mb_per_s"] if ref else None
    return rows


CL100K_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                  r"|\s*[\r\n]+|\s+(?!\S)|\s+")


def bpe_openai_pass(folder: str, mb_limit: float, files: list[str]) -> dict:
    """tiktoken and bpe-openai on cl100k_base (the ranks bpe-openai ships), one call per document."""
    import base64
    import gzip

    sys.path.insert(0, folder)
    import bpe_openai
    import bpe_openai._bindings
    import tiktoken

    from bench.corpus import iter_texts

    texts, size = [], 0
    for t in (t for f in files for t in iter_texts(f)):
        texts.append(t)
        size += len(t.encode("utf-8"))
        if size >= mb_limit * 1e6:
            break
    data = gzip.decompress((Path(bpe_openai.__file__).parent / "data" / "cl100k_base.tiktoken.gz").read_bytes())
    ranks = {base64.b64decode(a): int(b) for a, b in (line.split() for line in data.splitlines() if line)}
    tt = tiktoken.Encoding(name="cl100k", pat_str=CL100K_PATTERN, mergeable_ranks=ranks, special_tokens={})
    bo = bpe_openai._bindings.tokenizer_for_encoding("cl100k_base")
    speed, ids = {}, {}
    for name, encode in (("tiktoken", tt.encode_ordinary), ("bpe-openai", bo.encode)):
        c0 = time.process_time()
        ids[name] = [encode(t) for t in texts]
        speed[name] = size / 1e6 / (time.process_time() - c0)
    return {"mb": size / 1e6, **speed, "identical": ids["tiktoken"] == ids["bpe-openai"]}


def bpe_openai_row(candidates: dict[str, str], files: list[str], mb: float) -> list[dict]:
    """bpe-openai ships its own vocabularies only (cl100k_base, o200k_base): timed on cl100k against tiktoken's."""
    if "bpe-openai" not in candidates:
        return []
    import subprocess

    code = ("import json, sys; from bench.encoders import bpe_openai_pass; "
            "print(json.dumps(bpe_openai_pass(sys.argv[1], float(sys.argv[2]), sys.argv[3:])))")
    p = subprocess.run([sys.executable, "-c", code, candidates["bpe-openai"], str(mb), *files],
                       capture_output=True, text=True, cwd=REPO)
    if p.returncode != 0:
        print(f"  bpe-openai: failed: {(p.stderr.strip().splitlines() or ['?'])[-1]}", file=sys.stderr)
        return []
    r = json.loads(p.stdout.strip().splitlines()[-1])
    return [{"vocab": "cl100k_base", "backend": name, "mb": r["mb"], "mb_per_cpu_s": r[name],
             "x_cpu": r[name] / r["tiktoken"], "identical": r["identical"] if name != "tiktoken" else True,
             "reference": "tiktoken", "one_call_per_document": True} for name in ("tiktoken", "bpe-openai")]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.encoders", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--vocab", default="all", help="all | gpt2 | bpe | a tokenizer.json or .tiktoken path")
    p.add_argument("--corpus-mb", type=float, default=20.0)
    p.add_argument("--rounds", type=int, default=3, help="timed passes per backend, interleaved (median)")
    p.add_argument("--threads", type=int, default=1, help="encoder threads per backend (default 1)")
    p.add_argument("--cache-dir", type=Path, default=CACHE)
    p.add_argument("--json", type=Path, default=None, help="also write the rows here")
    p.add_argument("--fresh", action="store_true", help="one cold pass per process and round (see above)")
    p.add_argument("--candidate", action="append", default=[], metavar="NAME=DIR",
                   help="with --fresh: tokenizers-rc=DIR or bpe-openai=DIR (a pip --target folder)")
    args = p.parse_args(argv)
    candidates = dict(c.split("=", 1) for c in args.candidate)
    for var in ("LLM_TOKENIZER_THREADS", "RAYON_NUM_THREADS", "FASTOKENS_BPE_THREADS"):
        os.environ[var] = str(args.threads)
    os.environ["TOKENIZERS_PARALLELISM"] = "true" if args.threads > 1 else "false"

    from bench.corpus import build_corpus, corpus_paths, iter_texts

    meta = build_corpus(args.cache_dir, args.corpus_mb)
    files = corpus_paths(meta)
    texts = [] if args.fresh else [t for f in files for t in iter_texts(f)]
    mb = meta["text_bytes"] / 1e6 if args.fresh else sum(len(t.encode("utf-8")) for t in texts) / 1e6
    print(f"encoders: {len(texts):,} documents, {mb:.1f} MB, {args.rounds} rounds, {args.threads} thread(s)", file=sys.stderr)
    rows = []
    if args.fresh:
        return fresh_main(args, files, mb, candidates)
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


def fresh_main(args: argparse.Namespace, files: list[str], mb: float, candidates: dict[str, str]) -> int:
    rows = []
    for path in vocab_files(args.vocab, args.cache_dir, files):
        print(f"{path.name}:", file=sys.stderr)
        rows += run_fresh(path, files, args.corpus_mb, args.rounds, candidates)
    rows += bpe_openai_row(candidates, files, min(args.corpus_mb, 50.0))
    print(f"\n{mb:.1f} MB of text, one cold pass per process, median of {args.rounds}, {args.threads} thread(s); "
          "x = vs the file's reference engine (CPU time)")
    print(f"{'vocabulary':22s} {'backend':14s} {'MB/cpu-s':>9s} {'x':>6s} {'load s':>7s} {'RSS +MB':>8s}  identical")
    for r in rows:
        print(f"{r['vocab']:22s} {r['backend']:14s} {r['mb_per_cpu_s']:9.1f} {r['x_cpu'] or 0:6.2f} "
              f"{r.get('load_s', 0):7.2f} {r.get('rss_growth_mb', 0):8.0f}  {'yes' if r['identical'] else 'NO'}")
    if args.json:
        args.json.write_text(json.dumps({"corpus_mb": mb, "threads": args.threads, "fresh": True, "rows": rows}, indent=1))
    return 0 if all(r["identical"] for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
