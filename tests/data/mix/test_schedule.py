"""The mix room's schedule: points by step, samples or tokens, the step clock, and the served-past check."""

from __future__ import annotations

import numpy as np
import pytest

from llm.data.mix.schedule import MixSchedule, StepClock, parse_schedule, past_change


def _points(unit: str, *points: tuple[int, list[float]]) -> list[dict]:
    return [{unit: at, "weights": w} for at, w in points]


@pytest.mark.parametrize("unit", ["step", "samples", "tokens"])
def test_a_schedule_keeps_its_unit_and_writes_the_same_key_back(unit):
    raw = _points(unit, (0, [0.7, 0.3]), (np.int64(30), [0.2, 0.8]))
    schedule = parse_schedule(raw, 2, "schedule", sum_to_one=False)
    assert schedule.unit == unit and schedule.change_points() == [0, 30]
    assert schedule.as_list() == [{unit: 0, "weights": [0.7, 0.3]}, {unit: 30, "weights": [0.2, 0.8]}]
    assert parse_schedule(schedule.as_list(), 2, "schedule") == schedule
    assert schedule.weights_at(29) == [0.7, 0.3] and schedule.weights_at(30) == [0.2, 0.8]


def test_step_schedules_keep_their_behaviour():
    schedule = parse_schedule([{"step": 0, "weights": [1, 0], "interpolate": "linear"},
                               {"step": 200, "weights": [0, 1]}], 2)
    assert schedule.unit == "step" and len(schedule.change_points()) == 101
    assert schedule == MixSchedule(schedule.points)  # "step" is the default unit


@pytest.mark.parametrize("raw, message", [
    ([{"step": 0, "samples": 0, "weights": [1, 1]}],
     r"^schedule\[0\] gives step and samples; a point gives exactly one of step, samples and tokens$"),
    ([{"weights": [1, 1]}], r"^schedule\[0\] gives none of step, samples and tokens; a point gives exactly one"),
    ([{"step": 0, "weights": [1, 1]}, {"tokens": 5, "weights": [1, 2]}],
     r"^schedule\[1\] is by tokens but schedule\[0\] is by step; give every point of a schedule by one of"),
    ([{"samples": True, "weights": [1, 1]}], r"^schedule\[0\]\.samples is True; expected a whole number of samples >= 0$"),
    ([{"tokens": 1.5, "weights": [1, 1]}], r"^schedule\[0\]\.tokens is 1.5; expected a whole number of tokens >= 0$"),
    ([{"step": -1, "weights": [1, 1]}], r"^schedule\[0\]\.step is -1; expected a whole number of steps >= 0$"),
    ([{"samples": 4, "weights": [1, 1]}], r"^schedule\[0\]\.samples is 4; the first point of a schedule is at samples 0$"),
    ([{"samples": 0, "weights": [1, 1]}, {"samples": 0, "weights": [1, 2]}],
     r"^schedule\[1\]\.samples is 0 but schedule\[0\] is at samples 0; list the points in increasing samples order$"),
    ([{"step": 0, "weights": [1, 1]}, {"step": 2, "weights": [1, float("nan")]}],
     r"^schedule\[1\]\.weights\[1\] \(datasets\[1\]\) is nan; expected a finite number >= 0"),
    ([{"step": 0, "weights": [1, 1], "at": 3}], r"^schedule\[0\] has the unknown key 'at'"),
])
def test_a_bad_point_is_one_sentence_naming_it(raw, message):
    with pytest.raises(ValueError, match=message):
        parse_schedule(raw, 2, "schedule", sum_to_one=False)


def test_numpy_positions_are_whole_numbers_and_bools_are_not():
    assert parse_schedule([{"step": np.int64(0), "weights": [1.0, 0.0]}, {"step": np.int32(3), "weights": [0.5, 0.5]}],
                          2).change_points() == [0, 3]
    with pytest.raises(ValueError, match=r"schedule\[1\]\.step is np.True_|schedule\[1\]\.step is True"):
        parse_schedule([{"step": 0, "weights": [1, 1]}, {"step": np.bool_(True), "weights": [1, 1]}], 2, "schedule",
                       sum_to_one=False)


def test_the_step_clock_keeps_reached_points_where_they_were_served():
    points = [0, 3, 10]
    clock = StepClock().advance(points, 8, 40)  # 5 batches of 8: steps 0 and 3 reached, at samples 0 and 24
    assert (clock.step, clock.position, clock.reached) == (5, 40, {0: 0, 3: 24})
    assert clock.positions(points, 4) == [0, 24, 40 + 5 * 4]  # step 10 is 5 batches of 4 after step 5
    later = clock.advance(points, 4, 64)  # 6 batches of 4 more: step 11, step 10 reached at 60
    assert later.reached == {0: 0, 3: 24, 10: 60} and later.positions(points, 12) == [0, 24, 60]
    assert StepClock.from_dict(later.as_dict(), "k") == later
    with pytest.raises(ValueError, match="^k is"):
        StepClock.from_dict({"step": 1, "position": -1, "reached": []}, "k")


def test_the_past_check_compares_the_segments_actually_served():
    saved = parse_schedule(_points("step", (0, [0.7, 0.3]), (3, [0.2, 0.8])), 2, "schedule", sum_to_one=False)
    same_weights_added = parse_schedule(_points("step", (0, [0.7, 0.3]), (2, [0.7, 0.3]), (3, [0.2, 0.8])), 2,
                                        "schedule", sum_to_one=False)
    assert "has a change point at step 2 where the run that saved this state, which has read to step 5, had none" \
        in past_change(saved, same_weights_added, 5)
    other = parse_schedule(_points("step", (0, [0.7, 0.3]), (3, [0.5, 0.5])), 2, "schedule", sum_to_one=False)
    assert past_change(saved, other, 5).startswith("schedule gives other weights at step 3 than the run that saved")
    assert past_change(saved, other, 3) is None  # step 3 not served yet: the future may change
    future = parse_schedule(_points("step", (0, [0.7, 0.3]), (3, [0.2, 0.8]), (9, [1, 0])), 2, "schedule",
                            sum_to_one=False)
    assert past_change(saved, future, 5) is None
    by_samples = parse_schedule(_points("samples", (0, [0.7, 0.3])), 2, "schedule", sum_to_one=False)
    assert "is by samples but the run that saved this state had a schedule by step" in past_change(saved, by_samples, 5)


def test_a_clock_started_over_at_position_0_keeps_earlier_points_at_0():
    clock = StepClock(4, 0, {}).advance([0, 6], 4, 32)  # a plan restarted at step 4 (new sources)
    assert clock.reached == {0: 0, 6: 8} and StepClock.from_dict(clock.as_dict(), "k") == clock


def test_the_text_mixture_refuses_points_it_would_read_as_steps():
    from llm.data.mix.choosers import check_schedule

    with pytest.raises(ValueError, match=r"^streaming_mixing_schedule is by samples, but the text mixture takes step"):
        check_schedule([{"samples": 0, "weights": [0.5, 0.5]}], 2, "weighted", None)
