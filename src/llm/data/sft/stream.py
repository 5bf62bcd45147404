"""Streaming fine-tuning data: dataset entries -> whole records -> collated samples, with the text stream's exact cursors.

An SFT stream reuses `StreamingTextDataModule` whole (partitions, workers, cursors,
resume on any topology); only the batch format differs: a record is one sample,
tokenized and masked by `StreamingDataCollator`, instead of tokens packed into blocks.
"""

from __future__ import annotations

import glob
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from llm.data.inputs.entries import entry_name
from llm.data.inputs.errors import InputError
from llm.data.inputs.hf import HFStreamTextSource
from llm.data.inputs.local import LocalLineTextSource
from llm.data.inputs.records import json_problem
from llm.data.inputs.source import TextSource
from llm.data.pack.best_fit import BestFitPacker, sample_slots
from llm.data.sft.collator import BatchRecordError, StreamingDataCollator
from llm.data.sft.prompts import prompter_for
from llm.data.text.stream import StreamingTextDataModule


class RecordCursor:
    """The cursor of one partition when each record is one sample (nothing is packed): after the last record fed."""

    def __init__(self, cursor: dict | None = None):
        cursor = cursor or {}
        self.offset = int(cursor.get("offset", 0))
        self.records = int(cursor.get("records", 0))
        self.tokens = int(cursor.get("tokens", 0))  # the samples' tokens, for a mixture of token shares
        self.done = bool(cursor.get("done", False))

    def feed(self, sample: Any, offset_after: int) -> Iterator[Any]:
        """The sample, as one row; a skipped one (None: nothing to train on) is consumed without a row."""
        if isinstance(sample, BadRecord):  # here the record's place is known: name its file and line
            raise InputError(f"{sample.entry}: the record at {where(sample.path, self.records + 1, offset_after)} "
                             f"{sample.reason}")
        self.offset, self.records = offset_after, self.records + 1
        self.tokens += sample_tokens(sample)
        if sample is not None:
            yield sample

    def finish(self) -> Iterator[Any]:
        self.done = True
        return iter(())

    def cursor(self) -> dict:
        return {"offset": self.offset, "records": self.records, "tokens": self.tokens, "token_buffer": [],
                "skip": 0, "done": self.done}


def sample_tokens(sample: Any) -> int:
    """A sample's tokens (its input_ids); 0 for a record with nothing to train on."""
    return len(sample[0]) if isinstance(sample, tuple) else 0


class BestFitRecords(BestFitPacker):
    """Best-fit packing of whole samples into rows of `max_length` tokens; `feed` yields the rows that go out."""

    def slots(self, sample: Any) -> int:
        return len(sample[0])

    def load_piece(self, raw: Any) -> tuple[list[int], list[int]]:
        return list(raw[0]), list(raw[1])

    def dump_piece(self, sample: Any) -> list[list[int]]:
        return [sample[0], sample[1]]  # the sample's own lists: nothing changes them

    def feed(self, sample: Any, offset_after: int) -> Iterator[Any]:
        if isinstance(sample, BadRecord):
            raise InputError(f"{sample.entry}: the record at {where(sample.path, self.records + 1, offset_after)} "
                             f"{sample.reason}")
        self._consumed(offset_after, sample_tokens(sample))
        if sample is not None:  # truncated to max_length already: a sample always fits a row
            yield from self._add(sample)


class BadRecord:
    """A record that cannot be a sample; its cursor raises, naming the file and line."""

    def __init__(self, entry: str, path: str, reason: str):
        self.entry, self.path, self.reason = entry, path, reason


def where(path: str, record: int, offset_after: int) -> str:
    """A record's place for a message: `FILE line N` in a line file (offsets are bytes), else its record number."""
    file = Path(path).expanduser()
    if file.is_file() and file.suffix.lower() in LINE_SUFFIXES:
        with open(file, "rb") as f:  # read only on an error: the line number costs one pass over the head
            head = f.read(offset_after)
        line = head.count(b"\n") + (0 if head.endswith(b"\n") else 1)
        return f"{file} line {line}"
    if file.is_file():
        return f"{file} record {record}"
    return f"{path}, record {record} of one of its files (ending at offset {offset_after})"


class SftSamples:
    """The batch format of fine-tuning: JSON records -> (input_ids, labels) samples -> a collated batch.

    One collator per dataset of a mixture (each has its own prompt format); they share
    the tokenizer and the padding settings, so the first one collates the batch.
    """

    def __init__(self, collators: list[StreamingDataCollator], entries: list[tuple[str, str]],
                 packing_buffer: int | None = None):
        self.collators = collators
        self.entries = entries  # (name for messages, path) per source
        self.packing_buffer = packing_buffer  # best fit: rows packed across batches from this many open rows

    def packer(self, cursor: dict | None) -> RecordCursor | BestFitRecords:
        if self.packing_buffer:
            return BestFitRecords(self.collators[0].max_length, self.packing_buffer, cursor)
        return RecordCursor(cursor)

    def encode(self, texts: list[str], sources: list[int]) -> list[Any]:
        """One sample per text: None where it has nothing to train on, a `BadRecord` where it is malformed."""
        out: list[Any] = [None] * len(texts)
        for s in sorted(set(sources)):
            at = [i for i, src in enumerate(sources) if src == s]
            for i, sample in zip(at, self._encode_source(s, [texts[i] for i in at])):
                out[i] = sample
        return out

    def _encode_source(self, s: int, texts: list[str]) -> list[Any]:
        """One source's records; the first bad one ends the list (its cursor raises before any later one)."""
        records = [self._parse(s, text) for text in texts]
        bad = next((k for k, r in enumerate(records) if isinstance(r, BadRecord)), len(records))
        try:
            return [*self.collators[s].encode_each(records[:bad]), *records[bad:bad + 1]]
        except BatchRecordError as e:
            good = self.collators[s].encode_each(records[: e.index])
            return [*good, BadRecord(*self.entries[s], f"does not fit type {e.kind}: {e.reason}")]

    def _parse(self, s: int, text: str) -> Any:
        try:
            record = json.loads(text)
        except json.JSONDecodeError as e:
            return BadRecord(*self.entries[s], f"is not JSON ({json_problem(e, column=False)}); fine-tuning records are JSON objects, "
                             "one per line of a .jsonl file or rows of a .json/.parquet file")
        if not isinstance(record, dict):
            return BadRecord(*self.entries[s], f"is a JSON {type(record).__name__}, expected an object of fields")
        return record

    def packed_rows(self, rows: list[Any]) -> list[int] | None:
        """Which row of the batch each sample goes in when the collator packs samples itself (sample_packing
        without best fit): the ledger's pieces name samples, the batch's rows hold several (None: one each)."""
        collator = self.collators[0]
        return collator.packed_rows(rows) if collator.sample_packing and not self.packing_buffer and rows else None

    def batch(self, rows: list[Any]) -> dict[str, Any]:
        if self.packing_buffer:  # rows packed by best fit already
            return self.collators[0].collate_rows(rows)
        return self.collators[0].collate(rows)

    def tokens(self, item: Any) -> int:
        """The tokens a record adds to the stream (a mixture's token shares count these)."""
        return sample_tokens(item)

    def row_tokens(self, row: Any) -> int:
        """A row's tokens in the per-source accounting: the sample's input_ids (best fit: its samples')."""
        return sum(len(sample[0]) for sample in row) if self.packing_buffer else sample_tokens(row)


def is_local(path: str) -> bool:
    """Axolotl's rule: a dataset `path` that exists here (file, folder or glob) is local, else a hub id."""
    return Path(path).expanduser().exists() or bool(any(c in path for c in "*?[") and glob.glob(path))


# a file suffix says "a file here": such a path is never a hub id (`org/name` has none)
LINE_SUFFIXES = (".jsonl", ".txt", ".csv", ".tsv")  # read line by line: a cursor's offset is a byte position
LOCAL_SUFFIXES = (".jsonl", ".json", ".parquet", ".txt", ".csv", ".gz", ".zst", ".arrow", ".tsv")


def looks_local(path: str) -> bool:
    """A path meant for this machine: `./`, `/`, `~` in front, or a data file's suffix (a hub id has neither)."""
    return path.startswith(("./", "../", "/", "~", ".\\")) or path.lower().endswith(LOCAL_SUFFIXES)


def record_source(entry: Any, where: str = "datasets entry") -> TextSource:
    """The source of whole records for one `datasets:` entry (`path`, `split`, `data_files`, `name`).

    A missing path that looks local is an error at once: looked up on the Hub it would
    spend half a minute in retries before saying it could not reach it.
    """
    if entry.data_files:
        files = entry.data_files if isinstance(entry.data_files, list) else [entry.data_files]
        if all(is_local(f) for f in files):
            return LocalLineTextSource(files, text_column=None)
    if is_local(entry.path):
        return LocalLineTextSource(entry.path, text_column=None)
    if looks_local(entry.path) and not entry.data_files:
        raise InputError(
            f"{where} path {entry.path!r} does not exist here ({Path(entry.path).expanduser().absolute()}); "
            "fix the path (it is relative to the folder llm-train runs in) or give a Hugging Face dataset id"
        )
    return HFStreamTextSource(entry.path, entry.name, entry.split, text_column=None, data_files=entry.data_files,
                              twin="sft")


class StreamingSFTDataModule(StreamingTextDataModule):
    """Batches `{"input_ids", "attention_mask", "labels"}` (+ `position_ids` when packing) of one dataset entry.

    Labels are aligned with `input_ids` (-100 on prompt and padding); the state is
    the text stream's (per-partition cursors), so a resume is exact with any workers.
    """

    def __init__(self, config: Any, batch_size: int, entry: Any = None, **kwargs: Any):
        # a DataConfig or an SftStreamConfig (sft/settings.py): both give the typed settings
        settings = config.sft_stream()
        self.entries = [entry] if entry is not None else list(settings.entries)
        names = [f"datasets[{i}]" for i in range(len(self.entries))] if entry is None else ["test dataset"]
        sources = [record_source(e, name) for e, name in zip(self.entries, names)]
        self.entry_names = [(name, e.path) for name, e in zip(names, self.entries)]
        kwargs.setdefault("source", sources[0] if len(sources) == 1 else settings.mixture.build(sources))
        ledger = kwargs.pop("ledger", None)  # attached once the collators exist: the fingerprint names them
        super().__init__(settings, batch_size, **kwargs)
        self.collators = [
            StreamingDataCollator(
                self.tokenizer, self.max_seq_len,
                prompter=prompter_for(e.type, self.tokenizer, e, settings.chat_template, name),
                train_on_inputs=settings.train_on_inputs, sample_packing=settings.sample_packing,
            )
            for e, name in zip(self.entries, names)
        ]
        self.collator = self.collators[0]
        self.chat_template = settings.chat_template  # the ledger header keeps it (attach_ledger)
        if settings.packing == "best_fit" and not settings.sample_packing:  # best fit packs samples into rows
            raise ValueError("packing 'best_fit' packs samples into rows and needs sample_packing: true; "
                             "set sample_packing: true, or leave packing out")
        if ledger is not None:
            self.attach_ledger(ledger)

    piece_slots = staticmethod(sample_slots)

    def attach_ledger(self, folder: Any, run: str | None = None) -> None:
        """The text stream's ledger, its header also saying how each source's records became samples, so the
        audit can rebuild an SFT row and compare its checksum (sft/ledger_audit.py)."""
        super().attach_ledger(folder, run)
        assert self._ledger is not None  # just attached
        infos = sft_ledger_info(self.entries, self.collators, self.chat_template,
                                [name for name, _ in self.entry_names])
        for source, info in zip(self._ledger.writer.sources, infos):
            source["sft"] = info

    def _source_names(self) -> list[str]:
        if len(self.entries) == 1:  # one entry: no mixture to name it
            return [entry_name(self.entries[0])]
        return super()._source_names()

    def batch_format(self) -> SftSamples:
        return SftSamples(self.collators, self.entry_names, self.settings.best_fit_buffer())

    def source_fingerprint(self) -> dict:
        return {
            **super().source_fingerprint(),
            "sft": {"types": [e.type for e in self.entries], "train_on_inputs": self.collator.train_on_inputs,
                    "sample_packing": self.collator.sample_packing},
        }

def sft_ledger_info(entries: list[Any], collators: list[StreamingDataCollator], chat_template: str | None,
                    names: list[str]) -> list[dict[str, Any]]:
    """Per source, what the header keeps for the audit to make its records into samples again."""
    return [{"entry": e.model_dump() if isinstance(e, BaseModel) else dict(e), "chat_template": chat_template,
             "train_on_inputs": c.train_on_inputs, "pad_id": c.pad_id, "max_length": c.max_length, "where": name}
            for e, c, name in zip(entries, collators, names)]
