"""`Tokenizer`, the one declared protocol every stage types its tokenizer with, and `BaseTokenizer`.

Every ability a stage may use is a member here, so callers read it instead of probing for it
with `hasattr`/`getattr`: an ability a tokenizer lacks is declared as absent (`encode_flat is
None`, `pad_id is None`, `path is None`). `BaseTokenizer` holds those defaults; each of our
tokenizers (`tokenizers.py`) derives from it, so a new one states what it offers in one place.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

# texts -> (all ids as one unsigned integer array, len(texts) + 1 int64 offsets into it)
FlatEncoder = Callable[[Sequence[str]], tuple[Any, Any]]


@runtime_checkable
class Tokenizer(Protocol):
    """What every stage needs from a tokenizer; nothing more."""

    spec: str  # what `load_tokenizer` was given: `simple`, or the vocabulary file
    backend: str  # the engine that encodes (`simple` for bytes); never changes the ids
    eos_id: int
    vocab_size: int
    pad_id: int | None  # None: the SFT collator pads with `eos_id`
    path: Path | None  # the vocabulary file (its folder may hold tokenizer_config.json); None: no file

    @property
    def encode_flat(self) -> FlatEncoder | None:
        """A batch encoder that makes no per-token Python objects, or None: use `encode_batch`."""
        ...

    def encode(self, text: str) -> list[int]: ...

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]: ...

    def decode(self, ids: Iterable[int]) -> str: ...

    def fingerprint(self) -> dict:
        """The vocabulary's identity (the same for every backend): what datasets and checkpoints are bound to."""
        ...


class BaseTokenizer(ABC):
    """The `Tokenizer` protocol with its optional abilities declared absent; subclasses declare what they add."""

    spec: str
    backend: str
    eos_id: int
    vocab_size: int
    pad_id: int | None = None  # none of ours has a padding token
    path: Path | None = None
    encode_flat: FlatEncoder | None = None  # see Tokenizer.encode_flat

    @abstractmethod
    def encode(self, text: str) -> list[int]: ...

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        return [self.encode(t) for t in texts]

    @abstractmethod
    def decode(self, ids: Iterable[int]) -> str: ...

    @abstractmethod
    def fingerprint(self) -> dict: ...
