"""A mixture's segments in plan positions: its schedule's change points and, with per_batch, its slot sizes.

Each segment starts at a plan position with one set of weights and one slot size, anchored
at the per-source counts where the previous one ends (`mix/segments.py` `MixPlan`). The
starts come from the past the state keeps (`resume.py` `MixHistory`) and the batch now:

* a step point reached is where it took effect (the clock); one not reached lands
  `(point - clock step) x global batch now` after the clock's position;
* a samples point is `samples - base`, a tokens point the first position at which the
  mixture has served that many tokens (a token block is block_size tokens), so neither
  moves when the batch changes;
* with per_batch a slot is one global batch of the run that reaches it: a resume with
  another batch starts a segment of the new slot size at its position, and a samples or
  tokens point takes effect at the next slot boundary (a global batch stays one source).

A point that falls before the plan's position 0 (after a restart) holds from 0.
"""

from __future__ import annotations

from collections.abc import Callable

from llm.data.mix.schedule import MixSchedule
from llm.data.shards.mix.resume import MixHistory

Segments = tuple[list[int], list[list[float]], list[int]]  # starts, weights, samples per slot


def slot_runs(history: MixHistory, global_batch: int, per_batch: bool) -> list[tuple[int, int]]:
    """(plan position, samples per slot) runs: 1 throughout, or each per_batch global batch from where it began."""
    if not per_batch:
        return [(0, 1)]
    runs = list(history.slots) or [(0, global_batch)]
    if runs[-1][1] != global_batch:
        at = history.clock.position
        runs = [r for r in runs if r[0] < at] + [(at, global_batch)]
    return runs


def _snap(start: int, runs: list[tuple[int, int]]) -> int:
    """The first slot boundary at or after `start`."""
    first, size = max((r for r in runs if r[0] <= start), key=lambda r: r[0])
    return first + -(-(start - first) // size) * size


def merge(points: list[tuple[int, list[float]]], runs: list[tuple[int, int]]) -> Segments:
    """Segments from schedule starts and slot runs (both from 0, in order)."""
    bounds = sorted({p for p, _ in points} | {p for p, _ in runs})
    starts, weights, per_slot = [], [], []
    for b in bounds:
        starts.append(b)
        weights.append(max((p for p in points if p[0] <= b), key=lambda p: p[0])[1])
        per_slot.append(max((r for r in runs if r[0] <= b), key=lambda r: r[0])[1])
    return starts, weights, per_slot


def segments(schedule: MixSchedule | None, first: list[float], shares: Callable[[list[float], int], list[float]],
             history: MixHistory, global_batch: int, per_batch: bool,
             tokens_position: Callable[[int, Segments], int]) -> Segments:
    """The mixture's segments; `tokens_position(tokens, segments so far)` places a tokens point."""
    runs = slot_runs(history, global_batch, per_batch)
    if schedule is None:
        return merge([(0, list(first))], runs)
    changes = schedule.change_points()
    points: list[tuple[int, list[float]]] = []
    for c, at in zip(changes, _positions(schedule, changes, history, global_batch)):
        if at is None:  # a tokens point: placed over the segments before it
            at = tokens_position(c - history.base[1], merge(points or [(0, list(first))], runs))
        at = max(0, at)
        if per_batch:
            at = _snap(at, runs)
        while points and points[-1][0] >= at:  # an earlier point overtaken: the later one holds from here
            points.pop()
        points.append((at, shares(schedule.weights_at(c), c)))
    if points[0][0] != 0:
        points.insert(0, (0, list(first)))
    return merge(points, runs)


def _positions(schedule: MixSchedule, changes: list[int], history: MixHistory, global_batch: int) -> list[int | None]:
    if schedule.unit == "step":
        return list(history.clock.positions(changes, global_batch))
    if schedule.unit == "samples":
        return [c - history.base[0] for c in changes]
    return [None] * len(changes)
