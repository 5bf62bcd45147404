"""Mixture weight schedules (`streaming_mixing_schedule`, `schedule=`): weights by step, samples or tokens, checked once.

A schedule is a list of points `{step | samples | tokens: k, weights, interpolate?}`, one
position key per point and one kind per schedule (its `unit`), the first at 0, positions
increasing, piecewise constant: a point's weights hold from its position until the next
point. A point with `interpolate: linear` ramps to the next point's weights instead, in
RAMP_STEPS even steps (each a change point: the mixtures switch weights only at change
points, which is what keeps a stop and resume across a ramp exact). Both the text mixture
and `CombinedStreamingDataset` read schedules from here.

Why samples and tokens: a step is one global batch, so a step point moves when a resume
changes the batch size. The mixtures therefore turn a step point into a position (samples
or tokens served) when it is first reached and keep it so (`StepClock`): the past stays
where it was served, and a point not reached yet lands `(point - step) * new batch` after
the clock. A resume may change the schedule only where nothing was served (`past_change`,
which compares the segments actually served: a past point with unchanged weights is
refused too, since a new segment restarts the slot table and would move what was read).
"""

from __future__ import annotations

import numbers
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from llm.data.mix.weights import check_weights

INTERPOLATIONS = ("linear",)
UNITS = ("step", "samples", "tokens")
RAMP_STEPS = 100  # a linear ramp switches weights this many times, evenly spaced


@dataclass(frozen=True)
class MixSchedule:
    """Points (position, weights, interpolate) in order, in `unit`; `weights_at(k)` is the mixture at position k."""

    points: tuple[tuple[int, tuple[float, ...], str | None], ...]
    unit: str = "step"

    @classmethod
    def constant(cls, weights: Sequence[float]) -> MixSchedule:
        return cls(((0, tuple(float(w) for w in weights), None),))

    def as_list(self) -> list[dict[str, Any]]:
        """The YAML form (also what a state saves), each point under its unit's key."""
        out: list[dict[str, Any]] = []
        for at, weights, interpolate in self.points:
            point: dict[str, Any] = {self.unit: at, "weights": list(weights)}
            if interpolate:
                point["interpolate"] = interpolate
            out.append(point)
        return out

    def change_points(self) -> list[int]:
        """Every position at which the weights change (ramps in RAMP_STEPS steps), sorted."""
        steps: set[int] = set()
        for k, (step, _, interpolate) in enumerate(self.points):
            steps.add(step)
            if interpolate and k + 1 < len(self.points):
                span = self.points[k + 1][0] - step
                steps.update(step + j * span // RAMP_STEPS for j in range(RAMP_STEPS))
        return sorted(steps)

    def segment_start(self, step: int) -> int:
        """The last change point at or before `step`: the weights of `step` hold from there."""
        return max(c for c in self.change_points() if c <= step)

    def next_change(self, step: int) -> int | None:
        """The first change point after `step` (None: the weights never change again)."""
        return next((c for c in self.change_points() if c > step), None)

    def weights_at(self, step: int) -> list[float]:
        """The mixture's weights at `step` (a ramp's weights are those of its last change point)."""
        at = self.segment_start(max(step, 0))
        k = max(i for i, p in enumerate(self.points) if p[0] <= at)
        start, weights, interpolate = self.points[k]
        if not interpolate or k + 1 >= len(self.points) or at == start:
            return list(weights)
        end, target, _ = self.points[k + 1]
        t = (at - start) / (end - start)
        mixed = [a + (b - a) * t for a, b in zip(weights, target)]
        total = sum(mixed)
        return [w / total for w in mixed]

    def segments(self) -> list[tuple[int, list[float]]]:
        """(change point, weights from there) in order: what a mixture serves, segment by segment."""
        return [(c, self.weights_at(c)) for c in self.change_points()]

    def past_differs(self, other: MixSchedule, step: int) -> int | None:
        """The first step before `step` at which the two schedules give other weights (None: the past agrees)."""
        for c in sorted(set(self.change_points()) | set(other.change_points())):
            if c >= step:
                return None
            if any(abs(a - b) > 1e-12 for a, b in zip(self.weights_at(c), other.weights_at(c))):
                return c
        return None


def past_change(saved: MixSchedule, new: MixSchedule, served: int, key: str = "schedule") -> str | None:
    """Why `new` would rewrite what `saved` served before position `served` (its unit), or None.

    Compares the segments actually served, start and weights: a change point added, moved or
    removed before `served`, or other weights in a served segment, is one sentence naming it.
    """
    unit = saved.unit
    if new.unit != unit:
        return (f"{key} is by {new.unit} but the run that saved this state had a schedule by {unit}; "
                f"resume with its points by {unit} (they may change only from {unit} {served} on)")
    old = [c for c in saved.change_points() if c < served]
    now = [c for c in new.change_points() if c < served]
    for c in sorted(set(old) | set(now)):
        if any(abs(a - b) > 1e-12 for a, b in zip(saved.weights_at(c), new.weights_at(c))):
            return (f"{key} gives other weights at {unit} {c} than the run that saved this state, which has "
                    f"read to {unit} {served}; change the schedule only from {unit} {served} on")
        if (c in old) != (c in now):  # the same weights, but a segment (and its slot table) starts or not
            return (f"{key} {'has a' if c in now else 'has no'} change point at {unit} {c} where the run that saved "
                    f"this state, which has read to {unit} {served}, had {'none' if c in now else 'one'}; a change "
                    f"point in the past moves what was read, so change the schedule only from {unit} {served} on")
    return None


@dataclass(frozen=True)
class StepClock:
    """A step schedule's change points as positions: those reached kept, the later ones counted from the clock.

    `reached` maps each change point already reached (a step) to the position (samples or
    tokens served) where it took effect; the clock says step `step` began at `position`.
    A change point not reached yet is `position + (point - step) * per_step`, `per_step` being
    the positions of one step now (the global batch); a resume with another batch keeps
    `reached` and restarts the clock where it stopped, so the past never moves.
    """

    step: int = 0
    position: int = 0
    reached: dict[int, int] = field(default_factory=dict)

    def positions(self, change_points: Sequence[int], per_step: int) -> list[int]:
        """Every change point as a position."""
        return [self.reached[c] if c in self.reached else self.position + (c - self.step) * per_step
                for c in change_points]

    def advance(self, change_points: Sequence[int], per_step: int, position: int) -> StepClock:
        """The clock at `position` (read at `per_step` since this clock), change points up to its step reached."""
        step = self.step + -(-(position - self.position) // per_step)
        at = self.positions(change_points, per_step)
        # a point from before the clock's stretch (a plan started over at position 0) holds from 0
        reached = {**self.reached,
                   **{c: max(0, p) for c, p in zip(change_points, at) if c <= step and c not in self.reached}}
        return StepClock(step, position, reached)

    def as_dict(self) -> dict[str, Any]:
        return {"step": self.step, "position": self.position, "reached": sorted([c, p] for c, p in self.reached.items())}

    @classmethod
    def from_dict(cls, raw: Any, key: str) -> StepClock:
        """A saved clock, or one ValueError naming `key`."""
        try:
            step, position = raw["step"], raw["position"]
            reached = {c: p for c, p in raw["reached"]}
        except (KeyError, TypeError, ValueError):
            raise ValueError(f"{key} is {raw!r}; expected {{step, position, reached: [[step, position], ...]}}") from None
        if not all(whole(v) for v in (step, position, *reached, *reached.values())):
            raise ValueError(f"{key} is {raw!r}; its steps and positions must be whole numbers >= 0")
        return cls(int(step), int(position), {int(c): int(p) for c, p in reached.items()})


def whole(value: Any) -> bool:
    """A whole number >= 0: Python or numpy integers, never a bool."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool) and int(value) >= 0


def parse_schedule(raw: Any, n: int, key: str = "streaming_mixing_schedule", sum_to_one: bool = True) -> MixSchedule:
    """A checked schedule for `n` sources, or one ValueError naming the key, the point and the value."""
    if isinstance(raw, MixSchedule):
        raw = raw.as_list()
    if not isinstance(raw, (list, tuple)) or not raw:
        raise ValueError(f"{key} is {raw!r}; give a list of {{step, weights}} points, the first at step 0")
    points: list[tuple[int, tuple[float, ...], str | None]] = []
    unit = ""
    for i, point in enumerate(raw):
        where = f"{key}[{i}]"
        if not isinstance(point, dict):
            raise ValueError(f"{where} is {point!r}, not a {{step, weights}} mapping")
        unknown = sorted(set(point) - {*UNITS, "weights", "interpolate"})
        if unknown:
            raise ValueError(f"{where} has the unknown key {unknown[0]!r}; a point has one of step, samples and "
                             "tokens, weights and interpolate")
        given = [u for u in UNITS if u in point]
        if len(given) != 1:
            raise ValueError(f"{where} gives {' and '.join(given) if given else 'none of step, samples and tokens'}; "
                             "a point gives exactly one of step, samples and tokens")
        if unit and given[0] != unit:
            raise ValueError(f"{where} is by {given[0]} but {key}[0] is by {unit}; give every point of a schedule "
                             f"by one of step, samples and tokens")
        unit = given[0]
        at = point[unit]
        if not whole(at):
            raise ValueError(f"{where}.{unit} is {at!r}; expected a whole number of {unit}{'s' * (unit == 'step')} >= 0")
        at = int(at)
        if i == 0 and at != 0:
            raise ValueError(f"{where}.{unit} is {at}; the first point of a schedule is at {unit} 0")
        if points and at <= points[-1][0]:
            raise ValueError(f"{where}.{unit} is {at} but {key}[{i - 1}] is at {unit} {points[-1][0]}; "
                             f"list the points in increasing {unit} order")
        weights = check_point_weights(point.get("weights"), n, f"{where}.weights", sum_to_one)
        interpolate = point.get("interpolate")
        if interpolate is not None and interpolate not in INTERPOLATIONS:
            raise ValueError(f"{where}.interpolate is {interpolate!r}; use linear (or leave it out for a step change)")
        points.append((at, tuple(weights), interpolate))
    if points[-1][2]:
        raise ValueError(f"{key}[{len(points) - 1}].interpolate is linear but no point follows it to ramp to")
    return MixSchedule(tuple(points), unit)


def check_point_weights(weights: Any, n: int, key: str, sum_to_one: bool) -> list[float]:
    """One point's weights through the mix room's one check (weights.py), as shares summing to 1."""
    check_weights(weights, n, key, sum_to_one=sum_to_one)
    total = float(sum(weights))
    return [float(w) / total for w in weights]
