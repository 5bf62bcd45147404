"""What optimize's two outputs (a local folder, an s3:// prefix) share: the mode checks at start and the
append merge at commit; output.py and remote_output.py each hold one kind."""

from __future__ import annotations

from abc import ABC, abstractmethod

from llm.data.shards.format.manifest import Manifest, merge_backends

MODES = ("append", "overwrite")
SHARD_PREFIX = "shard-"


class Output(ABC):
    """What the local and the remote output share: the mode checks at start, the append merge at commit."""

    mode: str | None
    kind: str
    tokenizer: dict | None
    display: str  # the folder or URL, as messages name it
    label: str  # "output folder X" or "output URL": what is not empty

    @abstractmethod
    def _entries(self) -> list[str]:
        """Names in the output now, its lock left out."""

    @abstractmethod
    def _current(self) -> Manifest | None:
        """The committed manifest, or None when there is none yet."""

    def _check_mode(self) -> None:
        if self._entries() and self.mode is None:
            raise ValueError(f"{self.label} is not empty; pass mode='append' or mode='overwrite' (CLI: --mode)")
        previous = self._current()
        if self.mode == "append" and previous is not None:
            self._check_append(previous)

    def _check_append(self, prev: Manifest) -> None:
        if prev.kind != self.kind:
            raise ValueError(f"cannot append {self.kind} to {self.display}, which holds {prev.kind}")
        if prev.tokenizer and self.tokenizer and prev.tokenizer != self.tokenizer:
            raise ValueError(
                f"cannot append to {self.display}: it was tokenized with {prev.tokenizer}, this run uses {self.tokenizer}"
            )

    def _add_previous(self, manifest: Manifest) -> None:
        """Re-read under the lock: what we append to is what is there now, not what we saw at start."""
        previous = self._current()
        if self.mode == "append" and previous is not None:
            self._check_append(previous)
            manifest.shards = previous.shards + manifest.shards
            manifest.sources = previous.sources + manifest.sources
            manifest.tokenizer_backend = merge_backends(previous.tokenizer_backend, manifest.tokenizer_backend)
