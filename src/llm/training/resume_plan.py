"""Where a resumed run's schedule goes, and the one line saying so: how many more steps, to which step, and why.

Every number in the line is the one the run then trains: a finished checkpoint starts a new
cycle of `epochs`, max_steps (the total, as in Axolotl and Hugging Face) can cut it, and a
changed global batch can move its end (elastic.py); the line is written after all three.
"""

from __future__ import annotations

from typing import Any

from llm.training.elastic import after_batch_change


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def restore_schedule(trainer: Any, ckpt: dict[str, Any]) -> None:
    """Set `trainer`'s schedule (cycle, total, warmup, learning rate) for the resumed run and log its plan."""
    tc, schedule, step = trainer.config.training, trainer.schedule, trainer.step
    where = ckpt.get("path", "(in memory)")
    cycle_start = int(ckpt.get("cycle_start", 0))
    trainer.cycle_epoch = int(ckpt.get("cycle_epoch", 0))
    finished = step >= int(ckpt.get("total_steps", 0))
    if finished:
        # The checkpoint finished its schedule: the same command trains `epochs` more.
        cycle_start, trainer.cycle_epoch, trainer.step_in_epoch = step, trainer.epoch, 0
        trainer.scheduler.base_lrs = [tc.lr for _ in trainer.optimizer.param_groups]
        for group in trainer.optimizer.param_groups:
            group["initial_lr"] = tc.lr
    schedule.cycle_start = cycle_start
    schedule.total = cycle_start + trainer.planned_steps
    clipped = tc.max_steps is not None and schedule.total > tc.max_steps
    if clipped:
        schedule.total = max(tc.max_steps, step)
    # another global batch: the pass ends where its data ends (elastic.py)
    change = after_batch_change(ckpt, tc.batch_size * trainer.env.world_size, trainer.data.batches_left_in_pass(),
                                trainer.steps_per_epoch, step, trainer.epoch - trainer.cycle_epoch, tc.epochs,
                                tc.max_steps)
    if change is not None:
        trainer.step_in_epoch, schedule.total, message = change
        trainer.log(message)
    line = plan_line(where, step, schedule.total, finished, clipped, tc.max_steps, tc.epochs)
    if line:
        trainer.log(line)
    schedule.warmup = tc.warmup_steps
    schedule.min_ratio = tc.min_lr_ratio
    for group, base in zip(trainer.optimizer.param_groups, trainer.scheduler.base_lrs):
        group["lr"] = base * schedule(step)
    trainer.scheduler._last_lr = [g["lr"] for g in trainer.optimizer.param_groups]


def plan_line(where: str, step: int, total: int, finished: bool, clipped: bool, max_steps: int | None,
              epochs: int) -> str | None:
    """What the resume trains, in the numbers it trains (None: an interrupted run simply continues).

    `clipped`: max_steps ends the run before its `epochs` (then they are not promised).
    """
    more = f"training {_plural(total - step, 'more step')}, to step {total}"
    if total <= step:
        more = f"nothing to train (step {step})"
    why = f"max_steps {max_steps} is the total (as in Axolotl and Hugging Face)"
    if finished:
        what = more if clipped else f"{more} ({_plural(epochs, 'epoch')})"
        return f"checkpoint {where} had finished its schedule; {what}" + (f": {why}" if clipped else "")
    if clipped:
        return f"{why}: {more}"
    return None
