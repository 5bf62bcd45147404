"""What a dataset folder holds, measured: totals from its index, document lengths from its shards.

Works on our folders (local, `local:` or `s3://`) and on LitData / MDS folders. Lengths are
document lengths in tokens for token data, item sizes in bytes for item data; they come from
each shard's own offsets table, so nothing is decoded.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from llm.data.shards.format.manifest import Manifest
from llm.data.storage.paths import parse_location
from llm.data.storage.sizes import format_size


@dataclass
class DatasetStats:
    """A dataset's index facts plus the lengths measured in `shards_measured` of its shards."""

    location: str
    manifest: Manifest
    foreign: str | None  # "litdata" / "mds" for a peer's folder
    lengths: np.ndarray  # tokens per document (tokens) or bytes per item (items)
    shard_counts: np.ndarray  # tokens (or items) per shard, every shard
    shards_measured: int
    details: dict = field(default_factory=dict)  # a peer's format-specific facts (ForeignManifest.details)

    @property
    def length_unit(self) -> str:
        return "tokens" if self.manifest.kind == "tokens" else "bytes"

    def percentiles(self) -> dict[str, float]:
        """p50 / p90 / p99 / max / mean of the measured lengths (empty when none)."""
        if not len(self.lengths):
            return {}
        p50, p90, p99 = np.percentile(self.lengths, [50, 90, 99])
        return {"p50": float(p50), "p90": float(p90), "p99": float(p99),
                "max": float(self.lengths.max()), "mean": float(self.lengths.mean())}


def _our_lengths(manifest: Manifest, i: int, raw: np.ndarray) -> np.ndarray:
    info = manifest.shards[i]
    if manifest.kind == "tokens":
        start = info.tokens * np.dtype(info.dtype or manifest.dtype).itemsize
        ends = raw[start : start + 8 * info.documents].view("<u8").astype(np.int64)
        return np.diff(ends, prepend=0)
    offsets = raw[len(raw) - 8 * (info.items + 1) :].view("<u8").astype(np.int64)
    return np.diff(offsets)


def _remote_raw(objects: object, manifest: Manifest, i: int) -> np.ndarray:
    info = manifest.shards[i]
    stored = objects.get(info.file)  # type: ignore[attr-defined]
    if info.compression:
        import zstandard

        stored = zstandard.ZstdDecompressor().decompress(stored, max_output_size=info.raw_bytes)
    return np.frombuffer(stored, np.uint8)


def collect_stats(dataset: str | Path, storage_options: dict | None = None, max_shards: int | None = None) -> DatasetStats:
    """Totals and document lengths of a dataset; lengths from its first `max_shards` shards (all: None)."""
    from llm.data.shards.interop import open_in_place

    foreign_source = open_in_place(str(dataset))  # an olmo: spec is no path
    location = parse_location(dataset) if foreign_source is None else None
    if foreign_source is not None:
        manifest = foreign_source.manifest
    elif location.is_remote:
        from llm.data.shards.format.remote import load_manifest

        manifest, objects = load_manifest(location, storage_options)

        def raw(i: int) -> np.ndarray:
            return _remote_raw(objects, manifest, i)
    else:
        from llm.data.shards.interop import open_foreign

        folder = location.local_path()
        foreign_source = open_foreign(folder)
        if foreign_source is not None:
            manifest = foreign_source.manifest
        else:
            from llm.data.shards.format.reader import _ShardBytes

            manifest = Manifest.load(folder)
            files = _ShardBytes(folder, manifest, verify=False)
            raw = files.raw
    n = len(manifest.shards) if max_shards is None else min(max_shards, len(manifest.shards))
    parts = []
    for i in range(n):
        if foreign_source is not None:
            parts.append(foreign_source.item_sizes(i).astype(np.int64))
        else:
            parts.append(_our_lengths(manifest, i, raw(i)))
    key = "tokens" if manifest.kind == "tokens" else "items"
    counts = np.array([getattr(s, key) for s in manifest.shards], dtype=np.int64)
    lengths = np.concatenate(parts) if parts else np.zeros(0, np.int64)
    foreign = foreign_source.manifest if foreign_source is not None else None  # a ForeignManifest
    if foreign is None:
        return DatasetStats(str(dataset), manifest, None, lengths, counts, n)
    return DatasetStats(str(dataset), manifest, foreign.foreign_format or None, lengths, counts, n, dict(foreign.details))


def summary_rows(stats: DatasetStats) -> list[tuple[str, str]]:
    """(label, value) rows of `llm-data inspect`: what the index says, then the measured lengths."""
    m = stats.manifest
    totals = m.totals()
    on_disk = totals["bytes"]
    raw = sum(s.raw_bytes or s.bytes for s in m.shards)
    codecs = sorted({s.compression for s in m.shards if s.compression})
    rows = [("format", f"{stats.foreign} (read in place)" if stats.foreign else f"llm v{m.format_version}"),
            ("kind", m.kind), ("shards", f"{totals['shards']:,}")]
    if m.kind == "tokens":
        rows += [("tokens", f"{totals['tokens']:,}"), ("documents", f"{totals['documents']:,}")]
    else:
        rows += [("items", f"{totals['items']:,}")]
    rows += [("on disk", f"{format_size(on_disk)} ({on_disk:,} bytes)"), ("raw", f"{format_size(raw)} ({raw:,} bytes)")]
    rows.append(("compression", f"{', '.join(codecs)}, {raw / max(on_disk, 1):.2f}x" if codecs else "none"))
    rows.append(("dtype", str(m.dtype or "-")))
    if m.tokenizer:
        tok = dict(m.tokenizer)
        kind = tok.pop("type", "?")
        rows.append(("tokenizer", f"{kind} ({', '.join(f'{k} {v}' for k, v in tok.items())})" if tok else kind))
    else:
        rows.append(("tokenizer", "not recorded"))
    for key, value in stats.details.items():
        rows.append((key.replace("_", " "), str(value)))
    rows.append(("fingerprint", m.fingerprint()))
    what = "document length" if m.kind == "tokens" else "item size"
    pct = stats.percentiles()
    if pct:
        where = "" if stats.shards_measured == len(m.shards) else f", {stats.shards_measured} of {len(m.shards)} shards"
        rows.append((f"{what} ({stats.length_unit}{where})",
                     f"p50 {pct['p50']:,.0f}  p90 {pct['p90']:,.0f}  p99 {pct['p99']:,.0f}  max {pct['max']:,.0f}  mean {pct['mean']:,.1f}"))
    return rows


def summary_json(stats: DatasetStats) -> dict:
    """`llm-data inspect --json`: the same facts as `summary_rows`, numbers as numbers (no formatting)."""
    m = stats.manifest
    totals = m.totals()
    raw = sum(s.raw_bytes or s.bytes for s in m.shards)
    codecs = sorted({s.compression for s in m.shards if s.compression})
    counts = {k: totals[k] for k in (("tokens", "documents") if m.kind == "tokens" else ("items",))}
    return {
        "format": stats.foreign or "llm", "format_version": None if stats.foreign else m.format_version,
        "kind": m.kind, "shards": totals["shards"], **counts,
        "bytes_on_disk": totals["bytes"], "bytes_raw": raw,
        "compression": ", ".join(codecs) if codecs else None,
        "compression_ratio": round(raw / max(totals["bytes"], 1), 4),
        "dtype": m.dtype, "tokenizer": dict(m.tokenizer) if m.tokenizer else None,
        "details": dict(stats.details), "fingerprint": m.fingerprint(),
        "totals": totals,
        "lengths": {"unit": stats.length_unit, "shards_measured": stats.shards_measured, **stats.percentiles()},
    }


