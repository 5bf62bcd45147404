"""`llm-data train-tokenizer`: every input's text column checked first, then a byte-level BPE trained with progress."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

EPILOG = """examples:
  llm-data train-tokenizer 'corpus/*.jsonl' --vocab-size 8192 --output tokenizer.json
  llm-data optimize 'corpus/*.jsonl' --output data/ds --tokenizer tokenizer.json

A byte-level BPE (GPT-2 style) with <|endoftext|> as EOS, trained offline on your text.
Every input's first record is read before training starts, so a missing --text-column is
named at once. Already have one? Pass its tokenizer.json or .tiktoken file to --tokenizer directly."""


def add_train_tokenizer_command(add: Callable[[str, str, str], argparse.ArgumentParser]) -> None:
    """The `train-tokenizer` subcommand and its flags."""
    tok = add("train-tokenizer", "train a byte-level BPE tokenizer on text files", EPILOG)
    tok.add_argument("inputs", nargs="+", metavar="INPUT", help=".txt / .jsonl[.gz|.zst] / .parquet files, globs or folders")
    tok.add_argument("--vocab-size", type=int, default=8192, help="vocabulary size, including 256 byte tokens and EOS")
    tok.add_argument("--output", "-o", required=True, help="tokenizer.json to write (or a folder to write it in)")
    tok.add_argument("--text-column", default="text", help="JSON key / parquet column holding the text")
    tok.add_argument("--overwrite", action="store_true", help="replace an existing tokenizer file")
    tok.add_argument("--no-progress", action="store_true", help="no progress bar")


def _target(args: argparse.Namespace) -> Path:
    """The tokenizer.json to write; a bad --vocab-size or --output is one sentence."""
    if args.vocab_size < 258:
        raise ValueError(f"--vocab-size {args.vocab_size} is too small: at least 258 (256 byte tokens, EOS and one merge)")
    out = Path(args.output).expanduser()
    target = out if out.suffix == ".json" else out / "tokenizer.json"
    if out.suffix == ".json" and out.is_dir():
        raise ValueError(f"--output {args.output} is a folder, not a file")
    if out.suffix != ".json" and out.exists() and not out.is_dir():
        raise ValueError(f"--output {args.output} is a file but not a .json file; name it tokenizer.json")
    if target.exists() and not args.overwrite:
        raise ValueError(f"{target} already exists; pass --overwrite to replace it (datasets tokenized with it "
                         "would no longer match it)")
    return target


def check_text_columns(paths: list[Any], text_column: str) -> None:
    """Read each input's first record, all before any training: one sentence for the first bad one (and how many more)."""
    from llm.data.inputs.errors import InputError
    from llm.data.inputs.readers import iter_texts

    bad: list[tuple[Any, InputError]] = []
    for path in paths:
        try:
            next(iter_texts(path, text_column), None)  # a parquet file's schema, a JSON file's first record
        except InputError as e:
            bad.append((path, e))
    if bad:
        names = ", ".join(str(p) for p, _ in bad[1:4]) + (", ..." if len(bad) > 4 else "")
        more = f"; {len(bad) - 1} more input(s) fail this check too ({names})" if len(bad) > 1 else ""
        raise InputError(f"{str(bad[0][1]).rstrip('.')}{more}; nothing was trained")


def _texts(paths: list[Any], text_column: str, stats: dict[str, int], bar: Any) -> Iterator[str]:
    from llm.data.inputs.readers import iter_texts

    for number, path in enumerate(paths, 1):
        bar.set_description_str(f"train-tokenizer: reading {number}/{len(paths)} {Path(str(path)).name}", refresh=False)
        for text, _ in iter_texts(path, text_column):
            if text.strip():
                stats["documents"] += 1
                stats["chars"] += len(text)
                bar.update(1)
                yield text
    shown = not bar.disable  # close() disables the bar
    bar.close()  # read to the end: the merges are computed next
    if shown:
        print(f"train-tokenizer: {stats['documents']:,} documents read; computing the merges", file=sys.stderr, flush=True)


def run_train_tokenizer(args: argparse.Namespace) -> None:
    """Check the flags and every input's text column, then read the text (with progress) and train."""
    from tqdm.auto import tqdm

    from llm.data.inputs.readers import expand_inputs
    from llm.data.tokenize.tokenizers import load_tokenizer, train_bpe_tokenizer

    target = _target(args)
    paths = expand_inputs(args.inputs)
    check_text_columns(paths, args.text_column)
    stats = {"documents": 0, "chars": 0}
    bar = tqdm(unit=" documents", desc="train-tokenizer: reading", disable=args.no_progress, dynamic_ncols=True,
               file=sys.stderr, mininterval=0.5)
    try:
        written = train_bpe_tokenizer(_texts(paths, args.text_column, stats, bar), args.vocab_size, target,
                                      progress=not args.no_progress and sys.stderr.isatty())  # else blank lines
    finally:
        bar.close()
    if not stats["documents"]:
        written.unlink(missing_ok=True)
        raise ValueError(f"no text in {', '.join(args.inputs)}: nothing to train a tokenizer on")
    vocab = load_tokenizer(str(written)).vocab_size
    print(f"train-tokenizer: {vocab:,} tokens learned from {stats['documents']:,} documents "
          f"({stats['chars']:,} characters) -> {written}", file=sys.stderr)
    print(f"next: llm-data optimize {' '.join(args.inputs)} --output DATASET --tokenizer {written}", file=sys.stderr)
