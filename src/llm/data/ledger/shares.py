"""Each mixture source's share per schedule phase, from the ledger's steps, against the weights the run mixed by.

The ledger header (and, for a resumed generation, its marker's topology) records the mixture as
`{"weights", "schedule", "batching", "tokens_per_sample"}` (`mixture_spec`). Every step of the ledger
is placed where the mixture counted it: step `s` (the ledger counts steps from 1) begins at step
`s - 1`, at the samples every earlier step held (all ranks, skipped steps too: they were read), and
at those samples times `tokens_per_sample` tokens. A step belongs to the schedule phase its start
lies in; what it should hold is the weights over each of its positions (a samples or tokens point
inside a step splits it), so observed and expected counts of a phase cover the same rows.

A source whose count in a phase is off its expected count by more than `tolerance` (the 0.02 share
the mixing tests hold a mixture to, plus two slots of rounding at the phase's edges: a slot is one
sample, or one global batch with `per_batch`) is a problem: the mixture did not follow its schedule,
or the ledger's rows were edited.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from llm.data.ledger.reader import Ledger
from llm.data.mix.schedule import MixSchedule, parse_schedule

SHARE_TOLERANCE = 0.02  # of a phase's rows: what tests/data/*/test_mix*.py hold a mixture's shares to


def tolerance(rows: float, slot: int) -> float:
    """The rows a source's count in a phase of `rows` rows may be off its expected count."""
    return SHARE_TOLERANCE * rows + 2 * slot + 1


@dataclass
class Phase:
    """One schedule phase as trained: its label, steps, and rows per source observed and expected."""

    label: str
    first: int
    last: int
    observed: np.ndarray
    expected: np.ndarray
    slot: int
    compare: bool = True  # False: its shares are shown, not held to the weights (`why`)
    why: str = ""


def spec_schedule(spec: dict[str, Any], n: int) -> MixSchedule | None:
    """The schedule a mixture spec gives (constant weights: one point); None when it gives neither."""
    try:
        if spec.get("schedule"):
            return parse_schedule(spec["schedule"], n, "ledger mixture schedule", sum_to_one=False)
        if spec.get("weights") is not None:
            total = float(sum(spec["weights"]))
            return MixSchedule.constant([float(w) / total for w in spec["weights"]])
    except (ValueError, TypeError, ZeroDivisionError):
        return None
    return None


def mixture_of(ledger: Ledger) -> dict[int, dict[str, Any]]:
    """generation -> the mixture spec it ran with: its marker's (a resume may change the weights), else the header's."""
    first = next((s.get("mixture") for s in ledger.sources if isinstance(s.get("mixture"), dict)), None)
    out: dict[int, dict[str, Any]] = {}
    for g in np.unique(ledger.generations).tolist():
        marked = ((ledger.markers.get(int(g)) or {}).get("topology") or {}).get("mixture")
        spec = marked if isinstance(marked, dict) else first
        if spec is not None:
            out[int(g)] = spec
    return out


def phases(ledger: Ledger, amounts: np.ndarray, specs: dict[int, dict[str, Any]]) -> tuple[list[Phase], list[str]]:
    """Per phase, rows per source observed (`amounts`: per ledger row, per source: what it trained of each) and
    expected by the schedule; and one sentence per thing that could not be placed."""
    notes: list[str] = []
    rows = ledger.rows
    n = amounts.shape[1]
    if not len(rows) or not specs:
        return [], notes
    steps = rows["step"].astype(np.int64)
    uniq, inverse = np.unique(steps, return_inverse=True)
    held = np.bincount(inverse, minlength=len(uniq))  # rows per step, every rank, skipped too: read
    observed = np.zeros((len(uniq), n))
    np.add.at(observed, inverse[ledger.trained], amounts[ledger.trained])
    gen_of = np.zeros(len(uniq), np.int64)
    gen_of[inverse] = ledger.generations
    before = np.concatenate([[0], np.cumsum(held)[:-1]])
    if uniq[0] > 1:  # a ledger that starts later: its earlier steps held as many rows as its first
        before += (int(uniq[0]) - 1) * int(held[0])
    out: list[Phase] = []
    last_key: tuple[Any, ...] | None = None
    for k, step in enumerate(uniq.tolist()):
        spec = specs.get(int(gen_of[k]))
        schedule = spec_schedule(spec, n) if spec else None
        if schedule is None:
            continue
        if spec.get("shares_of") == "tokens" and not spec.get("tokens_per_sample"):
            note = "shares are not compared: the weights are shares of tokens, and its items differ in length"
            if note not in notes:
                notes.append(note)
            continue
        per_sample = 1
        if schedule.unit == "tokens":
            per_sample = int(spec.get("tokens_per_sample") or 0)
            if per_sample <= 0:
                note = "shares by schedule phase are not compared: its points are tokens, and its samples differ in length"
                if note not in notes:
                    notes.append(note)
                continue
        size = int(held[k])
        if schedule.unit == "step":
            start, weights = step - 1, np.asarray(schedule.weights_at(step - 1))
        else:  # the weights at each of the step's positions, in the schedule's unit
            start = int(before[k]) * per_sample
            at = start + np.arange(size) * per_sample
            changes = np.asarray(schedule.change_points())
            seg = np.searchsorted(changes, at, side="right") - 1
            weights = np.zeros(n)
            for s, count in zip(*np.unique(seg, return_counts=True)):
                weights += count * np.asarray(schedule.weights_at(int(changes[s])))
            weights /= max(size, 1)
        point = max(p for p, _, _ in schedule.points if p <= start)
        key = (point, schedule.unit, schedule.points)
        slot = size if spec.get("batching") == "per_batch" else 1
        if key != last_key or not out:  # a phase is a run of steps under one point of one schedule
            out.append(Phase(f"{schedule.unit} {point}", step, step, np.zeros(n), np.zeros(n), slot))
        last_key, phase = key, out[-1]
        phase.last = step
        phase.slot = max(phase.slot, slot)
        phase.observed += observed[k]
        phase.expected += weights * observed[k].sum()  # what the step trained, as the weights would share it
    return out, notes


def report_phases(found: list[Phase], names: list[str], scheduled: bool) -> tuple[list[str], list[str]]:
    """(lines, problems): a scheduled mixture's phases each on a line; any share off by more than the tolerance."""
    lines, problems = [], []
    for phase in found:
        total = phase.observed.sum()
        if total <= 0:
            continue
        where = f"phase from {phase.label} (steps {phase.first}-{phase.last})"
        if scheduled:
            parts = ", ".join(f"{names[s]} {phase.observed[s] / total:.4f} (expected {phase.expected[s] / total:.4f})"
                              for s in range(len(names)))
            lines.append(f"{where}: {parts}" + ("" if phase.compare else f"; not held to its weights: {phase.why}"))
        if not phase.compare:
            continue
        for s in range(len(names)):
            off = abs(phase.observed[s] - phase.expected[s])
            if off > tolerance(total, phase.slot):
                problems.append(f"{names[s]} in the {where} has share {phase.observed[s] / total:.4f} but its "
                                f"weights give {phase.expected[s] / total:.4f} (off by more than "
                                f"{tolerance(total, phase.slot) / total:.4f}); the mixture did not follow the "
                                "weights or schedule its ledger records, or the ledger was edited")
    return lines, problems
