"""`python -m bench`: build the corpus and tokenizer, run the scenarios, write JSON, Markdown and a chart."""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path

from bench import context, readme, report, suite
from bench.corpus import build_corpus, corpus_paths
from bench.measure import REPO_ROOT
from bench.tok import VOCAB_SIZE, train_tokenizer

DEFAULT_CACHE = REPO_ROOT / ".bench_cache"
DEFAULT_PEER = DEFAULT_CACHE / "peer-venv" / "bin" / "python"


# `--quick`: every ratio of the README's table once, on 4 MB, in under 3 minutes on 2 busy cores
# (bench/README.md); the full bench keeps its defaults.
QUICK = {
    "corpus_mb": 4.0,
    "repeat": 1,
    # The scenarios the README's table reads; not scale (RSS at 1x and 4x: its own 4x datasets, ~35 s),
    # paths or packing (ours against ours).
    "only": "prepare,stream,integrity,resume,onthefly",
    "resume_at": "50",  # one resume point: the stop point changes nothing in how a resume is done
    "min_stream_tokens": 2e7,  # ~13 epochs of 4 MB (the full bench: 40e6): a second or more per run, not 0.1 s
}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    p.add_argument("--corpus-mb", type=float, default=200.0, help="MB of real text (default 200)")
    p.add_argument("--only", default="", help=f"comma-separated scenarios from {','.join(suite.SCENARIOS)} "
                                              f"(default: all but {','.join(suite.OPT_IN)})")
    p.add_argument("--contestants", default=",".join(context.CONTESTANTS),
                   help="comma-separated subset of " + ",".join(context.CONTESTANTS))
    p.add_argument("--repeat", type=int, default=3, help="repeats per case, interleaved (default 3)")
    p.add_argument("--workers", type=int, default=2, help="processes for prepare, loader workers (default 2)")
    p.add_argument("--resume-at", default="10,50,90", help="epoch percentages to stop and resume at")
    p.add_argument("--tokenizer", default="bpe",
                   help="'bpe' (train a byte-level BPE, cached), 'gpt2' (.bench_cache/gpt2.tiktoken from the "
                        "openai-whisper sdist), or a tokenizer.json / .tiktoken path")
    p.add_argument("--our-encoder", default=os.environ.get("LLM_TOKENIZER_BACKEND", "auto"),
                   help="ours' encoding engine: auto (default), fastokens, gigatoken, tiktoken or tokenizers")
    p.add_argument("--vocab-size", type=int, default=VOCAB_SIZE, help="vocabulary of the trained BPE")
    p.add_argument("--peer-python", default=str(DEFAULT_PEER),
                   help="python with mosaicml-streaming installed (default .bench_cache/peer-venv)")
    p.add_argument("--python", default=sys.executable, help="python for ours, LitData, HF and the limits")
    p.add_argument("--cache-dir", type=Path, default=DEFAULT_CACHE)
    p.add_argument("--results", type=Path, default=None, help="raw JSON (default bench/results/<time>.json)")
    p.add_argument("--docs-dir", type=Path, default=REPO_ROOT / "docs")
    p.add_argument("--no-docs", action="store_true", help="don't write docs/benchmarks.md and .png")
    p.add_argument("--profile", action="store_true",
                   help="also run our cases once under py-spy (or cProfile); summaries go in the report")
    p.add_argument("--min-stream-tokens", type=float, default=40e6,
                   help="stream/scale run enough epochs to deliver this many tokens (default 40e6)")
    p.add_argument("--s3-mb", type=float, default=160.0,
                   help="s3: MB of tokens per dataset in the store (the token stream repeated; default 160)")
    p.add_argument("--s3-cache-mb", type=float, default=100.0, help="s3: the cache limit of the limit cases")
    p.add_argument("--s3-shard-mb", default="16,64", help="s3: shard sizes in MB (default 16,64)")
    p.add_argument("--s3-cases", default="coldwarm,limit,restart", help="s3: which cases (default all three)")
    p.add_argument("--onthefly-cuts", default="as-is,short,long",
                   help="onthefly: the corpus as-is and/or re-cut into short / long documents (default all three)")
    p.add_argument("--report-only", type=Path, default=None, metavar="JSON",
                   help="re-render docs/benchmarks.md and .png from a results JSON, run nothing")
    p.add_argument("--quick", action="store_true",
                   help="the small bench in minutes: " + ", ".join(f"--{k.replace('_', '-')} {v}" for k, v in QUICK.items())
                        + "; prints the report and leaves the docs alone unless --docs-dir is given")
    p.add_argument("--quiet", action="store_true")
    args = p.parse_args(argv)
    if args.quick:
        # Quick values replace the defaults only: a flag the user gave still wins.
        p.set_defaults(**QUICK, no_docs=True)
        args = p.parse_args(argv)
        if args.docs_dir != p.get_default("docs_dir"):
            args.no_docs = False
    return args


def resolve_tokenizer(args: argparse.Namespace) -> tuple[str, str]:
    """(path, human name) of the tokenizer everyone uses."""
    if args.tokenizer == "bpe":
        # Trained on (at most) the first 20 MB of the corpus: the same file whatever --corpus-mb.
        train = build_corpus(args.cache_dir, min(args.corpus_mb, 20.0))
        path = train_tokenizer(args.cache_dir, corpus_paths(train), vocab_size=args.vocab_size)
        return path, f"byte-level BPE trained with `tokenizers`, vocabulary {args.vocab_size:,}"
    if args.tokenizer == "gpt2":
        path = args.cache_dir / "gpt2.tiktoken"
        if not path.exists():
            raise SystemExit(
                f"{path} is missing; get it with: pip download --no-deps openai-whisper -d /tmp/w && "
                f"tar xzf /tmp/w/openai_whisper-*.tar.gz --wildcards '*/whisper/assets/gpt2.tiktoken' "
                f"and copy whisper/assets/gpt2.tiktoken to {path}")
        return str(path), "GPT-2 BPE (`gpt2.tiktoken`, through `tiktoken`), vocabulary 50,257"
    if not Path(args.tokenizer).exists():
        raise SystemExit(f"--tokenizer {args.tokenizer!r} is not 'bpe', 'gpt2' or an existing file")
    return str(Path(args.tokenizer).resolve()), Path(args.tokenizer).name


def _encoders(tok_path: str) -> dict:
    """Which engine encoded for whom: ours' choice (as its prepare and on-the-fly runs resolve it), the peers'."""
    from llm.data.tokenize.tokenizers import load_tokenizer

    peers = "tiktoken" if tok_path.endswith(".tiktoken") else "tokenizers"
    ours = load_tokenizer(tok_path).backend
    # The tokenizer limit is the fastest identical engine's bare loop: ours' choice.
    return {"ours": ours, "LitData, MosaicML": peers, "HF datasets": peers, "limit": ours}


def _versions(ctx: context.Context) -> dict:
    out = {"python": platform.python_version()}
    for dist in ("torch", "tokenizers", "tiktoken", "litdata", "datasets"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            pass
    if Path(ctx.peer_python).exists():
        code = "import importlib.metadata as m; print(m.version('mosaicml-streaming'))"
        p = subprocess.run([ctx.peer_python, "-c", code], capture_output=True, text=True)
        if p.returncode == 0:
            out["mosaicml-streaming"] = p.stdout.strip()
    return out


def write_docs(results: dict, docs_dir: Path, source: str | None = None) -> str:
    """docs/benchmarks.md, docs/benchmarks.png and, after a main run (prepare and stream), the
    README's table (and, given the results file's name `source`, its targets paragraph) beside
    docs_dir, from one results dict; returns the Markdown."""
    results["targets"] = report.targets(results)
    md = report.markdown(results)
    docs_dir.mkdir(parents=True, exist_ok=True)
    (docs_dir / "benchmarks.md").write_text(md)
    report.chart(results, docs_dir / "benchmarks.png")
    readme_file = docs_dir.parent / "README.md"
    if {"prepare", "stream"} <= set(results["scenarios"]) and readme_file.exists():
        readme.rewrite(readme_file, results, source)
    return md


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.report_only:
        print(write_docs(json.loads(args.report_only.read_text()), args.docs_dir, args.report_only.name))
        return 0
    only = [s for s in args.only.split(",") if s] or [s for s in suite.SCENARIOS if s not in suite.OPT_IN]
    unknown = sorted(set(only) - set(suite.SCENARIOS))
    if unknown:
        raise SystemExit(f"unknown scenario(s) {unknown}; use: {', '.join(suite.SCENARIOS)}")
    contestants = [c for c in args.contestants.split(",") if c]
    if bad := sorted(set(contestants) - set(context.CONTESTANTS)):
        raise SystemExit(f"unknown contestant(s) {bad}; use: {', '.join(context.CONTESTANTS)}")
    args.cache_dir.mkdir(parents=True, exist_ok=True)
    # One tokenizer thread per process: the process count is the knob we compare at.
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("RAYON_NUM_THREADS", "1")
    os.environ.setdefault("FASTOKENS_BPE_THREADS", "1")  # fastokens has its own pool: RAYON_NUM_THREADS misses it
    tok_path, tok_name = resolve_tokenizer(args)
    # Each contestant encodes with what its users would use: the peers and the tokenizer limit with
    # `tokenizers` / `tiktoken` (bench.tok), ours with its own choice (--our-encoder, default auto:
    # the fastest engine verified token-identical). `python -m bench.encoders` compares the engines.
    if args.our_encoder != "auto":
        os.environ["LLM_TOKENIZER_BACKEND"] = args.our_encoder
    ctx = context.Context(cache_dir=args.cache_dir, corpus_mb=args.corpus_mb, tokenizer=tok_path,
                        python=args.python, peer_python=args.peer_python, repeat=args.repeat,
                        workers=args.workers, contestants=contestants, log=not args.quiet,
                        resume_at=[int(x) for x in args.resume_at.split(",") if x],
                        profile_dir=(args.cache_dir / "profiles") if args.profile else None,
                        min_stream_tokens=int(args.min_stream_tokens),
                        onthefly_cuts=tuple(c for c in args.onthefly_cuts.split(",") if c),
                        s3={"store_mb": args.s3_mb, "cache_mb": args.s3_cache_mb,
                            "shard_mb": tuple(float(x) for x in args.s3_shard_mb.split(",") if x),
                            "cases": tuple(x for x in args.s3_cases.split(",") if x)})
    started = time.time()
    suite.probe(ctx)
    suite.setup(ctx)
    scenarios: dict[str, list[dict]] = {}
    for name in suite.SCENARIOS:
        if name in only:
            ctx.say(f"scenario {name}")
            scenarios[name] = getattr(suite, f"scenario_{name}")(ctx)
    results = {
        "config": {
            "corpus_mb": args.corpus_mb, "corpus": {k: ctx.corpus[k] for k in ("documents", "text_bytes", "sha256")},
            "tokenizer": Path(tok_path).name, "tokenizer_name": tok_name, "tokens": ctx.tokens["tokens"],
            "encoders": _encoders(tok_path),
            "repeat": args.repeat, "workers": args.workers, "block_size": 2049, "batch_size": 8,
            "resume_at": ctx.resume_at, "min_stream_tokens": ctx.min_stream_tokens,
            "skipped": ctx.skipped, "versions": _versions(ctx),
            "machine": f"{os.cpu_count()} CPUs, {platform.machine()}, load average at start "
                       f"{os.getloadavg()[0]:.1f}",
            "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
            "duration_s": round(time.time() - started, 1),
        },
        "scenarios": scenarios,
        "profiles": ctx.profiles,
    }
    results["targets"] = report.targets(results)
    out = args.results or (REPO_ROOT / "bench" / "results" /
                           f"{time.strftime('%Y%m%d-%H%M', time.gmtime(started))}-{args.corpus_mb:g}mb.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=1, default=str))
    md = report.markdown(results) if args.no_docs else write_docs(results, args.docs_dir, out.name)
    print(md)
    print(f"raw results: {out}", file=sys.stderr)
    return 0
