"""`StreamingDataCollator`: raw records -> tokenized, truncated, padded (or packed) training batches.

Axolotl's contract: tokenize on the fly, truncate to `max_length`, pad with the
pad id (EOS when the tokenizer has none) with attention mask 0 and labels
`label_pad_token_id` on padding, and an empty batch becomes one EOS-only sample.
Beyond it: prompt tokens get label -100 unless `train_on_inputs`, and
`sample_packing` puts several short samples in one row with `position_ids`
restarting at each sample (for attention implementations that honour them).

Labels are aligned with `input_ids` (Hugging Face models shift them inside);
`llm-train --task sft` shifts them itself for its own model.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from llm.data.sft.prompts import (
    AlpacaPrompter,
    ChatPrompter,
    CompletionPrompter,
    Prompter,
    RecordError,
)
from llm.data.tokenize.foreign import as_tokenizer
from llm.data.tokenize.protocol import Tokenizer

IGNORE = -100
# a skipped sample warns on the first one and then once per this many, never per sample
WARN_EVERY = 1000


class UntrainableSampleWarning(UserWarning):
    """Samples left with no trainable token (a prompt at least `sequence_len` long) were skipped."""


def trainable(labels: list[int]) -> bool:
    """Whether a sample teaches anything: a target after its first token (nothing predicts the first)."""
    return any(lab != IGNORE for lab in labels[1:])


class BatchRecordError(RecordError):
    """A record of a batch that does not fit its prompt format: which one, the format, and why."""

    def __init__(self, index: int, kind: str, reason: str):
        super().__init__(f"record {index} of the batch ({kind}): {reason}")
        self.index, self.kind, self.reason = index, kind, reason

    def __reduce__(self) -> tuple:  # made from its parts, not its message: how it crosses a process boundary
        return type(self), (self.index, self.kind, self.reason)


def infer_prompter(record: dict[str, Any], tokenizer: Tokenizer | None) -> Prompter:
    """The format a record's keys say: `messages` -> chat, `instruction` -> alpaca, else completion."""
    if "messages" in record:
        return ChatPrompter.for_tokenizer(tokenizer)
    if "instruction" in record:
        return AlpacaPrompter()
    return CompletionPrompter()


def _from_cfg(cfg: Any, key: str) -> Any:
    """One key of an Axolotl-style cfg (a dict, an object with attributes, or None); a key it lacks is "not set"."""
    return cfg.get(key) if isinstance(cfg, Mapping) else getattr(cfg, key, None)


def _pick(given: Any, cfg: Any, key: str, default: Any) -> Any:
    """The argument when given, else cfg's key when set, else the default."""
    if given is not None:
        return given
    value = _from_cfg(cfg, key)
    return default if value is None else value


class StreamingDataCollator:
    """Call it on a list of raw records (dicts); returns int64 tensors `input_ids`, `attention_mask`, `labels`."""

    def __init__(
        self,
        tokenizer: Any,
        max_length: int | None = None,
        prompter: Prompter | None = None,
        padding: bool | str = True,
        pad_to_multiple_of: int | None = None,
        label_pad_token_id: int = IGNORE,
        train_on_inputs: bool | None = None,
        sample_packing: bool | None = None,
        cfg: Any = None,
    ):
        # Axolotl's signature: (tokenizer=..., cfg=..., prompter=...); an argument given here beats cfg's key
        max_length = _pick(max_length, cfg, "sequence_len", None)
        train_on_inputs = bool(_pick(train_on_inputs, cfg, "train_on_inputs", False))
        sample_packing = bool(_pick(sample_packing, cfg, "sample_packing", False))
        if padding is True and _from_cfg(cfg, "pad_to_sequence_len"):
            padding = "max_length"
        if not isinstance(max_length, int) or isinstance(max_length, bool) or max_length < 1:
            where = "cfg.sequence_len" if cfg is not None else "max_length"
            raise ValueError(f"{where} must be a positive integer, got {max_length!r}; set it to the tokens per sample")
        if padding not in (True, False, "longest", "max_length"):
            raise ValueError(f"padding must be True, False, 'longest' or 'max_length', got {padding!r}")
        # ours, a spec, or a Hugging Face / tokenizers / tiktoken object (tokenize/foreign.py)
        tokenizer = self.tokenizer = as_tokenizer(tokenizer)
        self.max_length = max_length
        self.prompter = prompter
        self.padding = padding
        self.pad_to_multiple_of = pad_to_multiple_of
        self.label_pad_token_id = label_pad_token_id
        self.train_on_inputs = train_on_inputs
        self.sample_packing = sample_packing
        self.skipped = 0  # samples dropped because truncation left them no trainable token
        self.pad_id = tokenizer.eos_id if tokenizer.pad_id is None else tokenizer.pad_id

    # -- one record ------------------------------------------------------------------------
    def encode(self, records: Sequence[dict[str, Any]]) -> list[tuple[list[int], list[int]]]:
        """(input_ids, labels) per record, EOS at the end, truncated to `max_length`; untrainable ones dropped."""
        return [s for s in self.encode_each(records) if s is not None]

    def encode_each(self, records: Sequence[dict[str, Any]]) -> list[tuple[list[int], list[int]] | None]:
        """`encode`, one entry per record: None where truncation left no trainable token (counted, warned)."""
        segments = []
        for i, record in enumerate(records):
            if not isinstance(record, dict):
                raise RecordError(f"record {i} of the batch is a {type(record).__name__}, expected a dict")
            prompter = self.prompter or infer_prompter(record, self.tokenizer)
            try:
                segments.append((prompter.segments(record), prompter.append_eos))
            except RecordError as e:
                raise BatchRecordError(i, prompter.name, str(e)) from None
        texts = [text for segs, _ in segments for text, _ in segs]
        ids = iter(self.tokenizer.encode_batch(texts) if texts else [])
        out = []
        for segs, append_eos in segments:
            tokens: list[int] = []
            labels: list[int] = []
            for _, target in segs:
                piece = list(next(ids))
                tokens += piece
                labels += piece if (target or self.train_on_inputs) else [IGNORE] * len(piece)
            if append_eos:  # a chat template ends its turns itself
                last_is_target = bool(segs) and (segs[-1][1] or self.train_on_inputs)
                tokens.append(self.tokenizer.eos_id)
                labels.append(self.tokenizer.eos_id if last_is_target else IGNORE)
            out.append(self._keep(tokens[: self.max_length], labels[: self.max_length]))
        return out

    def _keep(self, tokens: list[int], labels: list[int]) -> tuple[list[int], list[int]] | None:
        """The sample, or None when it has no trainable token: a batch of those would make the loss NaN."""
        if trainable(labels):
            return tokens, labels
        self.skipped += 1
        if self.skipped % WARN_EVERY == 1 or WARN_EVERY == 1:
            warnings.warn(
                f"skipped {self.skipped} sample(s) so far with no trainable token: their prompt fills "
                f"sequence_len={self.max_length}; raise sequence_len or shorten the prompts",
                UntrainableSampleWarning, stacklevel=3,
            )
        return None

    # -- a batch ---------------------------------------------------------------------------
    def __call__(self, records: Sequence[dict[str, Any]]) -> dict[str, torch.Tensor]:
        return self.collate(self.encode(records))

    def collate(self, samples: list[tuple[list[int], list[int]]]) -> dict[str, torch.Tensor]:
        """Encoded samples (`encode`'s output) to one padded (or packed) batch."""
        if not samples:  # Axolotl's contract: never an empty batch
            eos = self.tokenizer.eos_id
            samples = [([eos], [eos])]
        return self._fill(self._pack(samples) if self.sample_packing else [[s] for s in samples])

    def collate_rows(self, rows: list[list[tuple[list[int], list[int]]]]) -> dict[str, torch.Tensor]:
        """Rows packed already (best fit) to one batch: `position_ids` restart at each sample, the padding
        after a row's samples is one more run, and `cu_seqlens` (int32) lists every run's start, then the total."""
        from llm.data.pack.best_fit import cu_seqlens

        batch = self._fill(rows, positions_always=True, padding_run=True)
        batch["cu_seqlens"] = cu_seqlens(batch["position_ids"])
        return batch

    def _fill(self, rows: list[list[tuple[list[int], list[int]]]], positions_always: bool = False,
              padding_run: bool = False) -> dict[str, torch.Tensor]:
        width = self._width(rows)
        input_ids = torch.full((len(rows), width), self.pad_id, dtype=torch.long)
        labels = torch.full((len(rows), width), self.label_pad_token_id, dtype=torch.long)
        attention = torch.zeros((len(rows), width), dtype=torch.long)
        positions = torch.zeros((len(rows), width), dtype=torch.long)
        for r, row in enumerate(rows):
            at = 0
            for k, (ids, labs) in enumerate(row):
                n = len(ids)
                input_ids[r, at : at + n] = torch.tensor(ids)
                labels[r, at : at + n] = torch.tensor(labs)
                if k:  # nothing in a packed row predicts another sample's first token
                    labels[r, at] = IGNORE
                attention[r, at : at + n] = 1
                positions[r, at : at + n] = torch.arange(n)
                at += n
            if padding_run:  # one run, so that position 0 marks exactly the starts of samples and of padding
                positions[r, at:] = torch.arange(width - at)
        batch = {"input_ids": input_ids, "attention_mask": attention, "labels": labels}
        if self.sample_packing or positions_always:
            batch["position_ids"] = positions
        return batch

    def _pack(self, samples: list[tuple[list[int], list[int]]]) -> list[list[tuple[list[int], list[int]]]]:
        """Samples in order, greedily into rows of at most `max_length` tokens."""
        rows: list[list[tuple[list[int], list[int]]]] = []
        for sample, row in zip(samples, self.packed_rows(samples)):
            if row == len(rows):
                rows.append([])
            rows[row].append(sample)
        return rows

    def packed_rows(self, samples: list[tuple[list[int], list[int]]]) -> list[int]:
        """The row of a packed batch each sample goes in (`sample_packing`: greedily, in order)."""
        out, row, used = [], -1, self.max_length
        for ids, _ in samples:
            if used + len(ids) > self.max_length:
                row, used = row + 1, 0
            out.append(row)
            used += len(ids)
        return out

    def _width(self, rows: list[list[tuple[list[int], list[int]]]]) -> int:
        lengths = [sum(len(ids) for ids, _ in row) for row in rows]
        if self.padding == "max_length":
            width = self.max_length
        elif self.padding is False:
            if len(set(lengths)) > 1:
                raise ValueError(
                    f"padding=False but the batch holds samples of {min(lengths)} to {max(lengths)} tokens; "
                    "pad them (padding=True) or use batches of one"
                )
            width = lengths[0]
        else:
            width = max(lengths)
        m = self.pad_to_multiple_of
        return -(-width // m) * m if m else width
