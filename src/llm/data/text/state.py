"""The text stream's saved state: its version, merging the states of several ranks, and checking a cursor."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from llm.data.stage import StateError

STATE_VERSION = 1
KNOWN_VERSIONS = (1,)


def merge_stream_states(states: Iterable[dict]) -> dict:
    """One state from the states of several ranks (each holds the cursors of its own partitions)."""
    states = list(states)
    merged = {**states[0], "partitions": {}, "line_index": {}, "next_worker": {}}
    for s in states:
        merged["partitions"].update(s["partitions"])
        merged["line_index"].update(s["line_index"])
        merged["next_worker"].update(s["next_worker"])
    return merged


def check_layout(state: Any) -> None:
    """The shape of a saved text state (a dict, a known version, cursor dicts); StateError naming the key."""
    if not isinstance(state, dict):
        raise StateError(
            f"the data state is a {type(state).__name__}, not a dict; resume with a state saved by StreamingTextDataModule"
        )
    version = state.get("version", 1)
    if version not in KNOWN_VERSIONS:
        raise StateError(
            f"data state version {version!r} is not known here (this library reads {list(KNOWN_VERSIONS)}); "
            "resume with the library version that saved it"
        )
    partitions = state.get("partitions")
    if not isinstance(partitions, dict):
        raise StateError("data state has no 'partitions' cursors; it was not saved by StreamingTextDataModule")
    for key, cursor in partitions.items():
        check_cursor(key, cursor)


def check_cursor(key: str, cursor: Any) -> None:
    """One partition's saved cursor must have whole-number offsets and a token list."""
    if not isinstance(cursor, dict):
        raise StateError(f"data state partition {key!r} holds {cursor!r}, not a cursor dict")
    for field in ("offset", "records", "skip"):
        value = cursor.get(field, 0)
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise StateError(f"data state partition {key!r} has {field}={value!r}; expected a whole number >= 0")
    buffer = cursor.get("token_buffer", [])
    if not isinstance(buffer, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in buffer):
        raise StateError(f"data state partition {key!r} has a token_buffer that is not a list of token ids")
