"""The text module's side of the run ledger: each batch's rows as the workers packed them, committed with the state.

Workers send, with every batch, a PIECE table of what each row holds (text/provenance.py); the
module hands it here as it hands the batch to the caller (`record`), with the 32-bit checksum (by the
ledger's rule: ledger/format.py row_checksums, or a resumed version 1 ledger's) of each row's
`input_ids` as handed over. Records a dedup source dropped come as pieces with start == end == 0,
on the batch's first row. Nothing reaches the disk before `commit()`, which `state_dict()` and
`checkpoint_state()` call, so the ledger holds exactly the steps the saved state stands on.

The ledger header lists every source (`ledger_sources`) with what `llm-data audit` needs to read
its records again (text/ledger_audit.py): its files, text column and byte-range size, and its weight.
"""

from __future__ import annotations

import hashlib
import json
import os
from typing import Any

import numpy as np

from llm.data.inputs.dedup import DedupTextSource
from llm.data.inputs.local import LocalLineTextSource
from llm.data.inputs.mixture import DedupMixture, as_mixture
from llm.data.inputs.source import Partition, TextSource
from llm.data.ledger.format import PIECE, ROW
from llm.data.ledger.writer import StageLedger, ledger_path


def ledger_sources(source: TextSource, names: list[str], weights: list[float] | None,
                   stream: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """The header's `sources`: per source its name, weight, fingerprint and how to read its records again.

    `stream`: how rows were made from records (tokenizer, max_seq_len, eos_id, rows: "tokens" or
    "samples"), so the audit can rebuild a token row and compare its checksum."""
    mixture = as_mixture(source)
    dedup = source if isinstance(source, DedupTextSource) else None
    inner = mixture.sources if mixture is not None else [dedup.inner if dedup is not None else source]
    # a dedup source over one source, a dedup mixture's entries, or a mixture's own dedup entries
    deduped = set(range(len(inner))) if dedup is not None and mixture is None else \
        set(dedup.dedup_sources) if isinstance(dedup, DedupMixture) else set()
    spec = mixture_spec(source, stream)
    out = []
    for i, src in enumerate(inner):
        deduplicated = i in deduped or isinstance(src, DedupTextSource)
        src = src.inner if isinstance(src, DedupTextSource) and src.inner is not None else src
        entry: dict[str, Any] = {"name": names[i] if i < len(names) else f"source {i}", "type": "text",
                                 "weight": weights[i] if weights and i < len(weights) else None,
                                 "dedup": deduplicated, "fingerprint": src.source_fingerprint(), "stream": stream}
        if isinstance(src, LocalLineTextSource) and not src.uses_object_store:
            entry.update(kind="local", files=[str(f) for f in src.files],
                         paths=[os.path.abspath(str(f)) for f in src.files],
                         text_column=src.text_column, partition_bytes=src.partition_bytes)
        else:  # the audit reads an object store's or a Hugging Face dataset's records again from its fingerprint
            fp = entry["fingerprint"]
            entry["kind"] = "object" if isinstance(src, LocalLineTextSource) else "hf" if fp.get("type") == "hf" else "other"
        if spec is not None:
            entry["mixture"] = spec
        out.append(entry)
    return out


def mixture_spec(source: TextSource, stream: dict[str, Any] | None) -> dict[str, Any] | None:
    """A text mixture's weights, schedule, strategy and unit, for the audit's shares per phase (ledger/shares.py)."""
    mixture = as_mixture(source)
    if mixture is None:
        return None
    return {"weights": list(mixture.weights), "schedule": mixture.schedule.as_list() if mixture.schedule else None,
            "strategy": mixture.strategy, "unit": mixture.unit,
            "tokens_per_sample": (stream or {}).get("max_seq_len")}  # a step's tokens: its rows x max_seq_len



def stream_info(tokenizer: Any, max_seq_len: int, tokens: bool) -> dict[str, Any]:
    """How rows are made, for the audit: token rows (packed windows) it rebuilds, or samples (SFT) it does not."""
    return {"tokenizer": str(tokenizer.path or "simple"), "tokenizer_fingerprint": tokenizer.fingerprint(),
            "max_seq_len": max_seq_len, "eos_id": tokenizer.eos_id, "rows": "tokens" if tokens else "samples"}


def run_id(fingerprint: dict, seed: int, folder: str | os.PathLike) -> str:
    """A fresh run's id that every rank computes alike (a second fresh run in one folder is refused anyway)."""
    key = f"{json.dumps(fingerprint, sort_keys=True, default=str)}:{seed}:{os.path.abspath(folder)}".encode()
    return hashlib.blake2b(key, digest_size=8).hexdigest()


class TextLedger(StageLedger):
    """Records the batches one rank's text module hands over; opened at the first iteration or commit.

    The last step recorded is held back until the next one (or the commit), so records a dedup
    source dropped after the last row of a pass still join a step before it is written.
    """

    def __init__(self, folder: str | os.PathLike, sources: list[dict[str, Any]], run: str):
        super().__init__(folder, sources, run)
        self._held: tuple[int, np.ndarray, np.ndarray] | None = None
        self._held_skipped = False  # the held step was read, not trained (data.skip_batches)
        self._dropped: list[np.ndarray] = []

    def resume_from(self, state: dict[str, Any] | None) -> None:
        super().resume_from(state)
        self._held, self._dropped, self._held_skipped = None, [], False

    def open(self, rank: int, topology: dict[str, Any]) -> None:
        """Start recording; a mixture's weights and schedule join the topology (a resume may change them)."""
        mixture = next((s["mixture"] for s in self.writer.sources if s.get("mixture")), None)
        super().open(rank, {**topology, "mixture": mixture} if mixture else topology)

    def _pieces(self, table: tuple[np.ndarray, list[str]]) -> np.ndarray:
        pieces, names = table
        pieces = np.asarray(pieces, PIECE).copy()
        if len(names):
            ids = np.array([self.writer.name_id(n) for n in names], np.int32)
            pieces["name"] = ids[pieces["name"]]
        return pieces

    def record(self, input_ids: Any, table: tuple[np.ndarray, list[str]]) -> None:
        """One batch handed to the caller: its rows' checksums and the pieces its worker packed."""
        ids = np.asarray(input_ids)
        rows = np.zeros(len(ids), ROW)
        rows["row"], rows["crc"], rows["loss"] = np.arange(len(ids)), self.checksum(ids), np.nan  # the ledger's rule
        self._flush()
        self.step += 1
        self._held = (self.step, rows, self._pieces(table))

    def set_loss(self, losses: Any) -> None:
        """Per-row losses of the batch handed over last (still held back), written with it."""
        if self._held is not None:
            rows = self._held[1]
            rows["loss"] = np.asarray(losses, np.float32).reshape(-1)[: len(rows)]

    def skip(self) -> None:
        """The batch handed over last was read but not trained (`data.skip_batches`)."""
        self._held_skipped = self._held is not None

    def dropped(self, table: tuple[np.ndarray, list[str]]) -> None:
        """Records dropped after a pass's last row: they join the step held back (or the next one)."""
        self._dropped.append(self._pieces(table))

    def _flush(self) -> None:
        if self._held is None:
            return
        step, rows, pieces = self._held
        if self._dropped:
            extra = np.concatenate(self._dropped)
            extra["row_ref"] = 0
            pieces, self._dropped = np.concatenate([pieces, extra]), []
        self.writer.record(step, rows, pieces)
        if self._held_skipped:
            self.writer.mark_skipped(step)
        self._held, self._held_skipped = None, False

    def commit(self, rank: int, topology: dict[str, Any], cursors: dict[str, dict], own: list[Partition]
               ) -> dict[str, Any]:
        """Write the steps since the last commit, with the records this rank's cursors hold in flight."""
        self.open(rank, topology)
        self._flush()
        return self.writer.commit(in_flight(cursors, own))


def in_flight(cursors: dict[str, dict], own: list[Partition]) -> list[list[Any]]:
    """[source, pass, name, record] of every document a cursor holds (greedy's token buffer, best fit's open
    blocks): read, not trained yet. The audit does not call them missing, nor their untrained tails."""
    out = []
    for part in own:
        cursor = cursors.get(part.key, {})
        docs = [*cursor.get("ledger_buffer", []), *(d for block in cursor.get("ledger_blocks", []) for d in block)]
        if "ledger_cutting" in cursor:
            docs.append(cursor["ledger_cutting"])
        out += [[part.source, int(cursor.get("pass", 0)), doc[0], doc[1]] for doc in docs if doc[0] is not None]
    return out


class LedgerHooks:
    """A text module's ledger: attached to it, and told by a trainer about the batch it handed over last."""

    _ledger: TextLedger | None

    def attach_ledger(self, folder: str | os.PathLike, run: str | None = None) -> None:
        """Record what each row handed over holds in the run ledger at `folder` (text/ledger.py), committed by
        `state_dict()`; `run`: one id on every rank (from the data, seed and folder when None)."""
        folder = ledger_path(folder)  # a wrong type is named here, not deep in os.path
        mixture = as_mixture(self.source)
        stream = stream_info(self.tokenizer, self.max_seq_len, tokens=self.batch_format() is None)
        sources = ledger_sources(self.source, self._source_names(), mixture.weights if mixture else [1.0], stream)
        self._ledger = TextLedger(folder, sources, run or run_id(self.source_fingerprint(), self.seed, folder))
        self._ledger.resume_from(self._ledger_state)  # a state loaded before this call resumes it

    def ledger_set_loss(self, losses: Any) -> None:
        """Per-row losses of the batch just trained (`checkpoint.ledger_loss`)."""
        if self._ledger is not None:
            self._ledger.set_loss(losses)

    def ledger_skip(self) -> None:
        """The batch handed over last was read and dropped, not trained (`data.skip_batches`)."""
        if self._ledger is not None:
            self._ledger.skip()
