"""Sources added to or removed from a mixture on resume (`data.mixture_changes: allow`): matched, their cursors moved.

A state names its sources in index order (`sources`) and its fingerprint holds each one's.
Partitions are keyed by their source's index (`d<i>:<key>`; a single source's keys have no
prefix), so a kept source's cursors move to its new index, a new source has none and starts
at its beginning, and a removed source's cursors are dropped while its counts stay in the
per-source accounting (`consumed`, `tokens_by_source`). Sources are matched by name, and a
name must still hold the same data (fingerprint): two entries with one name, a name whose
data changed, or the same data under a new name are each refused in one sentence naming
the source, since a guess there would repeat or skip a whole corpus.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from llm.data.inputs.source import FINGERPRINT_MISMATCH
from llm.data.stage import StateError

MIXTURE_CHANGES = ("refuse", "allow")
# the parts of a stream's fingerprint that are not its sources' (text/stream.py, sft/stream.py)
STREAM_KEYS = ("tokenizer", "max_seq_len", "stripes", "packing", "packing_buffer", "sft")
_PREFIX = "d{}:"


def check_mixture_changes(value: Any) -> str:
    """`mixture_changes`: refuse (the default) or allow sources to be added or removed on resume."""
    if value not in MIXTURE_CHANGES:
        raise ValueError(f"mixture_changes {value!r} is not known; use allow (a resume may add or remove sources "
                         "of a mixture) or refuse (the default: a resume needs the same sources)")
    return value


def split_fingerprint(fp: dict) -> tuple[list[Any], dict, bool]:
    """(each source's fingerprint, the rest, whether it is a mixture) of a text stream's fingerprint."""
    rest = {k: fp[k] for k in STREAM_KEYS if k in fp}
    body = {k: v for k, v in fp.items() if k not in STREAM_KEYS}
    sft = rest.get("sft")
    types = sft.get("types") if isinstance(sft, dict) else None
    if types is not None:  # each SFT entry's record type is its own
        rest["sft"] = {k: v for k, v in sft.items() if k != "types"}  # type: ignore[union-attr]
    inner = body.get("inner")
    if body.get("type") == "mixture":
        sources, mixture = list(body.get("sources", [])), True
    elif body.get("type") == "dedup" and isinstance(inner, dict) and inner.get("type") == "mixture":
        deduplicated = set(body.get("deduplicated", []))
        sources = [{"source": s, "deduplicated": i in deduplicated} for i, s in enumerate(inner.get("sources", []))]
        rest.update({k: v for k, v in body.items() if k not in ("inner", "deduplicated")})
        mixture = True
    else:
        sources, mixture = [body], False
    if types is not None and len(types) == len(sources):
        sources = [{"source": s, "type": t} for s, t in zip(sources, types)]
    return sources, rest, mixture


@dataclass(frozen=True)
class SourceChange:
    """Where each kept source's partitions go: saved index -> current index, and both sides' key prefixes."""

    moves: dict[int, int]
    saved_mixture: bool
    mixture: bool

    def remap(self, keyed: dict[str, Any]) -> dict[str, Any]:
        """A dict keyed by partition (cursors, anchors) under the current sources; removed sources' keys dropped."""
        out = {}
        for key, value in keyed.items():
            index, inner = _split_key(key) if self.saved_mixture else (0, key)
            if index in self.moves:
                out[(_PREFIX.format(self.moves[index]) if self.mixture else "") + inner] = value
        return out


def _split_key(key: str) -> tuple[int | None, str]:
    head, sep, inner = key.partition(":")
    if not sep or not head.startswith("d") or not head[1:].isdigit():
        return None, key
    return int(head[1:]), inner


def source_change(state: dict, current: dict, names: list[str], given: list[str], allow: bool) -> SourceChange | None:
    """The move of a state's cursors to changed sources; None when the sources did not change.

    Raises StateError when they changed without `allow`, or when a source cannot be matched;
    any other difference is left to the fingerprint check.
    """
    saved = state.get("fingerprint")
    if not isinstance(saved, dict) or saved == current:
        return None
    saved_sources, saved_rest, saved_mixture = split_fingerprint(saved)
    sources, rest, mixture = split_fingerprint(current)
    if saved_rest != rest or saved_sources == sources or not (saved_mixture or mixture):
        return None  # not a change of the source list: the fingerprint check names what differs
    if not allow:
        raise StateError(
            f"{FINGERPRINT_MISMATCH}: the mixture's sources changed ({len(saved_sources)} saved, {len(sources)} "
            "now, or other data); set data.mixture_changes: allow to add or remove sources on resume (kept "
            "sources continue, new ones start at their beginning), or resume with the sources the state was saved with"
        )
    saved_names = state.get("sources")
    if not isinstance(saved_names, list) or len(saved_names) != len(saved_sources):
        raise StateError(
            f"the data state (version {state.get('version', 1)}) does not name its sources, so mixture_changes: "
            "allow cannot match them; resume with the sources it was saved with first, then save again"
        )
    for j, name in enumerate(given):
        if given.index(name) != j:
            raise StateError(
                f"datasets[{j}] has the name {name!r}, like datasets[{given.index(name)}]; give each source its own "
                "name (its `name:` key) so that mixture_changes: allow can match it with the data state's sources"
            )
    moves: dict[int, int] = {}
    for j, name in enumerate(names):
        if name in saved_names:
            i = saved_names.index(name)
            if saved_sources[i] != sources[j]:
                raise StateError(
                    f"datasets[{j}] ({name!r}) holds other data than the source of that name in the data state; "
                    "give the changed data a new name (it then starts at its beginning), or resume with the data "
                    "the state was saved with"
                )
            moves[i] = j
            continue
        same = [n for i, n in enumerate(saved_names) if saved_sources[i] == sources[j] and n not in names]
        if same:
            raise StateError(
                f"datasets[{j}] ({name!r}) holds the data of {same[0]!r} in the data state under another name; "
                f"name it {same[0]!r} to continue it, or leave it out"
            )
    return SourceChange(moves, saved_mixture, mixture)
