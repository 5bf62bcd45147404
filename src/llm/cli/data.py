"""`llm-data`: prepare and inspect datasets (optimize, info, verify)."""

from __future__ import annotations

import argparse
import json
import sys


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="llm-data", description="Prepare and inspect llm datasets.")
    sub = parser.add_subparsers(dest="command", required=True)

    opt = sub.add_parser("optimize", help="tokenize text files into checksummed token shards")
    opt.add_argument("inputs", nargs="+", metavar="INPUT", help=".txt / .jsonl[.gz|.zst] / .parquet files, globs or folders")
    opt.add_argument("--output", "-o", required=True, help="dataset folder or s3://bucket/prefix to write")
    opt.add_argument("--tokenizer", default="simple", help="simple | path/to/tokenizer.json | folder | file.tiktoken")
    opt.add_argument("--num-workers", type=int, default=None, help="worker processes (default: all cores)")
    opt.add_argument("--text-column", default="text", help="JSON key / parquet column holding the text")
    opt.add_argument("--chunk-bytes", default="64MB", help="target shard size, e.g. 64MB")
    opt.add_argument("--mode", choices=("append", "overwrite"), default=None, help="when the output folder is not empty")
    opt.add_argument("--compression", choices=("zstd",), default=None)
    opt.add_argument("--no-progress", action="store_true", help="no progress bar")
    opt.add_argument("--wait", action="store_true", help="if another run is writing the output, wait for it (default: fail at once)")

    info = sub.add_parser("info", help="print a dataset's manifest summary as JSON")
    info.add_argument("dataset")

    verify = sub.add_parser("verify", help="check every shard's size and checksum")
    verify.add_argument("dataset")
    return parser


def _run(args: argparse.Namespace) -> None:
    if args.command == "optimize":
        from llm.data.shards.optimize_text import optimize_text

        summary = optimize_text(
            args.inputs, args.output, args.tokenizer, num_workers=args.num_workers, text_column=args.text_column,
            chunk_bytes=args.chunk_bytes, mode=args.mode, compression=args.compression, progress=not args.no_progress,
            wait=args.wait,
        )
        if args.no_progress:  # with progress on, optimize() prints the summary itself
            print(summary.line(), file=sys.stderr)
    elif args.command == "info":
        from llm.data.shards.format.remote import load_any

        data = load_any(args.dataset).to_json()
        data.pop("shards")
        print(json.dumps(data, indent=1))
    elif args.command == "verify":
        from llm.data.shards.format.remote import verify_any

        manifest = verify_any(args.dataset)
        print(f"verify: {len(manifest.shards)} shards OK in {args.dataset}")


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        _run(args)
    except (ValueError, OSError) as e:  # user mistakes: one sentence, no traceback
        print(f"llm-data: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("llm-data: interrupted; the dataset folder is unchanged", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
