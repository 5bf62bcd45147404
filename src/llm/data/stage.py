"""The one state contract every stateful stage keeps: `state()`, `check(state)`, `restore(state)`.

A stage is anything whose position must survive a restart: a `StreamingDataset`, a mixture,
the loader, the text module, the SFT stream, the shard cache. Each one

* `state()` returns a plain dict (JSON-able, small) that says where it is;
* `check(state)` raises `StateError` naming the key and value when that state cannot be
  resumed here, and changes nothing, whatever it finds;
* `restore(state)` applies a state that `check` accepted.

`load(stage, state)` is the only way callers apply a state: check everything first, then
assign, so a refused state leaves the stage exactly as it was (torchtitan's
`load_state_dict` does the same). A stage built from others holds them and calls their
methods directly: nobody probes a stage with `hasattr`. The public names users know,
`state_dict()` / `load_state_dict()`, are this contract under the names PyTorch uses.

Why a class and not a `typing.Protocol`: `Stage` gives those two public names once, for
every stage, and a stage that forgets one of the three methods fails when it is built,
not at the first checkpoint.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any


class StateError(ValueError):
    """A saved state that cannot be resumed here; the message names the key and the value."""


class Stage(ABC):
    """A stateful stage of the pipeline (see the module docstring for the contract)."""

    @abstractmethod
    def state(self) -> dict[str, Any]:
        """Where this stage is, as a small plain dict."""

    @abstractmethod
    def check(self, state: Any) -> None:
        """Raise StateError if `state` cannot be resumed here; never change anything."""

    @abstractmethod
    def restore(self, state: dict[str, Any]) -> None:
        """Apply a state that `check` accepted."""

    def state_dict(self) -> dict[str, Any]:
        """PyTorch's name for `state()`."""
        return self.state()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """PyTorch's name for `load(self, state)`: checked whole, then applied."""
        load(self, state)


def load(stage: Stage, state: Any) -> None:
    """Check `state` completely, then restore it: a refused state changes nothing."""
    stage.check(state)
    stage.restore(state)
