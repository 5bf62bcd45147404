"""Audit's view of an SFT source: its records made into samples again, the way the stream made them.

The SFT module records in the ledger header, per source, how a record became a sample (`sft_ledger_info`, sft/stream.py):
the datasets entry (its type, chat template keys), the top-level chat template, `train_on_inputs`,
the pad id and the sample length. The audit rebuilds the prompter and collator from that and the run's
tokenizer (the stream's `tokenizer`), encodes each record it reads again, and rebuilds every row from
its pieces: the samples' ids in piece order, padded with the pad id to the longest row of its batch, as
the collator pads a batch (best fit and sample packing put several samples in a row; the pieces list
them in the order they sit in it).
"""

from __future__ import annotations

import json
import warnings
from typing import Any

import numpy as np

from llm.data.sft.collator import StreamingDataCollator, UntrainableSampleWarning
from llm.data.sft.prompts import RecordError, prompter_for
from llm.data.sft.settings import DatasetEntry


class SampleRebuild:
    """One SFT source's records -> the input_ids of their samples (None: nothing to train on, or not a record)."""

    def __init__(self, info: dict[str, Any], tokenizer: Any):
        entry = DatasetEntry.model_validate(info["entry"])
        prompter = prompter_for(entry.type, tokenizer, entry, info.get("chat_template"), info.get("where", "datasets entry"))
        self.collator = StreamingDataCollator(tokenizer, int(info["max_length"]), prompter=prompter,
                                              train_on_inputs=bool(info.get("train_on_inputs")))
        self.pad_id = int(info["pad_id"])

    def samples(self, texts: list[str]) -> list[np.ndarray | None]:
        out: list[np.ndarray | None] = []
        with warnings.catch_warnings():  # the run warned of samples with nothing to train on already
            warnings.simplefilter("ignore", UntrainableSampleWarning)
            for text in texts:
                try:
                    record = json.loads(text)
                    sample = self.collator.encode_each([record])[0] if isinstance(record, dict) else None
                except (ValueError, RecordError):
                    sample = None  # the record no longer parses: its rows will not match
                out.append(None if sample is None else np.asarray(sample[0], np.int64))
        return out

