"""The loader state: its keys, and the checks that make a bad state one sentence instead of a wrong resume."""

from __future__ import annotations

from typing import Any

STATE_VERSION = 1
STATE_KEYS = ("version", "fingerprint", "seed", "shuffle", "num_samples", "epoch", "samples_consumed", "global_batch_size")
# Keys added after version 1 shipped: a state saved without one reads as this default.
OPTIONAL_KEYS = {
    "shuffle_window": None,  # shards per shuffle window; None: a global shuffle
    "subsample": 1.0,  # StreamingDataset(subsample=); a list for a mixture of subsampled sources
    "split": None,  # [[index, fractions, seed], ...] of train_test_split; None: the whole dataset
}
_MAX_EPOCH = 1 << 62  # far beyond any run; keeps seed + epoch an ordinary integer


class StateError(ValueError):
    """A loader state that cannot be resumed from; the message names the key and value."""


def _int(state: dict, key: str, lo: int, hi: int, hint: str) -> int:
    value = state[key]
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise StateError(f"loader state key '{key}' is {value!r}, expected an integer in [{lo}, {hi}] ({hint})")
    return value


def check_state(state: Any, input_dir: object, mine: dict[str, Any]) -> tuple[int, int]:
    """(epoch, samples_consumed) of a state saved by `StreamingDataLoader.state_dict()`, or a StateError.

    `mine` holds this loader's fingerprint, seed, shuffle, subsample, split, num_samples and shuffle_window: a
    state from another dataset or other settings would resume somewhere else, so it is refused, not reinterpreted.
    """
    if not isinstance(state, dict):
        raise StateError(f"loader state is a {type(state).__name__}, expected the dict returned by StreamingDataLoader.state_dict()")
    state = {**OPTIONAL_KEYS, **state}
    missing = [k for k in STATE_KEYS if k not in state]
    if missing:
        raise StateError(f"loader state has no key '{missing[0]}'; pass the dict returned by StreamingDataLoader.state_dict()")
    if type(state["version"]) is not int or state["version"] != STATE_VERSION:
        raise StateError(f"loader state key 'version' is {state['version']!r}, expected {STATE_VERSION}")
    for key, value in mine.items():
        if state[key] != value or isinstance(state[key], bool) != isinstance(value, bool):
            if key in ("shuffle_window", "subsample") and not isinstance(value, list) and not isinstance(state[key], list):
                saved = "'global'" if state[key] is None else repr(state[key])
                raise StateError(
                    f"loader state does not match {input_dir}: {key} is {state[key]!r} in the state "
                    f"but {value!r} here; pass StreamingDataset({key}={saved}) to resume this state"
                )
            if key == "split":
                raise StateError(
                    f"loader state does not match {input_dir}: split is {state[key]!r} in the state but {value!r} "
                    "here ([index, fractions, seed] of train_test_split); resume with the split it was saved from"
                )
            raise StateError(
                f"loader state does not match {input_dir}: {key} is {state[key]!r} in the state "
                f"but {value!r} here; resume with the same dataset and settings"
            )
    _int(state, "global_batch_size", 1, 1 << 62, "batch_size x world size when it was saved")
    epoch = _int(state, "epoch", 0, _MAX_EPOCH, "epochs finished")
    consumed = _int(state, "samples_consumed", 0, mine["num_samples"], "samples of the epoch already handed out")
    return epoch, consumed
