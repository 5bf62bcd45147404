"""The text stream's position, weight schedule segment and per-source counts: its part of the state.

`StreamingTextDataModule` holds one `MixProgress`. It counts where the run is, in the
three units a schedule may use, the same on every rank: `step` (batches handed over),
`samples` (the global batch, batch_size x world_size, added per step) and `tokens` (the
global batch's tokens, samples x max_seq_len, padding included, as a token budget counts
a batch). They are counted, never derived from the step, so they stay right when a
resume changes the global batch size. Per source it also counts the tokens and samples
(rows) handed over (`consumed`, exact: added when a batch is handed over, like the cursors).

A mixture (weights or a schedule) holds a segment: the change point whose weights are
served and the anchors, each partition's (records, tokens) when that segment began, from
which the mixture counts each segment's shares. A step takes the weights of the position
where it begins; the module restarts its workers at a change point, so a switch happens
at the same batch in a straight run and in any resumed one. Every segment entered is kept
with its step, samples and tokens (`reached`): a step point is thereby kept as a sample
and token count once reached, so a resume may continue it under a schedule by samples or
tokens (`past_in`), at any global batch size.
"""

from __future__ import annotations

from typing import Any

from llm.data.mix.schedule import MixSchedule, parse_schedule, past_change, whole
from llm.data.stage import StateError

POSITIONS = ("step", "samples", "tokens")
KEY = "streaming_mixing_schedule"


class MixProgress:
    """Position, schedule segment and anchors, and per-source (tokens, samples) of one rank of a text stream."""

    def __init__(self, names: list[str], schedule: MixSchedule | None = None, weights: list[float] | None = None,
                 seq_len: int = 1):
        self.names = list(names)
        self.seq_len = seq_len  # the tokens of one sample: a step's tokens are its global batch times this
        # a mixture with fixed weights has the one segment of a constant schedule: on a change of
        # sources its shares still count from the resume, not from the pass's start
        self.mixed = schedule is not None or weights is not None
        self.schedule = schedule or (MixSchedule.constant(weights) if weights is not None else None)
        self.given = schedule is not None  # a schedule of the config's (not fixed weights)
        self.step = self.samples = self.tokens = 0
        self.segment: int | None = 0  # the change point the anchors were taken at (None: take them now)
        self.anchors: dict[str, list[int]] = {}
        self.reached: dict[int, list[int]] = {}  # change point -> [step, samples, tokens] where it took effect
        self.consumed: dict[str, list[int]] = {name: [0, 0] for name in self.names}

    # -- the schedule ------------------------------------------------------------------------
    def position(self, unit: str | None = None) -> int:
        """Where the run is, in `unit` (the schedule's by default)."""
        unit = unit or (self.schedule.unit if self.schedule else "step")
        return {"step": self.step, "samples": self.samples, "tokens": self.tokens}[unit]

    def weights_now(self) -> list[float] | None:
        """The schedule's weights here (None: the mixture's own)."""
        return self.schedule.weights_at(self.position()) if self.given and self.schedule else None

    def at_change(self) -> bool:
        """Whether the next step begins in another segment than the one served: the workers must restart."""
        return self.schedule is not None and self.schedule.segment_start(self.position()) != self.segment

    def enter_segment(self, cursors: dict[str, dict], keys: list[str]) -> None:
        """At a change point not yet anchored: each partition's counts now are where its new shares start."""
        if self.schedule is None:
            return
        start = self.schedule.segment_start(self.position())
        if start == self.segment:
            return
        for key in keys:
            cursor = cursors.get(key, {})
            self.anchors[key] = [int(cursor.get("records", 0)), int(cursor.get("tokens", 0))]
        self.segment = start
        if start:  # a change point reached now (0 took effect at 0; a segment entered again is kept as first reached)
            self.reached.setdefault(start, [self.step, self.samples, self.tokens])

    def new_pass(self, keys: list[str]) -> None:
        """The cursors of these partitions start over: so do their anchors."""
        for key in keys:
            self.anchors.pop(key, None)

    # -- accounting ----------------------------------------------------------------------------
    def handed_over(self, counts: dict[int, list[int]], global_batch: int) -> None:
        """One batch went to the caller: count its step, the global batch's samples and tokens, its rows per source."""
        self.step += 1
        self.samples += global_batch
        self.tokens += global_batch * self.seq_len
        for source, (tokens, rows) in counts.items():
            tally = self.consumed.setdefault(self.names[int(source)], [0, 0])
            tally[0] += int(tokens)
            tally[1] += int(rows)

    def source_counts(self) -> dict[str, dict[str, int]]:
        """This rank's consumption so far: {name: {"tokens", "samples"}}, tokens being trained tokens."""
        return {name: {"tokens": t, "samples": n} for name, (t, n) in self.consumed.items()}

    # -- state ----------------------------------------------------------------------------------
    def state(self, rank: int, own: set[str]) -> dict[str, Any]:
        out: dict[str, Any] = {"step": self.step, "samples": self.samples, "tokens": self.tokens,
                               "sources": list(self.names),
                               "consumed": {str(rank): {k: list(v) for k, v in self.consumed.items()}}}
        if self.schedule is not None:
            out["mix"] = {"schedule": self.schedule.as_list(), "segment": self.segment,
                          "anchors": {k: list(v) for k, v in self.anchors.items() if k in own},
                          "reached": [[c, *at] for c, at in sorted(self.reached.items())]}
        return out

    def check(self, state: dict[str, Any], sources_changed: bool = False) -> None:
        """StateError naming the key of a malformed part, or a schedule that rewrites what was served."""
        for unit in POSITIONS:
            if not whole(state.get(unit, 0)):
                raise StateError(f"data state key {unit!r} is {state.get(unit)!r}; expected a whole number >= 0")
        consumed = state.get("consumed", {})
        if not isinstance(consumed, dict) or not all(
            isinstance(per, dict) and all(isinstance(v, list) and len(v) == 2 and all(whole(x) for x in v)
                                          for v in per.values())
            for per in consumed.values()
        ):
            raise StateError(f"data state key 'consumed' is {consumed!r}; expected {{rank: {{source: [tokens, samples]}}}}")
        mix = state.get("mix")
        if mix is None:
            return
        anchors = mix.get("anchors") if isinstance(mix, dict) else None
        reached = mix.get("reached", []) if isinstance(mix, dict) else None
        if not isinstance(anchors, dict) or not all(
            isinstance(v, list) and len(v) == 2 and all(whole(x) for x in v) for v in anchors.values()
        ) or not whole(mix.get("segment", 0)) or not isinstance(reached, list) or not all(
            isinstance(r, list) and len(r) == 4 and all(whole(x) for x in r) for r in reached
        ):
            raise StateError(f"data state key 'mix' is {mix!r}; expected {{schedule, segment, anchors, reached}}")
        if not self.given or sources_changed:  # fixed weights may change; new sources count from the resume
            return
        n = len(self.schedule.points[0][1])  # type: ignore[union-attr]
        try:
            saved = parse_schedule(mix.get("schedule"), n, "data state key 'mix'", sum_to_one=False)
        except ValueError as e:
            raise StateError(str(e)) from None
        why = past_change(*self._comparable(saved, state), KEY)
        if why is not None:
            raise StateError(why)

    def _comparable(self, saved: MixSchedule, state: dict[str, Any]) -> tuple[MixSchedule, MixSchedule, int]:
        """(saved, new, served) in one unit: a saved step schedule in samples or tokens where its points took effect.

        A state without positions (version <= 2) served the rows it counts; its change points after
        the first have no position, so only a schedule by step can be checked against those.
        """
        new = self.schedule
        unit, step = new.unit, state.get("step", 0)  # type: ignore[union-attr]
        if saved.unit != "step" or unit == "step":  # one unit (or past_change's sentence for two)
            return saved, new, state.get(saved.unit, 0)  # type: ignore[return-value]
        past = [(c, w) for c, w in saved.segments() if c < step]
        reached = {r[0]: r[1:] for r in state["mix"].get("reached", [])} | {0: [0, 0, 0]}
        if any(c not in reached for c, _ in past):
            raise StateError(self._unconvertible(state, unit))
        served = state.get(unit)
        if served is None:  # a state without positions: the rows it handed over, all at its first weights
            per_rank = state.get("consumed", {})
            if step and not per_rank:
                raise StateError(self._unconvertible(state, unit))
            served = sum(v[1] for per in per_rank.values() for v in per.values()) * (self.seq_len if unit == "tokens" else 1)
        points = tuple((reached[c][POSITIONS.index(unit)], tuple(w), None) for c, w in past)
        return MixSchedule(points, unit), new, served  # type: ignore[return-value]

    @staticmethod
    def _unconvertible(state: dict[str, Any], unit: str) -> str:
        return (f"the data state (version {state.get('version', 1)}) keeps its mixture's change points as steps, "
                f"without the {unit} where they took effect, so {KEY} by {unit} cannot be checked against what it "
                f"served; resume it under its schedule by step (at any global batch size), then save again")

    def restore(self, state: dict[str, Any], rank: int, same_topology: bool, global_batch: int,
                sources_changed: bool = False) -> None:
        """Take a checked state's position, segment and counts (all ranks' counts on rank 0 on another topology).

        A state from before positions were kept (version <= 2) counts its samples from the rows it handed
        over (exact), or from its steps at this run's global batch when it has no counts either.
        """
        self.step = int(state.get("step", 0))
        per_rank = state.get("consumed", {})
        rows = sum(v[1] for per in per_rank.values() for v in per.values())
        self.samples = int(state.get("samples", rows if per_rank else self.step * global_batch))
        self.tokens = int(state.get("tokens", self.samples * self.seq_len))
        mix = state.get("mix") or {}
        self.anchors = {k: [int(x) for x in v] for k, v in mix.get("anchors", {}).items()}
        self.segment = int(mix.get("segment", 0))
        self.reached = {int(r[0]): [int(x) for x in r[1:]] for r in mix.get("reached", [])}
        saved = mix.get("schedule")
        unit = self.schedule.unit if self.schedule is not None else "step"
        if (self.given and self.segment in self.reached and not sources_changed and isinstance(saved, list) and saved
                and "step" in saved[0] and unit != "step"):
            # a step schedule continued by samples or tokens: its segment is where that point took effect
            self.segment = self.reached[self.segment][POSITIONS.index(unit)]
            self.reached = {at[POSITIONS.index(unit)]: at for at in self.reached.values()}
        if sources_changed and self.mixed:  # the shares start again here, from every partition's cursor
            self.anchors, self.segment = {}, None
        self.consumed = {name: [0, 0] for name in self.names}
        taken = [per_rank.get(str(rank), {})] if same_topology else (list(per_rank.values()) if rank == 0 else [])
        for counts in taken:
            for name, (tokens, samples) in counts.items():
                tally = self.consumed.setdefault(name, [0, 0])
                tally[0] += tokens
                tally[1] += samples
