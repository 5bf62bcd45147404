"""Mixture weight schedules (`streaming_mixing_schedule`, `schedule=`): weights by training step, checked once.

A schedule is a list of points `{step, weights}` (first at step 0, steps increasing),
piecewise constant: a point's weights hold from its step until the next point. A point
with `interpolate: linear` ramps to the next point's weights instead, in RAMP_STEPS even
steps (each a change point: the mixtures switch weights only at change points, which is
what keeps a stop and resume across a ramp exact). Both the text mixture and
`CombinedStreamingDataset` read schedules from here; a resume may change the schedule
only for steps that have not happened (`check_past`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from llm.data.mix.weights import check_weights

INTERPOLATIONS = ("linear",)
RAMP_STEPS = 100  # a linear ramp switches weights this many times, evenly spaced


@dataclass(frozen=True)
class MixSchedule:
    """Points (step, weights, interpolate) in step order; `weights_at(step)` is the mixture at a step."""

    points: tuple[tuple[int, tuple[float, ...], str | None], ...]

    @classmethod
    def constant(cls, weights: Sequence[float]) -> MixSchedule:
        return cls(((0, tuple(float(w) for w in weights), None),))

    def as_list(self) -> list[dict[str, Any]]:
        """The YAML form (also what a state saves)."""
        out: list[dict[str, Any]] = []
        for step, weights, interpolate in self.points:
            point: dict[str, Any] = {"step": step, "weights": list(weights)}
            if interpolate:
                point["interpolate"] = interpolate
            out.append(point)
        return out

    def change_points(self) -> list[int]:
        """Every step at which the weights change (ramps in RAMP_STEPS steps), sorted."""
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

    def past_differs(self, other: MixSchedule, step: int) -> int | None:
        """The first step before `step` at which the two schedules give other weights (None: the past agrees)."""
        for c in sorted(set(self.change_points()) | set(other.change_points())):
            if c >= step:
                return None
            if any(abs(a - b) > 1e-12 for a, b in zip(self.weights_at(c), other.weights_at(c))):
                return c
        return None


def parse_schedule(raw: Any, n: int, key: str = "streaming_mixing_schedule", sum_to_one: bool = True) -> MixSchedule:
    """A checked schedule for `n` sources, or one ValueError naming the key and the value."""
    if isinstance(raw, MixSchedule):
        raw = raw.as_list()
    if not isinstance(raw, (list, tuple)) or not raw:
        raise ValueError(f"{key} is {raw!r}; give a list of {{step, weights}} points, the first at step 0")
    points = []
    for i, point in enumerate(raw):
        where = f"{key}[{i}]"
        if not isinstance(point, dict):
            raise ValueError(f"{where} is {point!r}, not a {{step, weights}} mapping")
        unknown = sorted(set(point) - {"step", "weights", "interpolate"})
        if unknown:
            raise ValueError(f"{where} has the unknown key {unknown[0]!r}; a point has step, weights and interpolate")
        step = point.get("step")
        if isinstance(step, bool) or not isinstance(step, int) or step < 0:
            raise ValueError(f"{where}.step is {step!r}; expected a whole number of steps >= 0")
        if i == 0 and step != 0:
            raise ValueError(f"{where}.step is {step}; the first point of a schedule is at step 0")
        if points and step <= points[-1][0]:
            raise ValueError(f"{where}.step is {step} but {key}[{i - 1}] is at step {points[-1][0]}; "
                             "list the points in increasing step order")
        weights = check_point_weights(point.get("weights"), n, f"{where}.weights", sum_to_one)
        interpolate = point.get("interpolate")
        if interpolate is not None and interpolate not in INTERPOLATIONS:
            raise ValueError(f"{where}.interpolate is {interpolate!r}; use linear (or leave it out for a step change)")
        points.append((step, tuple(weights), interpolate))
    if points[-1][2]:
        raise ValueError(f"{key}[{len(points) - 1}].interpolate is linear but no point follows it to ramp to")
    return MixSchedule(tuple(points))


def check_point_weights(weights: Any, n: int, key: str, sum_to_one: bool) -> list[float]:
    """One point's weights through the mix room's one check (weights.py), as shares summing to 1."""
    check_weights(weights, n, key, sum_to_one=sum_to_one)
    total = float(sum(weights))
    return [float(w) / total for w in weights]
