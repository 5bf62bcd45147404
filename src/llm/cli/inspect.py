"""`llm-data inspect` (a dataset's facts and length percentiles, `--plot`) and `llm-data convert`."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from typing import Any

_INSPECT_EPILOG = """examples:
  llm-data inspect data/ds                      # ours: index facts + document length percentiles
  llm-data inspect s3://bucket/ds --shards 8    # lengths from the first 8 shards (downloaded)
  llm-data inspect litdata_out/ --plot ds.png   # a LitData or MDS folder works too
  llm-data inspect data/ds --json"""

_CONVERT_EPILOG = """examples:
  llm-data convert litdata_out/ data/ds         # a LitData folder -> ours
  llm-data convert mds_out/ data/ds --compression zstd
  llm-data convert megatron/corpus_text_document --output data/ds        # a Megatron prefix (or folder) -> ours
  llm-data convert olmo:uint32:eos=50279:/data/olmo/ --output data/ds     # OLMo-core token files -> ours
  llm-data convert data/ds --output out/corpus --format megatron        # -> out/corpus.bin + .idx
  llm-data convert data/ds --output out/olmo --format olmo --eos-id 0   # -> out/olmo/part-*.npy

Not needed to stream a LitData / MDS / Megatron folder or OLMo files (StreamingDataset reads them in place); use it
for folders with formats read only by the peer (docs/interop.md), or to get our checksums
and our block layout (blocks across shards, no per-chunk tail dropped)."""


def plural(n: int, word: str) -> str:
    """`1 shard`, `2 shards`, `1,000 shards`: counts in CLI output."""
    return f"{n:,} {word}{'' if n == 1 else 's'}"


def dataset_lines(dataset: str, rows: list[tuple[str, str]]) -> list[str]:
    """`dataset DATASET`, then one aligned `key  value` line per row (info and inspect)."""
    width = max(len(k) for k, _ in rows)
    return [f"dataset {dataset}"] + [f"  {k.ljust(width)}  {v}" for k, v in rows]


def add_commands(add: Callable[[str, str, str], argparse.ArgumentParser]) -> None:
    """Register `inspect` and `convert` with llm-data's sub-command factory."""
    ins = add("inspect", "describe a dataset: totals, sizes, dtype, tokenizer, fingerprint, length percentiles",
              _INSPECT_EPILOG)
    ins.add_argument("dataset", metavar="DIR", help="our folder, local:/..., s3://, gs:// or az://..., or a LitData / MDS folder")
    ins.add_argument("--plot", metavar="PNG", help="also draw document lengths and tokens per shard (matplotlib)")
    ins.add_argument("--shards", type=int, default=None,
                     help="measure lengths in the first N shards only (default: all; 16 in object storage)")
    ins.add_argument("--json", action="store_true", help="print the summary as JSON")
    conv = add("convert", "rewrite a LitData, MDS or Megatron folder or OLMo token files as an llm dataset, "
               "or a token dataset as Megatron .bin/.idx or OLMo token files", _CONVERT_EPILOG)
    conv.add_argument("src", metavar="SRC", help="a LitData, MDS or Megatron folder, a Megatron prefix, an olmo: spec; "
                      "with --format megatron/olmo any token dataset")
    conv.add_argument("dst", metavar="DST", nargs="?", default=None,
                      help="dataset folder, or s3://, gs:// or az://bucket/prefix, to write (or --output)")
    conv.add_argument("--output", metavar="OUT", default=None, help="where to write (the same as DST)")
    conv.add_argument("--format", choices=("llm", "megatron", "olmo"), default="llm",
                      help="what to write: our shards (default), a Megatron PREFIX.bin/.idx, or OLMo token files in a folder")
    conv.add_argument("--eos-id", type=int, default=None, help="--format olmo: the EOS id (default: the dataset's)")
    conv.add_argument("--num-workers", type=int, default=None, help="worker processes (default: all cores)")
    conv.add_argument("--chunk-bytes", default="64MB", help="target shard size")
    conv.add_argument("--compression", choices=("zstd",), default=None, help="compress shards (default: none)")
    conv.add_argument("--mode", choices=("append", "overwrite"), default=None,
                      help="when DST already holds a dataset (default: refuse)")
    conv.add_argument("--no-progress", action="store_true", help="no progress bar")


def run(args: argparse.Namespace) -> None:
    """Run `inspect` or `convert`."""
    if args.command == "convert":
        from llm.data.shards.interop.convert import convert

        if (args.dst is None) == (args.output is None):
            raise ValueError("convert: give where to write once, as DST or --output")
        dst = args.dst if args.dst is not None else args.output
        if args.format != "llm":
            _export(args, dst)
            return
        summary = convert(args.src, dst, num_workers=args.num_workers, chunk_bytes=args.chunk_bytes,
                          compression=args.compression, mode=args.mode, progress=not args.no_progress)
        if args.no_progress:  # with progress on, optimize() has printed this summary already
            print(f"convert: {args.src}: {summary.line()}", file=sys.stderr)
        return
    inspect(args.dataset, plot=args.plot, max_shards=args.shards, as_json=args.json)


def _export(args: argparse.Namespace, dst: str) -> None:
    """`convert --format megatron|olmo`: a token dataset written for Megatron / NeMo or OLMo-core."""
    from llm.data.shards.interop.export import to_megatron, to_olmo

    overwrite = args.mode == "overwrite"
    if args.format == "megatron":
        done = to_megatron(args.src, dst, overwrite=overwrite)
        print(f"convert: {args.src} -> {done['bin']} + {done['idx']}: {plural(done['documents'], 'document')}, "
              f"{done['tokens']:,} tokens ({done['dtype']})", file=sys.stderr)
        return
    done = to_olmo(args.src, dst, eos_id=args.eos_id, overwrite=overwrite)
    print(f"convert: {args.src} -> {plural(done['files'], 'file')} in {dst}: {plural(done['documents'], 'document')}, "
          f"{done['tokens']:,} tokens ({done['dtype']}); read them as {done['spec']}", file=sys.stderr)


def inspect(dataset: str, plot: str | None = None, max_shards: int | None = None, as_json: bool = False) -> dict[str, Any]:
    """Print a dataset's summary (and draw `plot`); returns it as a dict."""
    from llm.data.shards.interop.stats import collect_stats, summary_json, summary_rows
    from llm.data.storage.paths import parse_location

    if max_shards is not None and max_shards < 1:
        raise ValueError(f"--shards must be at least 1, got {max_shards}")
    if max_shards is None and not dataset.startswith("olmo:") and parse_location(dataset).is_object_store:
        max_shards = 16  # every measured shard is downloaded
    stats = collect_stats(dataset, max_shards=max_shards)
    data = {"dataset": dataset, **summary_json(stats)}
    if as_json:
        print(json.dumps(data, indent=1))
    else:
        print("\n".join(dataset_lines(dataset, summary_rows(stats))))
    if plot:
        draw(stats, plot)
        print(f"inspect: plot written to {plot}", file=sys.stderr)
    return data


def length_axis(lengths: Any) -> tuple[str, Any]:
    """(x scale, bin edges) for the length histogram: log across decades, linear when the range is narrow.

    Nearly constant lengths on a log axis crowd their ticks into one unreadable spot.
    """
    import numpy as np

    lo, hi = float(lengths.min()), float(lengths.max())
    if hi < 10 * max(lo, 1):
        if hi - lo <= 50:  # one bar per length, centred on it (one bar when all are equal)
            return "linear", np.arange(lo - 0.5, hi + 1.0)
        return "linear", np.linspace(lo, hi, 51)
    return "log", np.unique(np.geomspace(max(lo, 1), hi, 50).round())


def label_heights(values: list[float]) -> list[float]:
    """Heights (fractions of the axis) of the percentile labels: one row each, top down, so they never overlap."""
    return [0.97 - 0.09 * k for k in range(len(values))]


def draw(stats: Any, path: str) -> None:
    """Two panels: the histogram of document lengths (log x unless the range is narrow), and tokens (items) per shard."""
    try:
        import matplotlib
    except ImportError:
        raise ValueError("--plot needs matplotlib: pip install matplotlib") from None
    import numpy as np

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    what = "tokens" if stats.manifest.kind == "tokens" else "items"
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    lengths = stats.lengths[stats.lengths > 0]
    if len(lengths):
        scale, bins = length_axis(lengths)
        left.hist(lengths, bins=bins, color="#4c72b0")
        left.set_xscale(scale)
        pct = stats.percentiles()
        marks = [(name, pct[name]) for name in ("p50", "p90", "p99")]
        top, (x0, x1) = left.get_ylim()[1], left.get_xlim()
        middle = np.sqrt(x0 * x1) if scale == "log" else (x0 + x1) / 2
        for (name, value), height in zip(marks, label_heights([v for _, v in marks])):
            left.axvline(value, color="#c44e52", linestyle=":", linewidth=1)
            left.text(value, top * height, f" {name} {value:,.0f} ", va="top", fontsize=8,
                      ha="right" if value > middle else "left",  # inside the axes, on the free side of its line
                      bbox={"facecolor": "white", "alpha": 0.8, "edgecolor": "none", "pad": 1})
    left.set_xlabel(f"{'document length' if what == 'tokens' else 'item size'} ({stats.length_unit})")
    left.set_ylabel("count")
    left.set_title(f"{len(stats.lengths):,} {'documents' if what == 'tokens' else 'items'}")
    right.bar(np.arange(len(stats.shard_counts)), stats.shard_counts, width=1.0, color="#55a868")
    right.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))  # shard numbers, not 0.5 steps
    right.set_xlabel("shard")
    right.set_ylabel(f"{what} per shard")
    right.set_title(f"{len(stats.shard_counts):,} shards, {int(stats.shard_counts.sum()):,} {what}")
    fig.suptitle(str(stats.location))
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def peer_info_lines(source, folder: str) -> list[str]:
    """`llm-data info` of a LitData / MDS folder: what its index says, its counts checked against its files."""
    from llm.data.storage.sizes import format_size

    m = source.manifest
    totals = m.totals()
    stored, raw = totals["bytes"], sum(s.raw_bytes or s.bytes for s in m.shards)
    name = {"litdata": "LitData folder", "mds": "MosaicML MDS folder", "megatron": "Megatron indexed dataset (.bin/.idx)",
            "olmo": "OLMo-core token files"}.get(m.foreign_format, m.foreign_format)
    unit = {"litdata": "chunk", "megatron": ".bin file", "olmo": "file"}.get(m.foreign_format, "shard")
    rows = [("format", f"{name} (read in place; `llm-data convert` rewrites it as ours)"),
            ("kind", m.kind), (f"{unit}s", f"{totals['shards']:,}")]
    if m.kind == "tokens":
        rows += [("documents", f"{totals['documents']:,}"), ("tokens", f"{totals['tokens']:,}"), ("dtype", str(m.dtype))]
    else:
        rows += [("items", f"{totals['items']:,}")]
    codecs = sorted({s.compression for s in m.shards if s.compression})
    rows += [("on disk", f"{format_size(stored)} in {plural(totals['shards'], 'file')}"),
             ("compression", f"{', '.join(codecs)}, {format_size(raw)} raw" if codecs else "none")]
    rows += [(key.replace("_", " "), _listed(value)) for key, value in m.details.items()]
    rows.append(("fingerprint", m.fingerprint()))
    return dataset_lines(folder, rows)


def _listed(value: object) -> str:
    """A peer's index detail as text: a list or a column -> encoding mapping, comma separated."""
    if isinstance(value, dict):
        return ", ".join(f"{k} {v}" for k, v in value.items())
    if isinstance(value, list):
        return ", ".join(str(v) for v in value)
    return str(value)


def peer_info(source: Any, dataset: str, as_json: bool) -> None:
    """`llm-data info` of a LitData / MDS folder, as text or JSON."""
    m = source.manifest
    data = {"format": m.foreign_format, "kind": m.kind, "dtype": m.dtype, "totals": m.totals(),
            "raw_bytes": sum(s.raw_bytes or s.bytes for s in m.shards), "details": m.details,
            "fingerprint": m.fingerprint()}
    print(json.dumps(data, indent=1) if as_json else "\n".join(peer_info_lines(source, dataset)))


def peer_verify(source: Any, dataset: str) -> None:
    """`llm-data verify` of a LitData / MDS folder: every file read and checked (raises ShardError)."""
    source.verify()
    m = source.manifest
    unit = {"litdata": "chunk", "megatron": ".bin file", "olmo": "file"}.get(m.foreign_format, "shard")
    checked = {"megatron": "the .idx's counts, lengths, pointers and document indices against each .bin",
               "olmo": "sizes against the dtype"}.get(m.foreign_format, "sizes, counts, offsets")
    checked += ", hashes" if m.foreign_format == "mds" else ""
    checked += ", every item decoded" if m.kind == "items" else ""
    print(f"verify: {plural(len(m.shards), unit)} OK in {dataset} ({m.foreign_format}: {checked})")


_COMPRESSED_INPUTS = (".zst", ".zstd", ".gz", ".bz2", ".xz")


def sources_row(sources: list[dict]) -> str:
    """What the manifest knows of its inputs: files and their stored sizes (compressed inputs said so), or peers converted."""
    from llm.data.storage.sizes import format_size

    peers = [s for s in sources if "format" in s and "bytes" not in s]  # `llm-data convert` records no text size
    files = [s for s in sources if s not in peers]
    parts = [f"converted from {s['format']} folder {s.get('path', '?')}" for s in peers]
    if files:
        stored = sum(int(s.get("bytes", 0)) for s in files)
        packed = sum(str(s.get("path", "")).endswith(_COMPRESSED_INPUTS) for s in files)
        what = f"{plural(len(files), 'file')}, {format_size(stored)} as stored"
        parts.append(what + (f" ({packed} compressed: the text itself is larger)" if packed else ""))
    return "; ".join(parts)
