"""`llm-train why` and `llm-train spikes`: what a step trained on, and which steps' loss jumped, from the ledger.

Each row is named as the workers read it: its source, for a token shard the sample index, the shard
file and token offset it lives in, and every document the block holds (a document starts where the
position ids restart) with its token range and a decoded preview (the run's tokenizer, from the
checkpoint's config); for text, the file and record with the token range of the document. A step is
counted as the log counts it: trained batches only, so a skipped batch (`data.skip_batches`) has no
step of its own.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import numpy as np

from llm.data.ledger.reader import Ledger
from llm.data.shards.format.loaders import TokensLoader
from llm.data.shards.read.dataset import StreamingDataset
from llm.data.shards.read.skips import document_start
from llm.data.skip_documents import SKIPPED
from llm.training.generate import _tokenizer_spec
from llm.training.metrics import read_metrics
from llm.training.run_audit import RunView


def trained_steps(ledger: Ledger) -> np.ndarray:
    """The ledger steps that were trained, in order: training step k is the k-th of them."""
    return np.unique(ledger.rows["step"][ledger.trained]).astype(np.int64)


def _ranges(steps: np.ndarray) -> str:
    if not len(steps):
        return "none"
    breaks = np.flatnonzero(np.diff(steps) != 1)
    starts, ends = np.r_[steps[0], steps[breaks + 1]], np.r_[steps[breaks], steps[-1]]
    return ", ".join(f"{a}" if a == b else f"{a}-{b}" for a, b in zip(starts.tolist(), ends.tolist()))


class RowNamer:
    """Turns ledger rows into lines: the data re-opened once per source, the tokenizer loaded once."""

    def __init__(self, view: RunView, preview: int):
        self.view, self.ledger, self.preview = view, view.ledger, preview
        self._datasets: dict[int, Any] = {}
        self._tokenizer: Any = None
        self._auditor: Any = None  # the text sources read again, for FILE:LINE and previews (opened once)

    def tokenizer(self) -> Any:
        if self._tokenizer is None:
            from llm.data.tokenize.tokenizers import load_tokenizer

            self._tokenizer = load_tokenizer(_tokenizer_spec(self.view.config, self.view.checkpoint))
        return self._tokenizer

    def dataset(self, source: int) -> Any:
        """The token-shard source with document boundaries (None: not token shards, or gone from disk)."""
        if source not in self._datasets:
            info, ds = self.ledger.sources[source] if source < len(self.ledger.sources) else {}, None
            if info.get("block_size"):
                try:
                    ds = StreamingDataset(info["path"], item_loader=TokensLoader(block_size=info["block_size"],
                                                                                 document_boundaries=True),
                                          shuffle=info.get("shuffle", False), seed=info.get("seed", 0),
                                          subsample=info.get("subsample", 1.0),
                                          drop_partial_block=bool(info.get("drop_partial_block", False)))
                except (OSError, ValueError):
                    ds = None  # named as unreadable in the row's line
            self._datasets[source] = ds
        return self._datasets[source]

    def text(self, ids: np.ndarray) -> str:
        if self.preview <= 0:
            return ""
        decoded = self.tokenizer().decode(int(t) for t in ids)
        decoded = decoded.replace("\n", "\\n")
        return f" {decoded[:self.preview]!r}" + ("..." if len(decoded) > self.preview else "")

    def record(self, source: int, name: str, item: int, held: tuple[int, int] | None) -> tuple[str, str]:
        """A text record as `why` names it (FILE:LINE in a plain line file, else FILE record N) and a preview of
        what the row holds of it, read again from the source as stored now (nothing when it cannot be read)."""
        plain = f"{name} record {item}"
        try:
            if self._auditor is None:
                from llm.data.text.ledger_audit import TextAuditor

                self._auditor = TextAuditor(self.ledger.sources)
            if not self._auditor.readable(source):
                return plain, ""
            at = self._auditor.where(name, item)
            text = self._auditor.documents(source, {(name, item)}).get((name, item))
        except (OSError, ValueError, KeyError, TypeError):
            return plain, ""  # a source gone or unreadable: the recorded name is all there is
        if text is None or self.preview <= 0:
            return at, ""
        stream = self.ledger.sources[source].get("stream") or {}
        if held is None or stream.get("rows") != "tokens":  # SFT, or a skipped record: the record's own text
            short = text.replace("\n", "\\n")
            return at, f" {short[:self.preview]!r}" + ("..." if len(short) > self.preview else "")
        from llm.data.tokenize.documents import encode_each

        ids = encode_each(self.tokenizer(), [text])[0]
        return at, self.text(ids[held[0]:held[1]])

    def source_name(self, source: int) -> str:
        sources = self.ledger.sources
        return str(sources[source].get("name")) if source < len(sources) else f"source {source}"

    def row_lines(self, r: int, indent: str = "  ") -> list[str]:
        """A row: its rank, position, loss and each piece (document or block) it holds."""
        row, ledger = self.ledger.rows[r], self.ledger
        loss = float(row["loss"])
        head = (f"{indent}rank {int(ledger.ranks[r])} row {int(row['row'])}: loss "
                + ("not recorded" if math.isnan(loss) else f"{loss:.4f}"))
        if len(ledger.skipped) == len(ledger.rows) and ledger.skipped[r]:
            head += " (skipped: read, not trained)"
        lines = [head]
        for p in ledger.pieces[ledger.pieces["row_ref"] == r]:
            lines += self.piece_lines(p, indent + "  ")
        return lines

    def piece_lines(self, p: np.void, indent: str) -> list[str]:
        source, item = int(p["source"]), int(p["item"])
        where = f"{self.source_name(source)} epoch {int(p['epoch'])}"
        by_id = int(p["start"]) == SKIPPED and int(p["end"]) == SKIPPED
        if int(p["name"]) >= 0:  # text: a document's token range, as its record was read; its id for skip_documents
            name = self.ledger.names[int(p["name"])]
            held = "skipped by id (data.skip_documents)" if by_id else f"tokens [{int(p['start'])}, {int(p['end'])})"
            at, preview = self.record(source, name, item, None if by_id else (int(p["start"]), int(p["end"])))
            return [f"{indent}{where} {at} {held} id {self.source_name(source)}:{name}:{item}{preview}"]
        if by_id:
            return [f"{indent}{where} sample {item}: skipped by id (data.skip_documents), not in this row"]
        ds = self.dataset(source)
        if ds is None:
            return [f"{indent}{where} sample {item} (its data cannot be opened to show more)"]
        block = ds.block_size
        start = int(ds.to_base(np.array([item]))[0]) * block
        starts = ds.reader.starts
        shard = int(np.searchsorted(starts, start, side="right") - 1)
        lines = [f"{indent}{where} sample {item}: shard {ds.manifest.shards[shard].file} token offset "
                 f"{start - int(starts[shard])} (tokens [{start}, {start + block}) of the dataset)"]
        read = ds.read_blocks(np.array([item]))
        tokens, positions = read["input_ids"][0], read["position_ids"][0]
        doc_starts = np.r_[0, np.flatnonzero(positions[1:] <= positions[:-1]) + 1]
        for a, b in zip(doc_starts.tolist(), [*doc_starts[1:].tolist(), len(tokens)]):
            # a block's position ids count from its own start: whether its first piece starts a document
            # is told by the token before the block (an end of text, or none)
            whole = a > 0 or self._starts_document(ds, start)
            part = "a document from its start" if whole else "the rest of a document begun before the block"
            doc = document_start(ds, start + a)
            named = f" id {self.source_name(source)}@{doc}" if doc is not None else ""
            lines.append(f"{indent}  tokens [{a}, {b}): {part}{named}{self.text(tokens[a:b])}")
        return lines


    @staticmethod
    def _starts_document(ds: Any, start: int) -> bool:
        if start == 0:
            return True
        before = np.empty(1, ds.token_dtype)
        ds.reader.read(start - 1, start, before, None)
        return ds.manifest.eos_id is not None and int(before[0]) == int(ds.manifest.eos_id)


def _rows_of(ledger: Ledger, step: int, rank: int | None) -> np.ndarray:
    mask = ledger.rows["step"] == step
    if rank is not None:
        mask &= ledger.ranks == rank
    return np.flatnonzero(mask)


def why(view: RunView, step: int, rank: int | None = None, preview: int = 80) -> list[str]:
    """Every row of training step `step` (all ranks, or `rank`), with its documents."""
    ledger, steps = view.ledger, trained_steps(view.ledger)
    if not 1 <= step <= len(steps):
        raise ValueError(f"step {step} is not in ledger {ledger.folder}: it holds training steps 1-{len(steps)} "
                         f"(ledger steps {_ranges(steps)})" if len(steps) else f"ledger {ledger.folder} holds no step")
    at = int(steps[step - 1])
    rows = _rows_of(ledger, at, rank)
    if not len(rows):
        ranks = sorted(set(ledger.ranks[_rows_of(ledger, at, None)].tolist()))
        raise ValueError(f"step {step} has no row of rank {rank} in ledger {ledger.folder}; it holds ranks {ranks}")
    namer = RowNamer(view, preview)
    lines = [f"step {step} (batch {at - 1} of the run, {len(rows)} rows)"]
    for r in rows.tolist():
        lines += namer.row_lines(r)
    return lines


def _moving_median_jumps(values: np.ndarray, window: int) -> np.ndarray:
    """Each value minus the median of the `window` values before it (NaN before there are 3)."""
    out = np.full(len(values), np.nan)
    for i in range(len(values)):
        before = values[max(0, i - window):i]
        before = before[~np.isnan(before)]
        if len(before) >= 3 and not np.isnan(values[i]):
            out[i] = values[i] - np.median(before)
    return out


def step_losses(view: RunView) -> tuple[np.ndarray, np.ndarray, str]:
    """(training steps, their loss, where from): the ledger's per-row losses when recorded, else metrics.jsonl."""
    ledger, steps = view.ledger, trained_steps(view.ledger)
    losses = ledger.rows["loss"].astype(np.float64)
    kept = ledger.trained & ~np.isnan(losses)
    if kept.any():
        index = np.searchsorted(steps, ledger.rows["step"][kept].astype(np.int64))
        sums, counts = np.bincount(index, losses[kept], len(steps)), np.bincount(index, None, len(steps))
        with np.errstate(invalid="ignore"):
            return np.arange(1, len(steps) + 1), sums / counts, "per-row losses in the ledger"
    records = [r for r in read_metrics(view.checkpoint.parent) if "loss" in r and "event" not in r]
    return (np.array([r["step"] for r in records], np.int64), np.array([r["loss"] for r in records], np.float64),
            "metrics.jsonl")


def spikes(view: RunView, top: int = 5, window: int = 20, preview: int = 60) -> list[str]:
    """The `top` steps whose loss jumps most above the moving median of the `window` steps before, with documents."""
    steps, losses, origin = step_losses(view)
    jumps = _moving_median_jumps(losses, window)
    order = [i for i in np.argsort(-np.nan_to_num(jumps, nan=-np.inf)).tolist() if jumps[i] > 0][:top]
    if not order:
        return [f"no spike: no step's loss is above the median of the steps before it ({origin})"]
    lines = [f"loss spikes ({origin}; jump above the median of the {window} steps before):"]
    namer, at_steps = RowNamer(view, preview), trained_steps(view.ledger)
    for i in order:
        step = int(steps[i])
        lines.append(f"step {step}: loss {losses[i]:.4f}, {jumps[i]:+.4f} above its moving median")
        if not 1 <= step <= len(at_steps):
            continue
        rows = _rows_of(view.ledger, int(at_steps[step - 1]), None)
        by_loss = sorted(rows.tolist(), key=lambda r: -np.nan_to_num(float(view.ledger.rows["loss"][r]), nan=-1.0))
        for r in _first(by_loss, 3):
            lines += namer.row_lines(r, indent="    ")
    return lines


def _first(items: Iterable[int], n: int) -> list[int]:
    return list(items)[:n]
