"""What a training run reports: the start line, one line per logged step, the end summary and FitResult."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from llm.training.metrics import clock
from llm.training.model import count_parameters


@dataclass
class FitResult:
    """What a finished `fit()` reports (the trainer also logs it)."""

    steps: int
    epochs: int
    tokens: int
    seconds: float
    losses: list[float] = field(default_factory=list)
    val_losses: list[float] = field(default_factory=list)
    last_checkpoint: str | None = None


def start_line(trainer: Any) -> str:
    """Model size, processes, device and the run's length."""
    tc = trainer.config.training
    return (
        f"task {trainer.task}: {count_parameters(trainer.raw_model):,} parameters, vocab "
        f"{trainer.raw_model.vocab_size}, {trainer.env.world_size} process(es) on {trainer.device}, "
        f"{trainer.total_steps} steps of {tc.batch_size} x {trainer.config.data.max_seq_len} tokens per rank"
    )


def step_line(trainer: Any, mean_loss: float, epoch_end: bool, stats: dict[str, float]) -> str:
    """step, epoch (the one just finished at an epoch end), loss, lr, throughput, data wait, elapsed and ETA.

    tokens/s is this run's tokens over its time so far, so the last line agrees with the summary.
    """
    return (
        f"step {trainer.step}/{trainer.total_steps} | epoch {trainer.epoch + (0 if epoch_end else 1)} | "
        f"loss {mean_loss:.4f} | lr {trainer.scheduler.get_last_lr()[0]:.2e} | "
        f"tokens/s {stats['tokens_per_s']:,.0f} | data wait {stats['data_wait']:.0%} | "
        f"elapsed {clock(stats['elapsed_s'])} | eta {clock(stats['eta_s'])}"
        + (f" | slowest data rank {stats['data_wait_slowest_rank']:.0f} (wait p99 "
           f"{stats['data_wait_p99_ms_slowest_rank']:.1f} ms)" if "data_wait_slowest_rank" in stats else "")
    )


def summary_line(trainer: Any, result: FitResult, run_tokens: int) -> str:
    """The run's one-line summary: steps, tokens, time, throughput, final loss, last checkpoint."""
    final = f", final loss {result.losses[-1]:.4f}" if result.losses else ""
    saved = f", checkpoint {trainer.last_checkpoint}" if trainer.last_checkpoint else ""
    metrics = f", metrics {trainer.metrics_path}" if trainer.metrics_path else ""
    done = f"{trainer.epoch} {'epoch' if trainer.epoch == 1 else 'epochs'} done"
    if trainer.step_in_epoch:  # the step lines' epoch: the one in progress
        done += f", {trainer.step_in_epoch} of {trainer.steps_per_epoch} steps into epoch {trainer.epoch + 1}"
    return (
        f"trained {result.steps} steps to step {trainer.step} ({done}), "
        f"{run_tokens:,} tokens in {clock(result.seconds)} ({result.seconds:.1f} s, "
        f"{run_tokens / max(result.seconds, 1e-9):,.0f} tokens/s){final}{saved}{metrics}"
    )
