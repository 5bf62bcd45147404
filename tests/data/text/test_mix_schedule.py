"""Weight schedules of text mixtures (`streaming_mixing_schedule`): each segment's shares, exact resume across
a switch, a schedule changed on resume for the future only, and the schedule's own checks."""

from __future__ import annotations

import multiprocessing

import numpy as np
import pytest

from llm.data.mix.schedule import RAMP_STEPS, parse_schedule
from llm.data.stage import StateError
from llm.data.text.stream import StreamingTextDataModule, merge_stream_states
from llm.training.core.data_config import DataConfig
from tests.data.text.test_token_mixing import count_by_source, write_corpora
from tests.resume import (
    assert_same_steps,
    attach,
    check_refused_state_changes_nothing,
    check_resume,
    take_steps,
)

SWITCH = [{"step": 0, "weights": [0.9, 0.1]}, {"step": 20, "weights": [0.2, 0.8]}]


def make(config: dict, rank: int | None = None, world: int | None = None) -> StreamingTextDataModule:
    data = DataConfig(datasets=[{"dataset_path": p} for p in config["paths"]], max_seq_len=config.get("L", 32),
                      num_workers=config.get("workers", 0), streaming_dataset_mixing_strategy="weighted",
                      streaming_mixing_unit=config.get("unit", "tokens"), streaming_mixing_schedule=config["schedule"])
    return StreamingTextDataModule(data, batch_size=config.get("batch", 2), rank=rank, world_size=world,
                                   steps_per_epoch=config.get("steps", 50), loop=False)


def run_schedule(config: dict, state: dict | None, steps: int | None):
    """resume.py protocol (one rank)."""
    multiprocessing.set_start_method("fork", force=True)
    m = attach(make(config), config)
    if state is not None:
        m.load_state_dict(state)
    out, left = [], config.get("steps", 50) - m.progress.step  # the run ends at step 50, resumed or not
    batches = iter(m.train_dataloader())
    while len(out) < min(left, steps if steps is not None else left):  # never pull a batch not taken
        batch = next(batches, None)
        if batch is None:
            break
        out.append({k: batch[k].numpy() for k in ("input_ids", "labels")})
    return out, m.state_dict()


def share_of_short(batches: list[dict]) -> float:
    counted = count_by_source(batches)
    return counted["short"][0] / (counted["short"][0] + counted["long"][0])


def test_each_segment_follows_its_own_weights(tmp_path):
    schedule = [SWITCH[0], {"step": 100, "weights": [0.2, 0.8]}]
    m = make({"paths": write_corpora(tmp_path, 6000, 400), "schedule": schedule, "L": 64, "batch": 4, "steps": 200})
    batches = list(m.train_dataloader())
    assert len(batches) == 200
    # the new shares count from the switch: the first segment's surplus is not "paid back"
    assert abs(share_of_short(batches[:100]) - 0.9) < 0.02
    assert abs(share_of_short(batches[100:]) - 0.2) < 0.02
    assert m.state_dict()["step"] == 200


@pytest.mark.parametrize("unit, interpolate", [("tokens", None), ("records", "linear")])
def test_stop_and_resume_across_a_switch_equals_the_straight_run(tmp_path, unit, interpolate):
    schedule = [dict(SWITCH[0], **({"interpolate": interpolate} if interpolate else {})), SWITCH[1]]
    config = {"paths": write_corpora(tmp_path, 600, 40), "schedule": schedule, "unit": unit}
    check_resume(run_schedule, config, stops=[13, 20, 21, 33], fresh_process=False)


def test_a_switch_with_workers_resumes_exactly(tmp_path):
    config = {"paths": write_corpora(tmp_path, 600, 40), "schedule": SWITCH, "workers": 2}
    check_resume(run_schedule, config, stops=[19, 27], fresh_process=False)


@pytest.mark.slow
def test_a_switch_resumes_exactly_in_fresh_processes(tmp_path):
    config = {"paths": write_corpora(tmp_path, 600, 40), "schedule": SWITCH}
    check_resume(run_schedule, config, stops=[21])  # one step after the switch


def test_a_schedule_changed_on_resume_for_the_future_equals_that_schedule_straight(tmp_path):
    paths = write_corpora(tmp_path, 600, 40)
    later = [SWITCH[0], {"step": 30, "weights": [0.2, 0.8]}]
    head, state = run_schedule({"paths": paths, "schedule": later}, None, 15)
    tail, _ = run_schedule({"paths": paths, "schedule": SWITCH}, state, None)
    straight, _ = run_schedule({"paths": paths, "schedule": SWITCH}, None, None)
    assert_same_steps(head + tail, straight, "schedule moved from step 30 to 20 at step 15")


def test_a_schedule_that_rewrites_the_past_is_refused_in_one_sentence(tmp_path):
    paths = write_corpora(tmp_path, 600, 40)
    _, state = run_schedule({"paths": paths, "schedule": SWITCH}, None, 25)
    later = make({"paths": paths, "schedule": [SWITCH[0], {"step": 30, "weights": [0.2, 0.8]}]})
    with pytest.raises(StateError, match="^streaming_mixing_schedule gives other weights at step 20 than the run that "
                                         "saved this state, which has read to step 25; change the schedule only from "
                                         "step 25 on$"):
        later.load_state_dict(state)
    fresh = make({"paths": paths, "schedule": [SWITCH[0], {"step": 30, "weights": [0.2, 0.8]}]})
    check_refused_state_changes_nothing(later, state, lambda m: take_steps(m.train_dataloader(), 35), fresh)


def test_a_plain_weights_state_resumes_under_a_schedule_that_keeps_its_past(tmp_path):
    paths = write_corpora(tmp_path, 600, 40)
    data = DataConfig(datasets=[{"dataset_path": p} for p in paths], max_seq_len=32, streaming_mixing_unit="tokens",
                      streaming_dataset_mixing_strategy="weighted", streaming_mixing_weights=[0.9, 0.1])
    plain = StreamingTextDataModule(data, batch_size=2, steps_per_epoch=10, loop=False)
    list(plain.train_dataloader())
    state = merge_stream_states([plain.state_dict()])
    make({"paths": paths, "schedule": SWITCH}).load_state_dict(state)  # steps 0..9 had [0.9, 0.1]: accepted
    with pytest.raises(StateError, match="at step 0 than the run"):
        make({"paths": paths, "schedule": [{"step": 0, "weights": [0.5, 0.5]}]}).load_state_dict(state)


def test_a_linear_ramp_moves_in_even_steps():
    schedule = parse_schedule([{"step": 0, "weights": [1, 0], "interpolate": "linear"},
                               {"step": 1000, "weights": [0, 1]}], 2)
    assert len(schedule.change_points()) == RAMP_STEPS + 1
    assert schedule.weights_at(0) == [1.0, 0.0] and schedule.weights_at(5000) == [0.0, 1.0]
    assert np.allclose(schedule.weights_at(505), [0.5, 0.5])  # the ramp's change point at 500 holds to 509
    assert schedule.next_change(505) == 510
