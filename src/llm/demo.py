"""The demo: the data path, then the training guide, on a laptop CPU.

1. Real text -> `llm-data optimize` (2 workers) -> one shuffled epoch with 2
   loader workers, stopped at 40% and resumed in a fresh process; checks that
   every block arrives exactly once. The corpus is this Python's own standard
   library sources, one document per file, so it runs on any machine.
2. The guide's sequence: `llm-train --task stream_lm` on data/demo.txt, then the
   same command resumed from `checkpoints/demo/latest`, then a short run on
   optimized shards (`data_source: optimized`).
3. Something to look at: the run's loss and throughput curves (`llm-train plot`,
   a PNG), text the model wrote (`llm-generate`), and the run proved from its ledger
   (`llm-train audit`: every sample trained exactly once); then a summary of what was
   written where, and the next commands to try.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import subprocess
import sys
import time
from pathlib import Path

BLOCK, BATCH, WORKERS = 513, 8, 2


def build_corpus(out: Path, max_mb: float) -> Path:
    """One JSON record per standard-library source file, up to max_mb of text."""
    stdlib = Path(json.__file__).resolve().parent.parent
    corpus = out / "corpus.jsonl"
    written = 0
    with open(corpus, "w") as f:
        for path in sorted(stdlib.rglob("*.py")):
            if "site-packages" in path.parts:
                continue
            text = path.read_text(encoding="utf-8", errors="replace")
            f.write(json.dumps({"text": text, "path": str(path.relative_to(stdlib))}) + "\n")
            written += len(text)
            if written > max_mb * 1e6:
                break
    return corpus


def train_tokenizer(corpus: Path, out: Path) -> Path:
    from llm.data.tokenize.tokenizers import train_bpe_tokenizer

    texts = (json.loads(line)["text"] for _, line in zip(range(400), open(corpus)))
    return train_bpe_tokenizer(texts, 4096, out / "tokenizer")


def _loader(dataset: Path):
    from llm.data import StreamingDataLoader, StreamingDataset, TokensLoader

    ds = StreamingDataset(dataset, item_loader=TokensLoader(block_size=BLOCK), shuffle=True, seed=42)
    return StreamingDataLoader(ds, batch_size=BATCH, num_workers=WORKERS)


def _digests(batch) -> list[str]:
    return [hashlib.blake2b(row.numpy().tobytes(), digest_size=8).hexdigest() for row in batch]


def stream(dataset: Path, state_path: Path, seen_path: Path, stop_fraction: float | None) -> None:
    """Stream from the saved state (if any) until stop_fraction of the epoch, then save the state."""
    loader = _loader(dataset)
    if state_path.exists():
        loader.load_state_dict(json.loads(state_path.read_text()))
    stop_at = int(len(loader) * stop_fraction) if stop_fraction is not None else None
    seen: list[str] = []
    started, first = time.perf_counter(), None
    for step, batch in enumerate(loader, start=loader.state_dict()["samples_consumed"] // BATCH):
        first = first or time.perf_counter() - started
        seen += _digests(batch)
        if stop_at is not None and step + 1 >= stop_at:
            break
    elapsed = time.perf_counter() - started
    state = loader.state_dict()
    state_path.write_text(json.dumps(state))
    with open(seen_path, "a") as f:
        f.write("\n".join(seen) + "\n")
    print(json.dumps({"blocks": len(seen), "seconds": elapsed, "first_batch_s": first, "state_bytes": len(json.dumps(state))}))


def _child(args: list[str]) -> dict:
    """Run one streaming part in a fresh process, as a restarted training job would."""
    result = subprocess.run([sys.executable, "-m", "llm.demo", *args], check=True, capture_output=True, text=True)
    return json.loads(result.stdout.strip().splitlines()[-1])


CONFIGS = Path(__file__).resolve().parents[2] / "configs"


def _cli(args: list[str], cwd: Path) -> str:
    result = subprocess.run([sys.executable, "-m", *args], cwd=cwd, capture_output=True, text=True)
    if result.returncode != 0:
        sys.stderr.write(result.stdout + result.stderr)
        raise SystemExit(f"demo: `{' '.join(args)}` failed with exit code {result.returncode}")
    return result.stdout + result.stderr


def _last_lines(text: str, n: int) -> str:
    return "\n".join("   " + line for line in text.strip().splitlines()[-n:])


def _tool(name: str) -> str:
    """How to call a console script: next to this Python when installed there, else by its bare name."""
    path = Path(sys.executable).parent / name
    return str(path) if path.exists() else name


def train_demo(out: Path) -> dict[str, Path]:
    """The guide's sequence, verbatim but for --set instead of editing the YAML by hand."""
    import yaml

    work = out / "guide"
    (work / "data").mkdir(parents=True, exist_ok=True)
    (work / "data" / "demo.txt").write_text("\n".join(f"sample line {i}" for i in range(500)) + "\n")
    config = work / "streaming_local_demo.yaml"
    tree = yaml.safe_load((CONFIGS / "streaming_local_demo.yaml").read_text())
    config.write_text(yaml.safe_dump(tree))
    train = ["llm.cli.train", "--task", "stream_lm", "--config-path", str(config), "--epochs", "1", "--steps-per-epoch", "5"]
    # --overwrite: a demo run again in the same --out starts over instead of meeting its last run's checkpoints
    print("demo: llm-train --task stream_lm --config-path configs/streaming_local_demo.yaml --epochs 1 --steps-per-epoch 5 --overwrite")
    print(_last_lines(_cli([*train, "--overwrite"], work), 3))
    tree["checkpoint"].update(checkpoint_dir="checkpoints/demo", resume_from_checkpoint="checkpoints/demo/latest")
    config.write_text(yaml.safe_dump(tree))
    print("demo: the same, with checkpoint.resume_from_checkpoint: checkpoints/demo/latest")
    print(_last_lines(_cli(train, work), 3))
    _cli(["llm.cli.data", "optimize", "data/demo.txt", "--output", "data/demo_optimized", "--tokenizer", "simple",
          "--mode", "overwrite", "--no-progress"], work)
    print("demo: llm-data optimize data/demo.txt, then llm-train on the shards (configs/optimized_demo.yaml)")
    optimized = ["llm.cli.train", "--task", "stream_lm", "--config-path", str(CONFIGS / "optimized_demo.yaml"), "--epochs", "1",
                 "--overwrite"]
    print(_last_lines(_cli(optimized, work), 3))
    run = work / "checkpoints" / "demo"
    written = {"training run (checkpoints)": run, "its metrics.jsonl": run / "metrics.jsonl"}
    if importlib.util.find_spec("matplotlib") is not None:
        print("demo: llm-train plot checkpoints/demo  (loss and throughput curves)")
        _cli(["llm.training.train", "plot", "checkpoints/demo"], work)
        written["its curves (PNG)"] = run / "metrics.png"
    print('demo: llm-generate --checkpoint checkpoints/demo/latest --prompt "sample line"'
          " (its defaults: top-k 5, temperature 0.8; a 10-step model: expect near-words)")
    text = subprocess.run(
        [sys.executable, "-m", "llm.training.generate", "--checkpoint", "checkpoints/demo/latest", "--prompt",
         "sample line", "--max-new-tokens", "48"],
        cwd=work, capture_output=True, text=True, check=True,
    ).stdout.strip()
    print(f"   {text!r}")
    print("demo: llm-train audit checkpoints/demo  (every sample the run trained on, counted from its ledger)")
    print(_last_lines(_cli(["llm.cli.train", "audit", "checkpoints/demo"], work), 3))
    return written


def summary(dataset: Path, tokenizer: Path, trained: dict[str, Path]) -> str:
    """What the demo showed, where its files are, and three commands to try next."""
    lines = [
        "demo: done. It showed: text -> token shards -> a shuffled epoch stopped, resumed in a fresh process, "
        "every block exactly once" + ("; llm-train trained, resumed, read optimized shards, and wrote text" if trained else ""),
        "demo: written (absolute paths):",
        f"   dataset (llm-data optimize)   {dataset}",
        f"   BPE tokenizer                 {tokenizer}",
    ]
    lines += [f"   {what:<30}{path}" for what, path in trained.items()]
    lines.append("demo: try next:")
    lines.append(f"   {_tool('llm-data')} info {dataset}")
    if trained:
        run = next(iter(trained.values()))
        lines.append(f"   {_tool('llm-train')} plot {run}")
        lines.append(f"   {_tool('llm-train')} why {run} --step 7   (what a step trained on: docs/proving-a-run.md)")
        lines.append(f'   {_tool("llm-generate")} --checkpoint {run / "latest"} --prompt "sample line" --max-new-tokens 60')
    else:
        lines.append(f"   {_tool('llm-data')} verify {dataset}")
        lines.append(f"   {_tool('llm-train')} --help")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", default="demo_out", help="work folder (reused: the corpus is cached)")
    parser.add_argument("--corpus-mb", type=float, default=20.0)
    parser.add_argument("--skip-training", action="store_true", help="only the data part")
    parser.add_argument("--stream-part", nargs=4, metavar=("DATASET", "STATE", "SEEN", "FRACTION"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.stream_part:
        dataset, state, seen, fraction = args.stream_part
        stream(Path(dataset), Path(state), Path(seen), None if fraction == "end" else float(fraction))
        return 0

    out = Path(args.out).resolve()  # the training part runs with its own working folder
    out.mkdir(parents=True, exist_ok=True)
    corpus = build_corpus(out, args.corpus_mb)
    print(f"demo: corpus {corpus} ({corpus.stat().st_size / 1e6:.1f} MB of Python sources)")
    tokenizer = train_tokenizer(corpus, out)
    dataset = out / "dataset"
    subprocess.run(
        [sys.executable, "-m", "llm.cli.data", "optimize", str(corpus), "--output", str(dataset), "--tokenizer",
         str(tokenizer), "--num-workers", "2", "--chunk-bytes", "4MB", "--mode", "overwrite"],
        check=True,
    )
    state, seen = out / "loader_state.json", out / "seen.txt"
    state.unlink(missing_ok=True)
    seen.unlink(missing_ok=True)
    part1 = _child(["--stream-part", str(dataset), str(state), str(seen), "0.4"])
    print(f"demo: streamed {part1['blocks']} blocks, stopped at 40% of the epoch; state = {state.read_text()}")
    part2 = _child(["--stream-part", str(dataset), str(state), str(seen), "end"])
    digests = seen.read_text().split()
    from llm.data import StreamingDataset, TokensLoader

    ds = StreamingDataset(dataset, item_loader=TokensLoader(block_size=BLOCK))
    expected = sorted(d for i in range(len(ds)) for d in _digests(ds[i].unsqueeze(0)))
    exact = sorted(digests) == expected
    tokens = len(digests) * BLOCK
    print(
        f"demo: {len(digests):,} blocks ({tokens:,} tokens) over one shuffled epoch with {WORKERS} workers, "
        f"resumed in a fresh process after {part1['blocks']:,} blocks: first batch after resume in "
        f"{part2['first_batch_s']:.3f} s, state {part2['state_bytes']} bytes, "
        f"{tokens / (part1['seconds'] + part2['seconds']) / 1e6:.1f} M tokens/s; "
        f"every block exactly once: {'yes' if exact else 'NO'}"
    )
    if not exact:
        return 1
    trained = {} if args.skip_training else train_demo(out)
    print(summary(dataset, tokenizer, trained))
    return 0


if __name__ == "__main__":
    sys.exit(main())
