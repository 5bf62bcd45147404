"""The loader state: its keys, and the checks that make a bad state one sentence instead of a wrong resume."""

from __future__ import annotations

from typing import Any

from llm.data.stage import StateError

__all__ = ["STATE_VERSION", "STATE_KEYS", "OPTIONAL_KEYS", "StateError", "check_header", "check_identity",
           "check_int"]

# 2: every order is derived from the seed by a keyed hash (llm.data.seeds). A version-1 state
# (orders keyed by seed + epoch) still resumes exactly: the dataset then keeps the old derivation.
# 3: a windowed shuffle reads each block that straddles two shards in the later of their windows
# (plan/shuffle/windowed.py). A version-1 or -2 state resumes exactly with the earlier order.
STATE_VERSION = 3
VERSIONS = (1, 2, 3)
STATE_KEYS = ("version", "fingerprint", "seed", "shuffle", "num_samples", "epoch", "samples_consumed", "global_batch_size")
# Keys added after version 1 shipped: a state saved without one reads as this default.
OPTIONAL_KEYS = {
    "skip_documents": None,  # ids of documents dropped by id (read/skips.py); None: none
    "shuffle_window": None,  # shards per shuffle window; None: a global shuffle
    "subsample": 1.0,  # StreamingDataset(subsample=); a list for a mixture of subsampled sources
    "split": None,  # [[index, fractions, seed], ...] of train_test_split; None: the whole dataset
    "ledger": None,  # {run, generation, step}: the run ledger's committed position (read/ledger.py)
}
MAX_EPOCH = 1 << 62  # far beyond any run; keeps epoch arithmetic an ordinary integer


def check_int(state: dict, key: str, lo: int, hi: int, hint: str) -> int:
    """state[key] as an int in [lo, hi], or a StateError naming the key and value."""
    value = state[key]
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise StateError(f"loader state key '{key}' is {value!r}, expected an integer in [{lo}, {hi}] ({hint})")
    return value


def check_header(state: Any, keys: tuple[str, ...] = STATE_KEYS) -> dict[str, Any]:
    """The state with its optional keys filled in, once it is a dict of a known version holding `keys`."""
    if not isinstance(state, dict):
        raise StateError(f"loader state is a {type(state).__name__}, expected the dict returned by StreamingDataLoader.state_dict()")
    state = {**OPTIONAL_KEYS, **state}
    missing = [k for k in keys if k not in state]
    if missing:
        raise StateError(f"loader state has no key '{missing[0]}'; pass the dict returned by StreamingDataLoader.state_dict()")
    if type(state["version"]) is not int or state["version"] not in VERSIONS:
        raise StateError(f"loader state key 'version' is {state['version']!r}, expected one of {list(VERSIONS)}")
    return state


def _other_block_size(saved: Any, here: int, block_size: int, tokens: int | None) -> str:
    """A num_samples mismatch on token blocks, said as what it most likely is: another block_size."""
    fits = ""
    if tokens and isinstance(saved, int) and not isinstance(saved, bool) and saved > 0:
        # a block size that cuts these tokens into the saved count (dropping or padding the last block)
        sizes = [k for k in (tokens // saved, -(-tokens // saved))
                 if k > 0 and saved in (tokens // k, -(-tokens // k)) and k != block_size]
        fits = f" (its {saved} samples are these {tokens} tokens in blocks of block_size {sizes[0]})" if sizes else ""
    return (f"num_samples is {saved!r} in the state but {here} here, where TokensLoader(block_size={block_size}) cuts "
            f"the data into {here} blocks: the state was saved with another block_size{fits} or on other data; "
            "resume with the block_size it was saved with")


def check_identity(state: dict, input_dir: object, expected: dict[str, Any], block_size: int | None = None,
                   tokens: int | None = None) -> None:
    """Refuse a state saved on another dataset or with other settings: it would resume somewhere else.

    `expected` holds this dataset's fingerprint, seed, shuffle, subsample, split, num_samples and shuffle_window;
    `block_size` (token blocks) and `tokens` (their total) let a num_samples mismatch name the block size.
    """
    for key, value in expected.items():
        if state[key] == value and isinstance(state[key], bool) == isinstance(value, bool):
            continue
        if key == "num_samples" and block_size is not None:
            raise StateError(f"loader state does not match {input_dir}: "
                             + _other_block_size(state[key], value, block_size, tokens))
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
