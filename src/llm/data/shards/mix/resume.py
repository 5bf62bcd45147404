"""A mixture's resume: what its state keeps of the past, read back and checked without changing anything.

A mixture's plan is a pure function of positions, but three things of the past are not
positions of this run, so the state (`mixture`, version 2) keeps them:

* the step clock (`mix/schedule.py` `StepClock`): each step point of a schedule as the
  position where it took effect, and the step the save was at, so that a resume with
  another global batch puts the past where it was and the future at the new batch;
* `slots` (per_batch): the global batch of each stretch of positions, a slot being one
  global batch of the run that reaches it;
* the sources by name and fingerprint, `base` (samples and tokens served before the
  plan's position 0, after a restart) and `retired` (the counts of removed sources).

A version-1 mixture state (no clock) is converted from the global batch it records
(`step_samples`, or the loader's `global_batch_size`).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from llm.data.mix.schedule import MixSchedule, StepClock, parse_schedule, past_change
from llm.data.shards.read.state import StateError

MIX_STATE_VERSION = 2


@dataclass(frozen=True)
class MixHistory:
    """The past a resumed mixture rebuilds its plan from (empty: a fresh run)."""

    clock: StepClock = field(default_factory=StepClock)
    slots: tuple[tuple[int, int], ...] = ()  # (plan position, samples per slot) of a per_batch mixture
    base: tuple[int, int] = (0, 0)  # samples and tokens served before plan position 0
    retired: dict[str, dict[str, int | None]] = field(default_factory=dict)  # removed sources' counts


@dataclass(frozen=True)
class SavedMix:
    """A checked `mixture` part of a loader state."""

    weights: list[float]
    anchor: np.ndarray
    counts: np.ndarray
    batching: str
    schedule: MixSchedule | None
    history: MixHistory
    sources: list[tuple[str, str]] | None  # (name, fingerprint); None in a version-1 state
    version: int
    served: tuple[int, int] | None  # samples and tokens served in all (None in a version-1 state)
    tokens: list[int | None]  # tokens each source served (None: not counted by the run that saved it)


def _pairs(raw: Any, key: str) -> list[tuple[int, int]]:
    try:
        out = [(int(a), int(b)) for a, b in raw]
    except (TypeError, ValueError):
        raise StateError(f"loader state key 'mixture' has {key} {raw!r}; expected [[position, samples], ...]") from None
    if any(a < 0 or b < 1 for a, b in out):
        raise StateError(f"loader state key 'mixture' has {key} {raw!r}; expected positions >= 0 and sizes >= 1")
    return out


def read_saved(state: dict[str, Any]) -> SavedMix | None:
    """The mixture part of `state`, parsed and checked (None: a state without one); StateError naming the key."""
    mixture = state.get("mixture")
    if not mixture:
        return None
    if not isinstance(mixture, dict):
        raise StateError(f"loader state key 'mixture' is {mixture!r}; pass the dict returned by state_dict() unchanged")
    try:
        weights = [float(w) for w in mixture["weights"]]
        anchor = np.asarray(mixture["anchor"], dtype=np.int64)
        counts = np.asarray(mixture["counts"], dtype=np.int64)
    except (KeyError, TypeError, ValueError):
        raise StateError("loader state key 'mixture' must hold weights, anchor and counts lists") from None
    k = len(weights)
    if anchor.shape != (k,) or counts.shape != (k,) or (counts < 0).any():  # another count of sources: match_sources
        raise StateError(f"loader state key 'mixture' does not describe {k} datasets: {mixture!r}")
    version = mixture.get("version", 1)
    if version not in (1, MIX_STATE_VERSION):
        raise StateError(f"loader state key 'mixture' has version {version!r}, expected 1 or {MIX_STATE_VERSION}")
    try:
        schedule = parse_schedule(mixture["schedule"], k, "loader state key 'mixture'", sum_to_one=False) \
            if mixture.get("schedule") else None
        clock = StepClock.from_dict(mixture["clock"], "loader state key 'mixture' clock") if "clock" in mixture else None
    except ValueError as e:
        raise StateError(str(e)) from None
    batching = mixture.get("batching", "stratified")
    per_slot = mixture.get("unit", 1)
    slots = _pairs(mixture.get("slots", [[0, per_slot]]), "slots") if batching == "per_batch" else []
    served = int((counts - anchor).sum())
    if clock is None:  # version 1: step points were at step x its global batch, which it records
        per_step = mixture.get("step_samples", state.get("global_batch_size"))
        points = schedule.change_points() if schedule is not None and schedule.unit == "step" else []
        if points[1:] and not isinstance(per_step, int):
            raise StateError("loader state key 'mixture' (version 1) records no global batch, so its step points "
                             "cannot be turned into positions for another batch size; resume it with the "
                             "StreamingDataLoader.state_dict() it was saved as")
        # the clock stands at the saved position either way: a per_batch slot size changed now starts there
        clock = StepClock().advance(points, int(per_step) if isinstance(per_step, int) and per_step > 0 else 1, served)
    base = mixture.get("base", [0, 0])
    retired = mixture.get("retired", {})
    sources = mixture.get("sources")
    try:
        base_t = (int(base[0]), int(base[1]))
        retired = {str(name): {"samples": int(c["samples"]), "tokens": None if c["tokens"] is None else int(c["tokens"])}
                   for name, c in retired.items()}
        src = [(str(a), str(b)) for a, b in sources] if sources is not None else None
        served_t = (int(mixture["served"][0]), int(mixture["served"][1])) if "served" in mixture else None
        tokens = [None if t is None else int(t) for t in mixture.get("tokens", [None] * k)]
    except (TypeError, ValueError, KeyError, IndexError):
        raise StateError(f"loader state key 'mixture' has a malformed base, retired or sources entry: {mixture!r}") \
            from None
    if src is not None and len(src) != k:
        raise StateError(f"loader state key 'mixture' lists {len(src)} sources for {k} weights")
    history = MixHistory(clock, tuple(slots), base_t, retired)
    return SavedMix(weights, anchor, counts, batching, schedule, history, src, version, served_t, tokens)


def served_units(saved: SavedMix, tokens_since_anchor: int | None) -> dict[str, int]:
    """Steps, samples and tokens the run that saved `saved` had served (a schedule's units)."""
    samples = saved.history.base[0] + int((saved.counts - saved.anchor).sum())
    if saved.served is not None:
        tokens = saved.served[1]
    else:
        tokens = saved.history.base[1] + (tokens_since_anchor or 0)
    return {"step": saved.history.clock.step, "samples": samples, "tokens": tokens}


def restart_history(saved: SavedMix, names: list[str], tokens_since_anchor: int | None) -> MixHistory:
    """The past of a plan that starts over at position 0 (new weights or sources): steps, samples and
    tokens served carry on for the schedule, and removed sources keep their counts."""
    served = served_units(saved, tokens_since_anchor)
    retired = dict(saved.history.retired)
    for i, (name, _) in enumerate(saved.sources or []):
        if name not in names:
            retired[name] = {"samples": int(saved.counts[i]), "tokens": saved.tokens[i]}
    return MixHistory(StepClock(served["step"], 0, {}), (), (served["samples"], served["tokens"]), retired)


def check_batching(saved: SavedMix, batching: str) -> None:
    if saved.batching != batching:
        raise StateError(f"loader state key 'mixture' was saved with batching={saved.batching!r} but this mixture has "
                         f"batching={batching!r}; resume a mixture with the batching it was saved with")


def check_past(saved: SavedMix, schedule: MixSchedule, served: dict[str, int]) -> None:
    """A schedule may change only what was not served: StateError naming the first point that would move the past."""
    old = saved.schedule or MixSchedule(((0, tuple(saved.weights), None),), schedule.unit)
    if len(old.points) == 1 and old.unit != schedule.unit:  # constant weights: the same in every unit
        old = MixSchedule(old.points, schedule.unit)
    why = past_change(old, schedule, served[old.unit], "schedule")
    if why is not None:
        raise StateError(why)


def match_sources(saved: SavedMix, names: list[str], fingerprints: list[str], folders: list[str],
                  allow: bool) -> list[int | None] | None:
    """Each current source's index in the state (None: a new source), or None when the list is unchanged.

    Without `allow` a changed list is refused naming the option; with it, an ambiguous match is
    one sentence naming the source: two sources of one name, or the same name over other data.
    """
    now = list(zip(names, fingerprints))
    if saved.sources is None and len(saved.weights) != len(names):
        raise StateError(
            f"loader state key 'mixture' (version 1) holds {len(saved.weights)} sources but this mixture has "
            f"{len(names)}, and it does not name them, so they cannot be matched; resume it once with the sources it "
            "was saved with (its next state names them, and allow_source_changes=True can then change them)"
        )
    if saved.sources is None or saved.sources == now:
        return None
    if not allow:
        raise StateError(
            f"loader state was saved with the sources {[n for n, _ in saved.sources]} but this mixture has {names}; "
            "pass CombinedStreamingDataset(..., allow_source_changes=True) to resume kept sources where they were, "
            "start new ones at their beginning and keep removed ones' counts"
        )
    for label, listed in (("this mixture", folders), ("the state", [n.split("#")[0] for n, _ in saved.sources])):
        twice = [name for name, c in Counter(listed).items() if c > 1]
        if twice:
            raise StateError(f"{label} has two sources named {twice[0]!r}; allow_source_changes matches sources by "
                             "name, so give each source a folder of its own name")
    old = {name: (i, fp) for i, (name, fp) in enumerate(saved.sources)}
    out: list[int | None] = []
    for name, fp in now:
        if name in old and old[name][1] != fp:
            raise StateError(f"source {name!r} holds other data than the source of that name in the state (its "
                             "fingerprint changed); resume with its old data, or remove it on one resume and add it "
                             "back under another name")
        out.append(old[name][0] if name in old else None)
    return out
