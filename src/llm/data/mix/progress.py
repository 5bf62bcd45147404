"""The text stream's step count, weight schedule position and per-source counts: its part of the state.

`StreamingTextDataModule` holds one `MixProgress`. It counts the batches this rank has
handed over (`step`, the same on every rank) and, per source, the tokens and samples
(rows) in them (`consumed`, exact: added when a batch is handed over, like the cursors).
With a weight schedule it also holds the anchors: each partition's (records, tokens) at
the schedule's last change point, from which the mixture counts each segment's shares;
the module restarts its workers at every change point, so a switch happens at the same
batch in a straight run and in any resumed one.
"""

from __future__ import annotations

from typing import Any

from llm.data.mix.schedule import MixSchedule, parse_schedule
from llm.data.stage import StateError


def _whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


class MixProgress:
    """Step, schedule anchors and per-source (tokens, samples) of one rank of a text stream."""

    def __init__(self, names: list[str], schedule: MixSchedule | None = None, weights: list[float] | None = None):
        self.names = list(names)
        self.schedule = schedule
        self.weights = weights  # a mixture's fixed weights (None: a single source)
        self.step = 0
        self.segment = 0  # the change point the anchors were taken at
        self.anchors: dict[str, list[int]] = {}
        self.consumed: dict[str, list[int]] = {name: [0, 0] for name in self.names}

    # -- the schedule ------------------------------------------------------------------------
    def weights_now(self) -> list[float] | None:
        """The schedule's weights at this step (None: the mixture's own)."""
        return self.schedule.weights_at(self.step) if self.schedule else None

    def stop_at(self) -> int | None:
        """The step at which the workers must stop for new weights (None: never)."""
        return self.schedule.next_change(self.step) if self.schedule else None

    def enter_segment(self, cursors: dict[str, dict], keys: list[str]) -> None:
        """At a change point not yet anchored: each partition's counts now are where its new shares start."""
        if self.schedule is None:
            return
        start = self.schedule.segment_start(self.step)
        if start == self.segment:
            return
        for key in keys:
            cursor = cursors.get(key, {})
            self.anchors[key] = [int(cursor.get("records", 0)), int(cursor.get("tokens", 0))]
        self.segment = start

    def new_pass(self, keys: list[str]) -> None:
        """The cursors of these partitions start over: so do their anchors."""
        for key in keys:
            self.anchors.pop(key, None)

    # -- accounting ----------------------------------------------------------------------------
    def handed_over(self, counts: dict[int, list[int]]) -> None:
        """One batch went to the caller: count its step and its rows' tokens and samples per source."""
        self.step += 1
        for source, (tokens, rows) in counts.items():
            tally = self.consumed.setdefault(self.names[int(source)], [0, 0])
            tally[0] += int(tokens)
            tally[1] += int(rows)

    def source_counts(self) -> dict[str, dict[str, int]]:
        """This rank's consumption so far: {name: {"tokens", "samples"}}, tokens being trained tokens."""
        return {name: {"tokens": t, "samples": n} for name, (t, n) in self.consumed.items()}

    # -- state ----------------------------------------------------------------------------------
    def state(self, rank: int, own: set[str]) -> dict[str, Any]:
        out: dict[str, Any] = {"step": self.step,
                               "consumed": {str(rank): {k: list(v) for k, v in self.consumed.items()}}}
        if self.weights is not None or self.schedule is not None:
            saved = self.schedule or MixSchedule.constant(self.weights or [])
            out["mix"] = {"schedule": saved.as_list(), "segment": self.segment,
                          "anchors": {k: list(v) for k, v in self.anchors.items() if k in own}}
        return out

    def check(self, state: dict[str, Any]) -> None:
        """StateError naming the key of a malformed part, or a schedule that rewrites the past."""
        step = state.get("step", 0)
        if not _whole(step):
            raise StateError(f"data state key 'step' is {step!r}; expected a whole number of batches >= 0")
        consumed = state.get("consumed", {})
        if not isinstance(consumed, dict) or not all(
            isinstance(per, dict) and all(isinstance(v, list) and len(v) == 2 and all(_whole(x) for x in v)
                                          for v in per.values())
            for per in consumed.values()
        ):
            raise StateError(f"data state key 'consumed' is {consumed!r}; expected {{rank: {{source: [tokens, samples]}}}}")
        mix = state.get("mix")
        if mix is None:
            return
        anchors = mix.get("anchors") if isinstance(mix, dict) else None
        if not isinstance(anchors, dict) or not all(
            isinstance(v, list) and len(v) == 2 and all(_whole(x) for x in v) for v in anchors.values()
        ) or not _whole(mix.get("segment", 0)):
            raise StateError(f"data state key 'mix' is {mix!r}; expected {{schedule, segment, anchors}}")
        if self.schedule is None:
            return
        try:
            saved = parse_schedule(mix.get("schedule"), len(self.schedule.points[0][1]), "data state key 'mix'",
                                   sum_to_one=False)
        except ValueError as e:
            raise StateError(str(e)) from None
        changed = self.schedule.past_differs(saved, step)
        if changed is not None:
            raise StateError(
                f"streaming_mixing_schedule gives other weights at step {changed} than the run that saved this "
                f"state, which has trained to step {step}; change the schedule only from step {step} on"
            )

    def restore(self, state: dict[str, Any], rank: int, same_topology: bool) -> None:
        """Take a checked state's step, anchors and counts (all ranks' counts on rank 0 on another topology)."""
        self.step = int(state.get("step", 0))
        mix = state.get("mix") or {}
        self.anchors = {k: [int(x) for x in v] for k, v in mix.get("anchors", {}).items()}
        self.segment = int(mix.get("segment", 0))
        self.consumed = {name: [0, 0] for name in self.names}
        per_rank = state.get("consumed", {})
        taken = [per_rank.get(str(rank), {})] if same_topology else (list(per_rank.values()) if rank == 0 else [])
        for counts in taken:
            for name, (tokens, samples) in counts.items():
                tally = self.consumed.setdefault(name, [0, 0])
                tally[0] += tokens
                tally[1] += samples
