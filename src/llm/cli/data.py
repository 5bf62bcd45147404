"""`llm-data`: prepare and inspect datasets (optimize, dedup, info, verify, train-tokenizer, cache)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from llm.data.storage.sizes import format_size
from llm.training.cli_help import HelpFormatter, add_version, expect_folder


class _Default(str):
    """A default value that is told apart from the same value typed by the user."""


DEFAULT_TOKENIZER = _Default("simple")

_TOP_EPILOG = """examples:
  llm-data optimize 'corpus/*.jsonl.zst' --output data/ds --tokenizer tokenizer.json
  llm-data info data/ds
  llm-data train-tokenizer corpus/ --vocab-size 8192 --output tokenizer.json

A dataset made by `optimize` is read by StreamingDataset / StreamingDataLoader, and by
`llm-train` with `data_source: optimized` (configs/optimized_demo.yaml). Run
`llm-data COMMAND --help` for each command's flags."""

_OPTIMIZE_EPILOG = """examples:
  llm-data optimize notes.txt --output data/notes                      # byte-level `simple` tokenizer
  llm-data optimize 'corpus/*.jsonl.zst' --output data/ds --tokenizer tokenizer.json --num-workers 8
  llm-data optimize more.jsonl --output data/ds --tokenizer tokenizer.json --mode append

Tokenizer: `simple` (bytes, EOS 256, no download), a tokenizer.json (or a folder holding
one) or a .tiktoken file you already have; `llm-data train-tokenizer` makes a BPE one.
Train on the result with `llm-train --task stream_lm` and `data_source: optimized`."""

_INFO_EPILOG = """examples:
  llm-data info data/ds          # a readable summary
  llm-data info data/ds --json   # the manifest's totals and fields as JSON (no shard list)"""

_VERIFY_EPILOG = """example:
  llm-data verify data/ds        # exit 0: every shard's size and checksum match the manifest"""

_CACHE_EPILOG = """examples:
  llm-data cache ls                               # every cache folder: fingerprint, URL, shards, bytes, last used
  llm-data cache clear s3://my-bucket/datasets/c4 # by URL, or by fingerprint (or its first 8+ characters)
  llm-data cache clear --all --cache-dir /scratch/cache

Remote datasets (s3://, gs://, az://, local:) are read through cache_dir/<fingerprint> (default
$LLM_CACHE_DIR/shards, else ~/.cache/llm/shards). `clear` never removes a shard a running reader is
reading: what is in use is kept and listed."""


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="llm-data", description="Prepare and inspect llm datasets (token shards).", epilog=_TOP_EPILOG,
        formatter_class=HelpFormatter,
    )
    add_version(parser)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def add(name: str, help: str, epilog: str) -> argparse.ArgumentParser:
        return sub.add_parser(name, help=help, description=help[0].upper() + help[1:] + ".", epilog=epilog,
                              formatter_class=HelpFormatter)

    opt = add("optimize", "tokenize text files into checksummed token shards", _OPTIMIZE_EPILOG)
    opt.add_argument("inputs", nargs="+", metavar="INPUT", help=".txt / .jsonl[.gz|.zst] / .parquet files, globs or folders")
    opt.add_argument("--output", "-o", required=True, help="dataset folder, or s3://, gs:// or az://bucket/prefix, to write")
    opt.add_argument("--tokenizer", default=DEFAULT_TOKENIZER,
                     help="simple (byte-level) | path/to/tokenizer.json | folder holding one | file.tiktoken")
    opt.add_argument("--tokenizer-backend", choices=("auto", "tokenizers", "tiktoken", "fastokens", "gigatoken"), default=None,
                     help="engine that encodes a BPE vocabulary; all give the same ids (default: auto, the fastest "
                          "verified token-identical one installed, or $LLM_TOKENIZER_BACKEND)")
    opt.add_argument("--num-workers", type=int, default=None, help="worker processes (default: all cores)")
    opt.add_argument("--text-column", default="text", help="JSON key / parquet column holding the text")
    opt.add_argument("--chunk-bytes", default="64MB", help="target shard size")
    opt.add_argument("--mode", choices=("append", "overwrite"), default=None,
                     help="when the output folder already holds a dataset (default: refuse)")
    opt.add_argument("--overwrite", action="store_true",
                     help="the same as --mode overwrite: replace the dataset, and start the --dedup stage over")
    opt.add_argument("--compression", choices=("zstd",), default=None, help="compress shards (default: none)")
    opt.add_argument("--no-progress", action="store_true", help="no progress bar")
    opt.add_argument("--wait", action="store_true", help="if another run is writing the output, wait for it (default: fail at once)")
    opt.add_argument("--allow-empty", action="store_true",
                     help="write an empty dataset when the inputs hold no record (default: an error naming them)")
    opt.add_argument("--engine", choices=("local", "ray"), default="local",
                     help="run tasks in local processes, or as Ray tasks (pip install 'llm-stream-data[ray]'; docs/items.md)")
    opt.add_argument("--ray-address", default=None, help="with --engine ray: the cluster to join (default: start a local one)")
    opt.add_argument("--dedup", default=None, metavar="exact|near=T",
                     help="first remove duplicate records (llm-data dedup): exact, or near=0.8 for near duplicates too")

    dataset_help = ("a dataset made by `llm-data optimize` (a folder, s3://, gs:// or "
                    "az://bucket/prefix, or local:/path), or a LitData / MDS folder")
    info = add("info", "summarize a dataset: kind, shards, tokens, documents, sizes, tokenizer", _INFO_EPILOG)
    info.add_argument("dataset", metavar="DATASET", help=dataset_help)
    info.add_argument("--json", action="store_true", help="print the manifest summary as JSON instead")

    verify = add("verify", "check every shard's size and checksum against the manifest", _VERIFY_EPILOG)
    verify.add_argument("dataset", metavar="DATASET", help=dataset_help)

    cache = add("cache", "list or clear the local shard cache of remote datasets", _CACHE_EPILOG)
    actions = cache.add_subparsers(dest="action", required=True, metavar="ACTION")
    root_help = "cache root, the cache_dir given to StreamingDataset (default: $LLM_CACHE_DIR/shards, else ~/.cache/llm/shards)"
    ls = actions.add_parser("ls", help="list cache folders", formatter_class=HelpFormatter, epilog=_CACHE_EPILOG)
    ls.add_argument("--cache-dir", default=None, help=root_help)
    clear = actions.add_parser("clear", help="remove cache folders (never a shard in use)", formatter_class=HelpFormatter,
                               epilog=_CACHE_EPILOG)
    clear.add_argument("targets", nargs="*", metavar="FINGERPRINT|URL", help="what to remove, as `cache ls` shows it")
    clear.add_argument("--all", action="store_true", help="remove every cache folder under the cache root")
    clear.add_argument("--cache-dir", default=None, help=root_help)

    from llm.cli.audit import add_audit_command
    from llm.cli.dedup import add_dedup_command
    from llm.cli.inspect import add_commands  # `inspect` and `convert` live in cli/inspect.py
    from llm.cli.tokenizer import add_train_tokenizer_command

    add_commands(add)
    add_dedup_command(add)
    add_audit_command(add)
    add_train_tokenizer_command(add)
    return parser


def doubled_inputs(inputs: list[str], output: str, text_column: str) -> list[tuple[Path, str]]:
    """Inputs the dataset in `output` already holds, each with why we think so (for `--mode append`)."""
    from llm.data.inputs.readers import expand_inputs
    from llm.data.shards.format.manifest import INDEX_NAME, Manifest

    if not (Path(output) / INDEX_NAME).is_file():
        return []
    try:
        sources = Manifest.load(output).sources
    except ValueError:
        return []  # a damaged dataset: optimize itself says what is wrong
    doubled: list[tuple[Path, str]] = []
    for path in expand_inputs(inputs):
        size = path.stat().st_size
        for source in sources:
            if source.get("text_column", text_column) != text_column:
                continue
            held = Path(str(source.get("path", "")))
            if "content_xxh3_128" in source:
                if source["content_xxh3_128"] == _content_digest(path):
                    doubled.append((path, "same content"))
                    break
            elif int(source.get("bytes", -1)) == size and (
                held.name == path.name or held.resolve() == path.resolve()
            ):
                doubled.append((path, "same name and size"))
                break
    return doubled


def _content_digest(path: Path) -> str:
    import xxhash

    h = xxhash.xxh3_128()
    with open(path, "rb") as f:
        while block := f.read(1 << 20):
            h.update(block)
    return h.hexdigest()


def _optimize(args: argparse.Namespace) -> None:
    from llm.data.shards.prepare.optimize_text import optimize_text

    expect_folder(args.output, "--output")
    if args.overwrite:  # the flag the dedup stage's messages name, as `llm-data dedup` has it
        if args.mode == "append":
            raise ValueError("--overwrite replaces the dataset and --mode append adds to it; pass one of them")
        args.mode = "overwrite"
    # Found before the append (which records them again), said after it: a refused run stays one sentence.
    doubled = doubled_inputs(args.inputs, args.output, args.text_column) if args.mode == "append" else []
    if args.dedup is not None:
        from llm.cli.dedup import dedup_before_optimize

        args.inputs = dedup_before_optimize(args)
    summary = optimize_text(
        args.inputs, args.output, args.tokenizer, num_workers=args.num_workers, text_column=args.text_column,
        chunk_bytes=args.chunk_bytes, mode=args.mode, compression=args.compression, progress=not args.no_progress,
        wait=args.wait, allow_empty=args.allow_empty, tokenizer_backend=args.tokenizer_backend,
        engine=args.engine, ray_address=args.ray_address,
    )
    if args.no_progress:  # with progress on, optimize() prints the summary itself
        print(summary.line(), file=sys.stderr)
    if isinstance(args.tokenizer, _Default):
        print("optimize: tokenizer simple (byte-level, the default: ids 0-255 are UTF-8 bytes, EOS 256); "
              "pass --tokenizer tokenizer.json for a BPE", file=sys.stderr)
    for path, why in doubled:
        print(f"llm-data: warning: {path} was already in {args.output} ({why}): its documents are now there "
              "twice; rebuild with --mode overwrite if that is not what you meant", file=sys.stderr)


def info_lines(manifest, folder: str) -> list[str]:
    """`llm-data info`'s readable summary of a loaded Manifest."""
    from llm.cli.inspect import dataset_lines, sources_row

    totals = manifest.totals()
    on_disk = totals["bytes"]
    raw = sum(s.raw_bytes or s.bytes for s in manifest.shards)
    codecs = sorted({s.compression for s in manifest.shards if s.compression})
    if codecs:
        compression = f"{', '.join(codecs)}, {raw / max(on_disk, 1):.2f}x ({format_size(raw)} raw)"
    else:
        compression = "none"
    rows = [("kind", f"{manifest.kind} (format v{manifest.format_version})"), ("shards", f"{totals['shards']:,}")]
    if manifest.kind == "tokens":
        rows += [("documents", f"{totals['documents']:,}"), ("tokens", f"{totals['tokens']:,}")]
    else:
        rows += [("items", f"{totals['items']:,}")]
    rows += [("on disk", format_size(on_disk)), ("compression", compression)]
    if manifest.encryption:  # whole shards (format/encryption.py): readers need the key
        rows.append(("encryption", f"{manifest.encryption.get('class')} ({manifest.encryption.get('level')} level)"))
    if manifest.dtype:
        rows.append(("dtype", manifest.dtype))
    if manifest.tokenizer:
        tok = dict(manifest.tokenizer)
        kind = tok.pop("type", "?")
        detail = ", ".join(f"{k} {v}" for k, v in tok.items())
        rows.append(("tokenizer", f"{kind} ({detail})" if detail else kind))
    if manifest.tokenizer_backend:
        rows.append(("encoded by", manifest.tokenizer_backend.replace(",", ", ")))
    if manifest.sources:
        rows.append(("sources", sources_row(manifest.sources)))
    rows.append(("fingerprint", manifest.fingerprint()))
    return dataset_lines(folder, rows)


def _info(dataset: str, as_json: bool) -> None:
    from llm.data.shards.format.remote import load_any
    from llm.data.shards.interop import open_peer

    source = open_peer(dataset)  # a peer's folder is described from its own index, checked against its files
    if source is not None:
        from llm.cli.inspect import peer_info

        peer_info(source, dataset, as_json)
        return
    manifest = load_any(dataset)  # a folder, local:, or s3://
    if as_json:
        data = manifest.to_json()
        data.pop("shards")
        print(json.dumps(data, indent=1))
    else:
        print("\n".join(info_lines(manifest, dataset)))


def _verify(dataset: str) -> None:
    from llm.cli.inspect import plural
    from llm.data.shards.format.pread import ShardError
    from llm.data.shards.format.remote import verify_any
    from llm.data.shards.format.validate import ManifestError
    from llm.data.shards.interop import open_peer

    try:
        source = open_peer(dataset)
        if source is not None:
            from llm.cli.inspect import peer_verify

            peer_verify(source, dataset)
            return
    except (ShardError, ManifestError) as e:  # the peer's folder is bad: exit 1, naming the file
        print(f"llm-data: verify: {e}", file=sys.stderr)
        raise SystemExit(1) from None
    manifest = verify_any(dataset)
    keyless = " (encrypted: sizes and checksums of the stored bytes; no key, so no layout check)" if manifest.encryption else ""
    print(f"verify: {plural(len(manifest.shards), 'shard')} OK in {dataset}{keyless}")


def _run(args: argparse.Namespace) -> int:
    if args.command == "cache":
        from llm.cli.cache import run_cache

        run_cache(args)
    elif args.command == "optimize":
        _optimize(args)
    elif args.command == "info":
        _info(args.dataset, args.json)
    elif args.command == "verify":
        _verify(args.dataset)
    elif args.command == "dedup":
        from llm.cli.dedup import run_dedup

        run_dedup(args)
    elif args.command == "train-tokenizer":
        from llm.cli.tokenizer import run_train_tokenizer

        run_train_tokenizer(args)
    elif args.command in ("inspect", "convert"):
        from llm.cli.inspect import run

        run(args)
    elif args.command == "audit":
        from llm.cli.audit import run_audit

        return run_audit(args)  # 1: the ledger shows samples repeated, lost or changed
    return 0


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        code = _run(args)
    except (ValueError, OSError, ImportError) as e:  # user mistakes (and --engine ray without Ray): one sentence
        print(f"llm-data: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("llm-data: interrupted; the dataset folder is unchanged", file=sys.stderr)
        return 130
    return code


if __name__ == "__main__":
    sys.exit(main())
