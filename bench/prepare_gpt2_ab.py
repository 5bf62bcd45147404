"""Ours before and after a change, against LitData + tiktoken, as whole processes with GPT-2's vocabulary.

    python -m bench.prepare_gpt2_ab --baseline /path/to/other/checkout/src [--repeat 5] [--corpus-mb 60]

The `prepare_gpt2` scenario's commands (bench/prepare_gpt2.py), three per repeat, alternating:
`llm-data optimize` importing `llm` from the baseline's src/, the same from this checkout's src/,
and LitData; on the corpus and on one short document (the fixed start-up cost). Medians
[min-max] of wall time, CPU time of the tree and peak RSS; LitData's time over each of ours per
repeat. Needs `.bench_cache/gpt2.tiktoken` and the corpus (`python -m bench --only prepare_gpt2
--tokenizer gpt2 --corpus-mb 60` makes both). Writes bench/results/prepare-gpt2-ab-<time>.json.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
from pathlib import Path

from bench.corpus import build_corpus, corpus_paths
from bench.measure import REPO_ROOT, run_command
from bench.prepare_gpt2 import _llm_data, _tiny_corpus, _tokens_written, gpt2_file, tiktoken_cache
from bench.results import save


def _cell(values: list[float]) -> str:
    return f"{statistics.median(values):.2f} [{min(values):.2f}-{max(values):.2f}]"


def main(argv: list[str] | None = None) -> None:
    import sys

    p = argparse.ArgumentParser(prog="python -m bench.prepare_gpt2_ab", description=__doc__.splitlines()[0])
    p.add_argument("--baseline", required=True, help="the src/ folder whose `llm` is the 'before'")
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--corpus-mb", type=float, default=60.0)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--cache-dir", type=Path, default=REPO_ROOT / ".bench_cache")
    args = p.parse_args(argv)
    ranks = gpt2_file(args.cache_dir)
    env = {"TIKTOKEN_CACHE_DIR": str(tiktoken_cache(args.cache_dir, ranks)), "TOKENIZERS_PARALLELISM": "false"}
    corpus = build_corpus(args.cache_dir, args.corpus_mb)
    work = args.cache_dir / "prepare-gpt2-ab"
    sides = {"before": str(Path(args.baseline).resolve()), "after": str(REPO_ROOT / "src")}
    result: dict = {"corpus_mb": corpus["text_bytes"] / 1e6, "repeat": args.repeat, "baseline": sides["before"]}
    lines = []
    for label, inputs in (("corpus", corpus_paths(corpus)), ("1 document", _tiny_corpus(args.cache_dir))):
        runs: dict[str, list[dict]] = {}
        for rep in range(args.repeat):
            for name in ("before", "after", "litdata"):
                out = work / name
                shutil.rmtree(out, ignore_errors=True)
                if name == "litdata":
                    cmd = [sys.executable, str(REPO_ROOT / "bench" / "runners" / "litdata_gpt2.py"), str(out),
                           str(args.workers), *inputs]
                    side_env = dict(env)
                else:
                    cmd = [*_llm_data(sys.executable), "optimize", *inputs, "--output", str(out), "--tokenizer",
                           str(ranks), "--num-workers", str(args.workers), "--no-progress", "--overwrite"]
                    side_env = dict(env, PYTHONPATH=sides[name])
                _, err, code, measured = run_command(cmd, env=side_env)
                if code != 0:
                    raise SystemExit(f"{name} failed (exit {code}): {err[-2000:]}")
                measured["tokens"] = _tokens_written("litdata" if name == "litdata" else "ours", out)
                runs.setdefault(name, []).append(measured)
                print(f"{label} rep {rep + 1}: {name} {measured['wall_s']:.2f} s", file=sys.stderr, flush=True)
        tokens = {r["tokens"] for rs in runs.values() for r in rs}
        result[label] = {"runs": runs, "same_tokens": len(tokens) == 1}
        lines += [f"### {label} ({'same tokens on every side' if len(tokens) == 1 else '**token counts differ**'})",
                  "", "| side | wall s | CPU s (tree) | peak RSS MB |", "|---|---|---|---|"]
        for name, rs in runs.items():
            lines.append(f"| {name} | {_cell([r['wall_s'] for r in rs])} | {_cell([r['cpu_s'] for r in rs])} | "
                         f"{_cell([r['peak_rss_mb'] for r in rs])} |")
        for name in ("before", "after"):
            pairs = list(zip(runs["litdata"], runs[name]))
            lines.append(f"- LitData / {name}: wall {_cell([lit['wall_s'] / o['wall_s'] for lit, o in pairs])}x, "
                         f"CPU {_cell([lit['cpu_s'] / o['cpu_s'] for lit, o in pairs])}x (paired per repeat)")
        lines += [f"- before / after: wall {_cell([b['wall_s'] / a['wall_s'] for b, a in zip(runs['before'], runs['after'])])}x", ""]
    save("prepare-gpt2-ab", result, lines)


if __name__ == "__main__":
    main()
