"""`llm-data dedup` and `llm-data optimize --dedup`: the flags, and the one-line summary of a run."""

from __future__ import annotations

import argparse
import functools
import math
import re
import sys
import tempfile
from pathlib import Path
from typing import Any

DEDUP_EPILOG = """examples:
  llm-data dedup 'corpus/*.jsonl.zst' --output clean/              # exact duplicates only
  llm-data dedup corpus/ --output clean/ --near 0.8 --num-workers 8 # also near duplicates (MinHash-LSH)
  llm-data dedup s3://b/corpus/ --output s3://b/clean/ --near 0.8 --engine ray --ray-address auto
  llm-data optimize clean/ --output data/ds --tokenizer tokenizer.json
  llm-data optimize corpus/ --output data/ds --dedup near=0.8       # both in one command

The output mirrors the inputs' files as JSON Lines (records unchanged, input order kept), with
dedup.json (counts and parameters) and dedup-removed.jsonl (each removed record's file and line,
and the record it duplicates). A killed run, started again, finishes where it stopped. docs/dedup.md"""


def add_dedup_command(add: Any) -> None:
    """Register `dedup` with the `add(name, help, epilog)` of cli/data.py."""
    cmd = add("dedup", "remove exact and near-duplicate records of a corpus before tokenizing", DEDUP_EPILOG)
    cmd.add_argument("inputs", nargs="+", metavar="INPUT",
                     help=".txt / .jsonl[.gz|.zst] / .parquet files, globs, folders or s3:// URLs")
    cmd.add_argument("--output", "-o", required=True,
                     help="folder, or s3:// gs:// az:// prefix (a cluster whose nodes share no disk), for the kept "
                          "records and the report")
    # Read as text and checked in run_dedup: a bad value is one sentence, not argparse's usage block.
    cmd.add_argument("--near", default=None, metavar="THRESHOLD",
                     help="also remove records whose estimated Jaccard similarity to an earlier one is at least "
                          "THRESHOLD, in (0, 1] (default: exact duplicates only)")
    cmd.add_argument("--text-column", default="text", help="JSON key / parquet column holding the text")
    cmd.add_argument("--engine", choices=("local", "ray"), default="local",
                     help="run the stages in local processes, or as Ray tasks (pip install 'llm-stream-data[ray]')")
    cmd.add_argument("--ray-address", default=None, help="with --engine ray: the cluster to join (default: start a local one)")
    cmd.add_argument("--num-workers", type=int, default=None, help="worker processes (default: all cores)")
    cmd.add_argument("--ngram", type=int, default=5, help="words per shingle (default: 5)")
    cmd.add_argument("--num-perm", type=int, default=128, help="MinHash permutations (default: 128)")
    cmd.add_argument("--minhash", choices=("auto", "rensa", "numpy"), default="auto",
                     help="MinHash engine for --near: rensa (Rust, pip install 'llm-stream-data[dedup-fast]'), "
                          "numpy, or auto: rensa when installed (default)")
    cmd.add_argument("--hash-algo", default="sha256", help="exact-duplicate hash, as the dedup source takes (default: sha256)")
    cmd.add_argument("--overwrite", action="store_true", help="replace what the output folder holds (default: refuse)")
    cmd.add_argument("--wait", action="store_true", help="if another run is writing the output, wait for it (default: fail at once)")
    cmd.add_argument("--no-progress", action="store_true", help="no progress bars")
    # argparse takes `-inf`, `-nan` or `-1e-3` for an option (it knows only `-1` and `-.5` as numbers), so
    # `--near -inf` would end in its usage block; read as values, they get parse_near's one sentence.
    cmd._negative_number_matcher = _NEGATIVE_VALUE


_NEGATIVE_VALUE = re.compile(r"^-(\d|\.\d|inf|nan)", re.IGNORECASE)


def parse_near(value: str | None) -> float | None:
    """`--near`'s text to a threshold in (0, 1] (None: exact duplicates only); anything else one sentence."""
    if value is None:
        return None
    try:
        near = float(value)
    except ValueError:
        near = math.nan
    if not 0 < near <= 1:  # NaN fails this too
        raise ValueError(f"--near takes a Jaccard similarity threshold in (0, 1] (e.g. --near 0.8), got {value!r}")
    return near


def summary(report: dict, output: str | Path) -> str:
    near = report["parameters"].get("near")
    return (f"dedup: {report['records_in']:,} records in, {report['kept']:,} kept, {report['removed']:,} removed "
            f"({report['exact_duplicates']:,} exact" + (f", {report['near_duplicates']:,} near at >= {near} in "
            f"{report['near_duplicate_clusters']:,} clusters" if near is not None else "") + f"); {output}")


def run_dedup(args: argparse.Namespace) -> None:
    from llm.data.corpus_dedup import dedup_corpus

    report = dedup_corpus(args.inputs, args.output, near=parse_near(args.near), text_column=args.text_column, engine=args.engine,
                          num_workers=args.num_workers, overwrite=args.overwrite, wait=args.wait,
                          hash_algo=args.hash_algo, ngram=args.ngram, num_perm=args.num_perm,
                          minhash=args.minhash, ray_address=args.ray_address, progress=not args.no_progress)
    print(summary(report, args.output), file=sys.stderr)


def parse_dedup_option(value: str) -> float | None:
    """`--dedup exact` -> None (exact only), `--dedup near=0.8` -> 0.8; anything else one sentence."""
    if value == "exact":
        return None
    if value.startswith("near="):
        try:
            return float(value[5:])
        except ValueError:
            pass
    raise ValueError(f"--dedup takes 'exact' or 'near=THRESHOLD' (e.g. near=0.8), got {value!r}")


def dedup_before_optimize(args: argparse.Namespace) -> list[str]:
    """Run the dedup stage for `optimize --dedup`; returns the inputs optimize reads instead (its output folder).

    A local dataset gets the stage's folder next to it (`<output>.dedup`, kept for its report and
    removed list; a rerun of the same command resumes it, or finds it finished); a dataset in
    object storage a temporary folder.
    """
    from llm.data.corpus_dedup import dedup_corpus
    from llm.data.corpus_dedup.pipeline import DedupRunMismatch
    from llm.data.inputs.listing import refuse_inputs_in_output
    from llm.data.storage.paths import parse_location

    near = parse_dedup_option(args.dedup)
    remote = "://" in str(args.output)
    location = parse_location(args.output)
    if not location.is_object_store:  # optimize checks its own input, the stage's folder: the corpus is checked here
        refuse_inputs_in_output(args.inputs, location.local_path())
    folder = Path(tempfile.mkdtemp(prefix="llm-dedup-")) if remote else Path(f"{str(args.output).rstrip('/')}.dedup")
    run = functools.partial(dedup_corpus, args.inputs, folder, near=near, text_column=args.text_column,
                            engine=args.engine, num_workers=args.num_workers, wait=args.wait,
                            ray_address=args.ray_address, progress=not args.no_progress)
    try:  # a rerun of the same command resumes the stage, or finds it finished
        report = run(overwrite=remote or args.mode == "overwrite")
    except DedupRunMismatch:
        if args.mode != "append":
            raise
        # appending other inputs: the stage's folder holds the previous optimize's dedup, kept only for its
        # report; this run's stage replaces it
        report = run(overwrite=True)
    print(summary(report, folder), file=sys.stderr)
    return [str(folder)]
