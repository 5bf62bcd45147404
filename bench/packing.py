"""Scenario `packing`: best-fit vs greedy packing of real text on the fly (`StreamingTextDataModule`), side by side.

Both modes read the same JSONL files with the same tokenizer into blocks of 2048 tokens,
batch 8, in this process, alternating greedy / best_fit per repeat. Measured from the
batches themselves:

- padding: label slots that hold no target (-100), over all slots;
- cuts: places where a document runs on into another block (a piece of a row that ends
  without its document's EOS target; a document cut twice counts twice);
- throughput: slots delivered per CPU second of the loop (tokenize + pack + batch, one process;
  CPU time, not wall time, so that other work on a shared machine does not decide the ratio;
  wall-clock rates are in the JSON too).

Two corpora of the same real text: `documents`, the bench corpus as it is (whole source
files and docs: long, a median of ~9 k characters), and `paragraphs`, the same files cut
at blank lines (short documents, closer to web text).
`python -m bench.packing` runs it alone; `python -m bench --only packing` within the suite.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np

from bench.results import newest, save, spread

MAX_SEQ_LEN, BATCH, BUFFER = 2048, 8, 64
IGNORE = -100


def count(batch: dict, eos: int) -> dict[str, int]:
    """Slots, padding, documents ended and cuts in one batch (see the module docstring)."""
    labels = batch["labels"].numpy()
    pad = labels == IGNORE
    docs = int((labels == eos).sum())
    if "position_ids" in batch:  # best fit: pieces start where positions restart
        pos = batch["position_ids"].numpy()
        ends = np.zeros_like(pad)
        ends[:, :-1] = pos[:, 1:] == 0
        ends[:, -1] = True
        piece_end = ends & ~pad
    else:  # greedy: a row's last real slot ends a piece
        last = (~pad).cumsum(axis=1).argmax(axis=1)
        piece_end = np.zeros_like(pad)
        piece_end[np.arange(len(labels)), last] = ~pad[np.arange(len(labels)), last]
    cuts = int((piece_end & (labels != eos)).sum())
    return {"slots": int(labels.size), "padding": int(pad.sum()), "documents": docs, "cuts": cuts}


def run_once(files: str, tokenizer: str, packing: str, buffer: int = BUFFER) -> dict[str, Any]:
    """One pass over `files` (a glob or folder of JSONL), packed one way; the counts and the seconds."""
    from llm.data.text.stream import StreamingTextDataModule
    from llm.training.core.data_config import DataConfig

    cfg = DataConfig(dataset_path=files, max_seq_len=MAX_SEQ_LEN,
                     packing=packing, packing_buffer=buffer, **_tokenizer_keys(tokenizer))
    module = StreamingTextDataModule(cfg, BATCH, loop=False)
    eos = module.tokenizer.eos_id
    totals = {"slots": 0, "padding": 0, "documents": 0, "cuts": 0}
    start, cpu = time.perf_counter(), time.process_time()
    for batch in module.train_dataloader():
        for k, v in count(batch, eos).items():
            totals[k] += v
    seconds, cpu_s = time.perf_counter() - start, time.process_time() - cpu
    return {**totals, "seconds": seconds, "cpu_s": cpu_s, "tokens_per_s": totals["slots"] / cpu_s,
            "wall_tokens_per_s": totals["slots"] / seconds, "padding_fraction": totals["padding"] / totals["slots"]}


def _tokenizer_keys(path: str) -> dict[str, Any]:
    if path == "simple":
        return {}
    return {"tokenizer_type": "tiktoken" if path.endswith(".tiktoken") else "hf", "tokenizer_path": path}


def paragraphs(files: list[str], out: Path) -> str:
    """The same text with every blank-line-separated paragraph a document of its own (cached)."""
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for f in files:
        target = out / Path(f).name
        if not target.exists():
            tmp = target.with_suffix(".tmp")
            with open(f, encoding="utf-8") as src, open(tmp, "w", encoding="utf-8") as dst:
                for line in src:
                    for para in json.loads(line)["text"].split("\n\n"):
                        if para.strip():
                            dst.write(json.dumps({"text": para.strip()}, ensure_ascii=False) + "\n")
            tmp.rename(target)
        written.append(str(target))
    return str(out)


def compare(corpora: dict[str, str], tokenizer: str, repeat: int, say: Any = print) -> list[dict]:
    """Rows per corpus and mode (medians over the repeats), then best_fit / greedy ratios."""
    rows = []
    for name, files in corpora.items():
        runs: dict[str, list[dict]] = {"greedy": [], "best_fit": []}
        for r in range(repeat):
            for mode in ("greedy", "best_fit") if r % 2 == 0 else ("best_fit", "greedy"):
                runs[mode].append(run_once(files, tokenizer, mode))
                say(f"packing {name} {mode} repeat {r}: {runs[mode][-1]['tokens_per_s'] / 1e6:.2f} M slots/CPU s, "
                    f"padding {runs[mode][-1]['padding_fraction']:.4f}, cuts {runs[mode][-1]['cuts']}")
        for mode, rs in runs.items():
            first = rs[0]  # the counts are the same every repeat: packing is deterministic
            rows.append({"who": "ours", "case": f"{name}, {mode}", "corpus": name, "packing": mode,
                         **{k: first[k] for k in ("slots", "padding", "documents", "cuts", "padding_fraction")},
                         "tokens_per_s": _stat([x["tokens_per_s"] for x in rs]),
                         "wall_tokens_per_s": _stat([x["wall_tokens_per_s"] for x in rs])})
        g, b = runs["greedy"], runs["best_fit"]
        rows.append({"who": "ours", "case": f"{name}, best_fit / greedy", "corpus": name,
                     "throughput_ratio": _stat([y["tokens_per_s"] / x["tokens_per_s"] for x, y in zip(g, b)]),
                     "cuts_ratio": g[0]["cuts"] / max(1, b[0]["cuts"]),
                     "best_fit_padding": b[0]["padding_fraction"]})
    return rows


def _stat(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values)}


def markdown(rows: list[dict]) -> list[str]:
    """The section of docs/benchmarks.md."""
    md = ["", "## Packing: best fit vs greedy (on the fly, blocks of 2048 tokens, batch 8)", "",
          "`python -m bench.packing`: the same text packed both ways in one process, alternating per repeat. "
          "Padding: slots without a target; cuts: places where a document runs on into another block "
          "(a document cut twice counts twice). `documents`: the bench corpus as it is (whole files); "
          "`paragraphs`: the same text, a document per paragraph.", "",
          "| corpus | packing | documents | padding | cuts | M slots / CPU s |", "|---|---|---|---|---|---|"]
    md += [f"| {r['corpus']} | {r['packing']} | {r['documents']:,} | {100 * r['padding_fraction']:.2f}% | "
           f"{r['cuts']:,} | {_spread(r['tokens_per_s'], 1e6)} |" for r in rows if "packing" in r]
    md += ["", "| corpus | best-fit padding (goal <= 2%) | greedy cuts / best-fit cuts (goal >= 5) | "
           "throughput best fit / greedy (goal >= 0.8) |", "|---|---|---|---|"]
    md += [f"| {r['corpus']} | {100 * r['best_fit_padding']:.2f}% | {r['cuts_ratio']:.1f} | "
           f"{_spread(r['throughput_ratio'])} |" for r in rows if "cuts_ratio" in r]
    return md


_spread = spread


def scenario_packing(ctx: Any) -> list[dict]:
    """Within `python -m bench`: the suite's corpus (its first files, ~PACKING_MB) and tokenizer."""
    from bench.corpus import corpus_paths

    files = corpus_paths(ctx.corpus)[:4]  # ~8 MB: the counts settle long before
    corpora = {"documents": str(Path(files[0]).parent / "part-0000[0-3].jsonl"),
               "paragraphs": paragraphs(files, ctx.work_dir / "paragraphs")}
    return compare(corpora, ctx.tokenizer, max(2, ctx.repeat), ctx.say)


def latest() -> list[dict] | None:
    """The rows of the newest saved packing result (docs/benchmarks.md keeps its section when other scenarios are rerun)."""
    found = newest("packing")
    return found["rows"] if found else None


def main(argv: list[str] | None = None) -> int:
    from bench.corpus import build_corpus, corpus_paths
    from bench.measure import REPO_ROOT
    from bench.tok import train_tokenizer

    p = argparse.ArgumentParser(prog="python -m bench.packing", description=__doc__)
    p.add_argument("--corpus-mb", type=float, default=8.0, help="MB of real text (default 8)")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--cache-dir", type=Path, default=REPO_ROOT / ".bench_cache")
    p.add_argument("--tokenizer", default="", help="a tokenizer.json / .tiktoken (default: the bench's BPE)")
    args = p.parse_args(argv)
    meta = build_corpus(args.cache_dir, args.corpus_mb)
    files = corpus_paths(meta)
    tokenizer = args.tokenizer or train_tokenizer(args.cache_dir, files, max_train_mb=min(args.corpus_mb, 20.0))
    corpora = {"documents": str(Path(meta["dir"]) / "part-*.jsonl"),
               "paragraphs": paragraphs(files, args.cache_dir / f"paragraphs-{args.corpus_mb:g}mb")}
    rows = compare(corpora, tokenizer, args.repeat)
    save("packing", {"corpus_mb": args.corpus_mb, "documents": meta["documents"], "tokenizer": Path(tokenizer).name,
                      "rows": rows}, markdown(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
