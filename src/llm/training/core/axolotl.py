"""Axolotl's top-level config keys, mapped onto our sections, so an Axolotl user's YAML needs few edits."""

from __future__ import annotations

from typing import Any

from llm.training.core.errors import ConfigError

# Axolotl key -> our dotted key
AXOLOTL_KEYS = {
    "datasets": "data.datasets",
    "test_datasets": "data.test_datasets",
    "sequence_len": "data.max_seq_len",
    "train_on_inputs": "data.train_on_inputs",
    "sample_packing": "data.sample_packing",
    "streaming": "data.streaming",
    "streaming_dataset_mixing_strategy": "data.streaming_dataset_mixing_strategy",
    "streaming_mixing_weights": "data.streaming_mixing_weights",
    "streaming_buffer_per_dataset": "data.streaming_buffer_per_dataset",
    "dataset_processes": "data.num_workers",
    "tokenizer_config": "data.tokenizer_path",
    "micro_batch_size": "training.batch_size",
    "max_steps": "training.max_steps",
    "num_epochs": "training.epochs",
    "learning_rate": "training.lr",
    "warmup_steps": "training.warmup_steps",
    "weight_decay": "training.weight_decay",
    "max_grad_norm": "training.grad_clip",
    "seed": "training.seed",
    "eval_steps": "training.val_interval_steps",
    "logging_steps": "training.log_interval_steps",
    "output_dir": "checkpoint.checkpoint_dir",
    "save_steps": "checkpoint.save_interval_steps",
    "resume_from_checkpoint": "checkpoint.resume_from_checkpoint",
}


def from_axolotl(tree: dict[str, Any], source: str) -> dict[str, Any]:
    """A config tree with Axolotl's top-level keys moved into our sections (a key set both ways is an error)."""
    out = {k: (dict(v) if isinstance(v, dict) else v) for k, v in tree.items() if k not in AXOLOTL_KEYS}
    for key, dotted in AXOLOTL_KEYS.items():
        if key not in tree:
            continue
        section, name = dotted.split(".")
        target = out.setdefault(section, {})
        if not isinstance(target, dict):
            raise ConfigError(f"{source}: {section!r} must be a section (a mapping) to hold {key!r}")
        if name in target and target[name] != tree[key]:
            raise ConfigError(f"{source}: {key!r} and {dotted!r} are both set, to different values; keep one")
        target[name] = tree[key]
        if key == "tokenizer_config":
            target.setdefault("tokenizer_type", "hf")
    return out
