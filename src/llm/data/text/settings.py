"""Typed settings of the on-the-fly text wing: a mixture, the stream; each stream config `build()`s its component.

`DataConfig` (the `data:` YAML section) makes these (`DataConfig.text_stream()`); code that
builds a stream by hand can make them directly. The source itself is built by
`SOURCE_REGISTRY` from the `data:` section (`source`), since a registered custom source
reads keys of its own from there.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the components are imported when built: reading a config needs no torch
    from llm.data.inputs.mixture import MixedTextSource
    from llm.data.inputs.source import TextSource
    from llm.data.text.stream import StreamingTextDataModule

DEFAULT_SEED = 42  # training.seed's default: a module built alone draws as a run with the default seed
DEFAULT_PACKING_BUFFER = 64  # best fit's open blocks


def packing_keys(packing: str | None, buffer: int | None) -> dict[str, Any]:
    """The data: section's packing keys with their defaults filled in (unset: greedy, 64 open blocks)."""
    return {"packing": "greedy" if packing is None else packing,
            "packing_buffer": DEFAULT_PACKING_BUFFER if buffer is None else buffer}


@dataclass(frozen=True)
class MixtureConfig:
    """How several sources mix (`streaming_dataset_mixing_strategy`, `streaming_mixing_weights`, ...).

    `unit` (`streaming_mixing_unit`): weights are shares of records or of tokens; `schedule`
    (`streaming_mixing_schedule`): weights by step instead of fixed ones; `names`: each entry's
    name in the per-source accounting (its `name`, else its path's stem).
    """

    strategy: str = "round_robin"
    weights: list[float] | None = None
    buffer_per_dataset: int = 1000
    unit: str = "records"
    schedule: list[dict[str, Any]] | None = None
    names: tuple[str, ...] | None = None

    def build(self, sources: list[TextSource]) -> MixedTextSource:
        """The mixture of `sources` (weights checked: finite, non-negative, summing to 1)."""
        from llm.data.inputs.mixture import MixedTextSource

        return MixedTextSource(sources, self.strategy, self.weights, buffer=self.buffer_per_dataset,
                               unit=self.unit, schedule=self.schedule, names=self.names)


@dataclass(frozen=True)
class TextStreamConfig:
    """Everything `StreamingTextDataModule` reads; `seed` is the one root seed (training.seed)."""

    source: Any = None  # the data: section SOURCE_REGISTRY builds the source from (a DataConfig)
    tokenizer: str = "simple"
    max_seq_len: int = 512
    steps_per_epoch: int | None = None
    num_workers: int = 0
    text_column: str = "text"
    val_dataset_path: str | None = None
    storage_options: dict[str, Any] | None = field(default=None, repr=False)  # keys: never printed
    seed: int = DEFAULT_SEED
    packing: str = "greedy"  # or "best_fit" (text/best_fit.py): whole documents into the block they fill best
    packing_buffer: int = DEFAULT_PACKING_BUFFER  # best fit's open blocks
    mixture_changes: str = "refuse"  # or "allow": a resume may add or remove sources of a mixture (text/changes.py)
    watchdog_s: float = 600.0  # no batch for this long: name what the workers wait for (0: off; llm/data/watchdog.py)
    watchdog: str = "log"  # or "raise": DataStallError instead of a log line

    def __post_init__(self) -> None:
        from llm.data.pack.best_fit import check_packing
        from llm.data.text.changes import check_mixture_changes
        from llm.data.watchdog import check_watchdog

        check_packing(self.packing, self.packing_buffer)
        check_mixture_changes(self.mixture_changes)
        check_watchdog(self.watchdog_s, self.watchdog, "data.")

    def best_fit_buffer(self) -> int | None:
        """Best fit's open blocks, or None for greedy packing."""
        return self.packing_buffer if self.packing == "best_fit" else None

    def packing_fingerprint(self) -> dict[str, Any]:
        """What packing adds to the stream's fingerprint; greedy, the default, adds nothing (older states resume)."""
        return {"packing": "best_fit", "packing_buffer": self.packing_buffer} if self.best_fit_buffer() else {}

    def text_stream(self) -> TextStreamConfig:
        """Itself: the module takes this or a `DataConfig`, and asks either for its stream settings."""
        return self

    def build(self, batch_size: int, **kwargs: Any) -> StreamingTextDataModule:
        """The text module (kwargs: rank, world_size, steps_per_epoch, loop, source, tokenizer)."""
        from llm.data.text.stream import StreamingTextDataModule

        return StreamingTextDataModule(self, batch_size, **kwargs)
