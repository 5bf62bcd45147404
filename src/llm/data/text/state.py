"""The text stream's saved state: its versions (and their seed derivations), merging ranks' states, checking one.

A state is checked whole here before the module assigns any of it (the `Stage` contract).
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable
from typing import Any

from llm.data.inputs.dedup import DedupTextSource
from llm.data.inputs.seen_file import read_seen_file
from llm.data.seeds import derive_seed
from llm.data.stage import StateError

# 3: the position in samples and tokens next to the step, the schedule's change points where they
#    took effect (`mix.reached`) and the sources' names (mix/progress.py); older states still load;
# 2: a `random` mixture draws with derive_seed(root seed, "text.mixture", pass);
# 1: it drew with LEGACY_MIX_SEED (`mixing_seed` could not be set): such states resume that way
STATE_VERSION = 3
KNOWN_VERSIONS = (1, 2, 3)
LEGACY_MIX_SEED = 0


def merge_stream_states(states: Iterable[dict]) -> dict:
    """One state from the states of several ranks (each holds the cursors of its own partitions)."""
    states = list(states)
    merged = {**states[0], "partitions": {}, "line_index": {}, "next_worker": {}, "consumed": {}}
    if "mix" in states[0]:
        merged["mix"] = {**states[0]["mix"], "anchors": {}}
    for s in states:
        merged["partitions"].update(s["partitions"])
        merged["line_index"].update(s["line_index"])
        merged["next_worker"].update(s["next_worker"])
        merged["consumed"].update(s.get("consumed", {}))
        if "mix" in merged:
            merged["mix"]["anchors"].update(s.get("mix", {}).get("anchors", {}))
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
    for field in ("offset", "records", "skip", "tokens"):
        value = cursor.get(field, 0)
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise StateError(f"data state partition {key!r} has {field}={value!r}; expected a whole number >= 0")
    buffer = cursor.get("token_buffer", [])
    if not isinstance(buffer, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in buffer):
        raise StateError(f"data state partition {key!r} has a token_buffer that is not a list of token ids")


def check_known_partitions(saved: dict, known: list[str]) -> None:
    """Every cursor must name a partition of this source: a cursor for none would be dropped without a word."""
    names = set(known)
    for key in saved:
        if key not in names:
            example = f" (its keys look like {known[0]!r})" if known else ""
            raise StateError(
                f"data state partition {key!r} is not a partition of this source{example}; resume with the "
                "data the state was saved with, or start a fresh run"
            )


def mixture_seed(version: int, root: int, epoch: int) -> int:
    """The seed of a `random` mixture's draws in pass `epoch`, for a state of `version`."""
    if version == 1:  # states saved before the root seed: `random` always drew with seed 0
        return LEGACY_MIX_SEED
    return derive_seed(root, "text.mixture", epoch)


def check_seen_count(dedup: DedupTextSource | None, seen: Any) -> None:
    """A seen-hashes file that holds fewer digests than the state counts cannot resume it."""
    if dedup is None or not seen:
        return
    if not isinstance(seen, dict) or not isinstance(seen.get("count", 0), int):
        raise StateError(f"data state key 'seen_hashes' is {seen!r}, not {{path, count, pending}}")
    base = seen.get("base")  # a checkpoint's entry: `base` digests in the file, then its staged ones
    if base is not None and (not isinstance(base, int) or not isinstance(seen.get("digests"), bytes)
                             or seen["count"] != base + len(seen["digests"]) // dedup.digest_bytes):
        raise StateError(f"data state key 'seen_hashes' counts {seen['count']} digests, not its base {base!r} "
                         "plus the digests it carries; resume with the state as checkpoint_state() saved it")
    if not (seen.get("path") and seen["count"] and dedup.seen_hashes_path):
        return
    seen_file = read_seen_file(dedup.seen_hashes_path, dedup.hash_algo, dedup.digest_bytes)
    held = seen_file.count if seen_file is not None else 0
    # a checkpoint whose staged digests were not appended yet needs only its `base` in the file
    if held >= seen["count"] or (base is not None and held >= base):
        return
    what = "is missing" if seen_file is None else f"holds {held} digests"
    raise StateError(
        f"seen-hashes file {dedup.seen_hashes_path} {what} but the data state expects {seen['count']} "
        "digests in it; resume with the seen-hashes file the state was saved with"
    )


def check_not_all_seen(pass_stats: dict[str, int], dedup: DedupTextSource | None, handed_over: bool) -> None:
    """A pass that yielded nothing because every record was seen before says so, in one sentence."""
    read, seen = pass_stats.get("read", 0), pass_stats.get("seen_before", 0)
    if not read or seen != read:
        return
    path = dedup.seen_hashes_path if dedup is not None else None
    if not handed_over:
        raise ValueError(
            f"all {read} records are in the seen-hashes file {path}; nothing is left to train on: "
            "add new data, or point data.seen_hashes_path at another (or no) file"
        )
    raise ValueError(
        f"all {read} records were consumed earlier in this run (a deduplicated stream never repeats a "
        f"record, seen-hashes file {path}); nothing is left for another pass: lower steps_per_epoch or "
        "epochs, or add new data"
    )


def warn_uncommitted(seen: dict | None) -> None:
    """A state taken with state_dict() carries consumed records its seen-hashes file never got: say so."""
    if seen and seen.get("pending"):
        warnings.warn(
            f"the data state was taken with state_dict(), not checkpoint_state(): {seen['pending']} "
            "consumed records were never committed to the seen-hashes file, so later copies of "
            "them are not dropped; save states for checkpoints with checkpoint_state()",
            stacklevel=4,
        )
