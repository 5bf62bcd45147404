"""llm-train's default checkpoint_dir: `checkpoints/<config file name>`, so two configs' runs never share a folder.

A config (or `--set`, or Axolotl's `output_dir`) that names `checkpoint.checkpoint_dir` keeps it. A run
resuming from a checkpoint under the old shared default (`checkpoints/`) keeps writing there, so that
it continues where it was; anything else without the key goes to `checkpoints/<stem of --config-path>`.
"""

from __future__ import annotations

import os
from pathlib import Path

from llm.training.core.config import TrainConfig

OLD_DEFAULT = "checkpoints"  # every config's folder before the default followed the config's name


def default_folder(config_path: str | Path) -> str:
    """`checkpoints/<stem>`: configs/sft_local_demo.yaml -> checkpoints/sft_local_demo."""
    return f"{OLD_DEFAULT}/{Path(config_path).stem}"


def _resumes_from_old_default(resume: str | None) -> bool:
    """Whether `resume` names a checkpoint of a run written to `checkpoints/` itself (the old default)."""
    if not resume:
        return False
    from llm.training.checkpoint import resolve_checkpoint  # torch: imported only when resuming

    try:
        return resolve_checkpoint(resume).resolve().parent == Path(OLD_DEFAULT).resolve()
    except (FileNotFoundError, ValueError):
        return False  # the trainer names the missing or odd checkpoint


def with_run_folder(config: TrainConfig, config_path: str | Path) -> TrainConfig:
    """`config` with checkpoint_dir set to its default when the config and the flags left it out; says which."""
    checkpoint = config.checkpoint
    if "checkpoint_dir" in checkpoint.model_fields_set:  # the YAML, --set or output_dir named it (null too)
        return config
    if _resumes_from_old_default(checkpoint.resume_from_checkpoint):
        folder = OLD_DEFAULT
        why = (f"where the run of {checkpoint.resume_from_checkpoint} is: the default before it became "
               f"{default_folder(config_path)}")
    else:
        folder, why = default_folder(config_path), f"after the config file {Path(config_path).name}"
    if os.environ.get("RANK") in (None, "0"):  # one line per run, not one per torchrun rank
        print(f"llm-train: checkpoints go to {folder} ({why}; set checkpoint.checkpoint_dir, or "
              "--set checkpoint.checkpoint_dir=DIR, to choose)", flush=True)
    chosen = checkpoint.model_copy(update={"checkpoint_dir": folder})
    return config.model_copy(update={"checkpoint": chosen})
