"""Axolotl's top-level config keys, mapped onto our sections, so an Axolotl user's YAML runs as written."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from llm.training.core.axolotl_keys import check_top_level
from llm.training.core.axolotl_pretrain import pretraining_keys
from llm.training.core.errors import ConfigError, KeysError

log = logging.getLogger(__name__)

# Axolotl key -> our dotted key
AXOLOTL_KEYS = {
    "datasets": "data.datasets",
    "test_datasets": "data.test_datasets",
    "sequence_len": "data.max_seq_len",
    "train_on_inputs": "data.train_on_inputs",
    "chat_template": "data.chat_template",
    "sample_packing": "data.sample_packing",
    "packing": "data.packing",  # ours (greedy | best_fit), beside Axolotl's sample_packing
    "packing_buffer": "data.packing_buffer",
    "streaming": "data.streaming",
    "streaming_dataset_mixing_strategy": "data.streaming_dataset_mixing_strategy",
    "streaming_mixing_weights": "data.streaming_mixing_weights",
    "streaming_buffer_per_dataset": "data.streaming_buffer_per_dataset",
    "streaming_mixing_unit": "data.streaming_mixing_unit",
    "streaming_mixing_schedule": "data.streaming_mixing_schedule",
    "dataset_processes": "data.num_workers",
    "tokenizer_config": "data.tokenizer_path",
    "micro_batch_size": "training.batch_size",
    "max_steps": "training.max_steps",
    "num_epochs": "training.epochs",
    "learning_rate": "training.lr",
    "warmup_steps": "training.warmup_steps",
    "weight_decay": "training.weight_decay",
    "max_grad_norm": "training.grad_clip",
    "cosine_min_lr_ratio": "training.min_lr_ratio",
    "seed": "training.seed",
    "eval_steps": "training.val_interval_steps",
    "logging_steps": "training.log_interval_steps",
    "output_dir": "checkpoint.checkpoint_dir",
    "save_steps": "checkpoint.save_interval_steps",
    "resume_from_checkpoint": "checkpoint.resume_from_checkpoint",
}
# Axolotl keys read here whose value decides whether they map (adamw_* is our AdamW, cosine our schedule)
TRAINER_KEYS = ("gradient_accumulation_steps", "bf16", "fp16", "optimizer", "lr_scheduler", "warmup_ratio")
OTHER_KEYS = ("pretraining_dataset", "val_set_size")
READABLE = (*AXOLOTL_KEYS, *TRAINER_KEYS, *OTHER_KEYS)
VAL_STREAMING = "Validation splits not supported for streaming datasets"


def axolotl_task(tree: dict[str, Any]) -> str | None:
    """The task an Axolotl YAML asks for: `datasets:` fine-tunes (sft), `pretraining_dataset:` pretrains (stream_lm)."""
    if tree.get("pretraining_dataset"):
        return "stream_lm"
    entries = tree.get("datasets")
    if isinstance(entries, list) and entries and all(isinstance(e, dict) and "data_source" in e for e in entries):
        return "stream_lm"  # our own text-source entries: a stream_lm mixture
    if "datasets" in tree:
        return "sft"
    return None


def _max_steps(tree: dict[str, Any]) -> Any:
    """max_steps, Axolotl's top-level key or our training.max_steps."""
    section = tree.get("training")
    return tree.get("max_steps") or (section.get("max_steps") if isinstance(section, dict) else None)


def _trainer_keys(tree: dict[str, Any]) -> tuple[dict[str, tuple[str, Any]], list[str]]:
    """Our dotted keys (with the Axolotl key and value) for Axolotl's trainer keys, and those with no equivalent."""
    mapped: dict[str, tuple[str, Any]] = {}
    refused: list[str] = []
    gas = tree.get("gradient_accumulation_steps")
    if gas not in (None, 1):
        refused.append(f"gradient_accumulation_steps={gas} (raise micro_batch_size instead)")
    if tree.get("bf16") in (True, "auto"):
        mapped["training.amp_dtype"] = ("bf16", "bf16")
    elif tree.get("fp16") is True:
        mapped["training.amp_dtype"] = ("fp16", "fp16")
    elif tree.get("bf16") is False:
        mapped["training.amp_dtype"] = ("bf16", "fp32")
    optimizer = tree.get("optimizer")
    if optimizer is not None and not str(optimizer).startswith("adamw"):
        refused.append(f"optimizer={optimizer} (llm-train's is AdamW: adamw_*)")
    scheduler = tree.get("lr_scheduler")
    if scheduler not in (None, "cosine"):
        refused.append(f"lr_scheduler={scheduler} (llm-train's is warmup + cosine)")
    ratio = tree.get("warmup_ratio")
    if ratio is not None and _max_steps(tree):
        mapped["training.warmup_steps"] = ("warmup_ratio", round(float(ratio) * int(_max_steps(tree))))
    elif ratio is not None:
        refused.append("warmup_ratio without max_steps (use warmup_steps)")
    return mapped, refused


def _streams(tree: dict[str, Any]) -> bool:
    """Whether the run streams: pretraining always; `datasets:` when streaming is set, or max_steps with it unset.

    Axolotl streams `datasets:` only on request; a YAML without streaming and max_steps reads
    its records one pass per epoch, as Axolotl does (max_steps alone keeps our streaming default).
    """
    if tree.get("pretraining_dataset"):
        return True
    data = tree.get("data") if isinstance(tree.get("data"), dict) else {}
    streaming = tree.get("streaming", data.get("streaming"))
    return bool(streaming) if streaming is not None else bool(_max_steps(tree))


def _val_set_size(tree: dict[str, Any], warn: Callable[[str], None]) -> dict[str, tuple[str, Any]]:
    """val_set_size as our data.val_set_size (a held-out split); on a stream, Axolotl's log line and nothing."""
    size = tree.get("val_set_size")
    if not size:
        return {}
    if _streams(tree):
        warn(VAL_STREAMING)  # what Axolotl logs; its streaming runs have no validation split either
        return {}
    return {"data.val_set_size": ("val_set_size", size)}


def _place(out: dict[str, Any], key: str, dotted: str, value: Any, source: str) -> None:
    section, name = dotted.split(".")
    target = out.setdefault(section, {})
    if not isinstance(target, dict):
        raise ConfigError(f"{source}: {section!r} must be a section (a mapping) to hold {key!r}")
    if name in target and target[name] != value:
        raise ConfigError(f"{source}: {key!r} and {dotted!r} are both set, to different values; keep one")
    target[name] = value


def from_axolotl(
    tree: dict[str, Any],
    source: str,
    ignore_unsupported: bool = False,
    warn: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """A config tree with Axolotl's top-level keys moved into our sections (a key set both ways is an error).

    Every top-level key that cannot be honoured is named in one ConfigError; with
    `ignore_unsupported` Axolotl's own keys are dropped with a warning instead.
    """
    warn = warn or log.warning
    if tree.get("pretraining_dataset") and "datasets" in tree:
        raise ConfigError(f"{source}: set datasets (fine-tuning) or pretraining_dataset (pretraining), not both")
    mapped, refused = _trainer_keys(tree)
    mapped.update(_val_set_size(tree, warn))
    if "datasets" in tree and not _streams(tree):
        mapped["data.streaming"] = ("streaming", False)
    try:
        tree = check_top_level(tree, READABLE, source, ignore_unsupported, warn, refused)
    except KeysError as exc:  # translate the rest too, so the caller can name its mistakes in the same error
        try:
            exc.rest = _translate(exc.rest or {}, mapped, source)
        except ConfigError as more:
            raise KeysError(f"{exc}; and {str(more).removeprefix(source + ': ')}") from None
        raise
    return _translate(tree, mapped, source)


def _translate(tree: dict[str, Any], mapped: dict[str, tuple[str, Any]], source: str) -> dict[str, Any]:
    """Our sections from the readable top-level keys (`mapped`: the trainer keys' dotted values)."""
    if tree.get("pretraining_dataset"):
        pretrain = pretraining_keys(tree["pretraining_dataset"], _max_steps(tree), source)
        mapped = {**mapped, **{dotted: ("pretraining_dataset", value) for dotted, value in pretrain.items()}}
    out = {k: (dict(v) if isinstance(v, dict) else v) for k, v in tree.items() if k not in READABLE}
    for key, dotted in AXOLOTL_KEYS.items():
        if key in tree:
            _place(out, key, dotted, tree[key], source)
            if key == "tokenizer_config":
                out["data"].setdefault("tokenizer_type", "hf")
    for dotted, (key, value) in mapped.items():
        if dotted == "data.steps_per_epoch":  # a data.steps_per_epoch the user set wins
            out.setdefault("data", {}).setdefault("steps_per_epoch", value)
        else:
            _place(out, key, dotted, value, source)
    return out
