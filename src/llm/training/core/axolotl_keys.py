"""Which top-level keys of an Axolotl YAML llm-train reads, which it knowingly lacks, and the one error naming the rest."""

from __future__ import annotations

import difflib
from collections.abc import Callable, Iterable
from typing import Any

from llm.training.core.errors import KeysError

SECTIONS = ("data", "model", "training", "checkpoint", "logging")

# Axolotl's documented keys (docs/config-reference) that have no equivalent here: a run that sets one
# to a value that asks for something fails, naming them all at once, unless --ignore-unsupported.
UNSUPPORTED = frozenset({
    # model loading and adapters
    "base_model", "base_model_config", "base_model_ignore_patterns", "revision_of_model", "model_type",
    "model_config_type", "tokenizer_type", "tokenizer_use_fast", "tokenizer_legacy", "tokenizer_save_jinja_files",
    "trust_remote_code", "processor_type", "resize_token_embeddings_to_32x", "is_llama_derived_model",
    "is_mistral_derived_model", "is_falcon_derived_model", "is_qwen_derived_model", "model_config",
    "overrides_of_model_config", "load_in_8bit", "load_in_4bit", "gptq", "bnb_config_kwargs",
    "adapter", "lora_model_dir", "lora_r", "lora_alpha", "lora_dropout", "lora_target_modules",
    "lora_target_linear", "lora_modules_to_save", "lora_fan_in_fan_out", "lora_on_cpu", "peft_use_dora",
    "peft_use_rslora", "peft_layer_replication", "peft", "relora_steps", "relora_warmup_steps",
    "relora_anneal_steps", "relora_prune_ratio", "relora_cpu_offload", "unfrozen_parameters",
    "merge_lora", "save_safetensors", "special_tokens", "tokens", "added_tokens_overrides",
    "chat_template_jinja", "default_system_message",
    # data preparation Axolotl does before training
    "dataset_prepared_path", "push_dataset_to_hub", "dataset_shard_num", "dataset_shard_idx",
    "dataset_keep_in_memory", "skip_prepare_dataset", "shuffle_merged_datasets", "pretrain_multipack_attn",
    "pretrain_multipack_buffer_size", "pad_to_sequence_len", "eval_sample_packing", "sample_packing_eff_est",
    "total_num_tokens", "group_by_length", "curriculum_sampling", "is_preprocess", "rl", "dpo_beta",
    "reward_model", "process_reward_model", "remove_unused_columns", "eval_table_size",
    "eval_max_new_tokens", "do_causal_lm_eval", "eval_causal_lm_metrics", "eval_strategy",
    "evaluation_strategy", "evals_per_epoch", "saves_per_epoch", "save_strategy", "save_total_limit",
    "save_only_model", "save_first_step", "max_memory", "gpu_memory_limit", "low_cpu_mem_usage",
    "early_stopping_patience", "loss_watchdog_threshold", "loss_watchdog_patience",
    # trainer and hardware
    "gradient_accumulation_steps", "eval_batch_size", "optimizer", "lr_scheduler", "lr_scheduler_kwargs",
    "warmup_ratio", "adam_beta1", "adam_beta2", "adam_epsilon", "lr_quadratic_warmup", "fp16", "bf16",
    "tf32", "fp8", "gradient_checkpointing", "gradient_checkpointing_kwargs", "flash_attention",
    "flash_attn_cross_entropy", "flash_attn_rms_norm", "flash_attn_fuse_qkv", "flash_attn_fuse_mlp",
    "xformers_attention", "sdp_attention", "s2_attention", "flash_optimum", "sample_packing_bin_size",
    "deepspeed", "fsdp", "fsdp_config", "fsdp_version", "torch_compile", "torch_compile_backend",
    "local_rank", "ddp_timeout", "ddp_bucket_cap_mb", "ddp_broadcast_buffers", "neftune_noise_alpha",
    "noisy_embedding_alpha", "rope_scaling", "auto_resume_from_checkpoints", "strict", "debug",
    "use_ray", "ray_num_workers", "plugins", "liger_rope", "liger_rms_norm", "liger_glu_activation",
    "liger_fused_linear_cross_entropy", "unsloth_lora_mlp", "unsloth_lora_qkv", "unsloth_lora_o",
    "context_parallel_size", "sequence_parallel_degree", "dataloader_num_workers",
    "dataloader_prefetch_factor", "dataloader_pin_memory", "torchdistx_path", "max_packed_sequence_len",
    # logging and the hub
    "hub_model_id", "hub_strategy", "hf_use_auth_token", "wandb_mode", "wandb_project", "wandb_entity",
    "wandb_watch", "wandb_name", "wandb_run_id", "wandb_log_model", "mlflow_tracking_uri",
    "mlflow_experiment_name", "mlflow_run_name", "use_mlflow", "comet_api_key", "comet_workspace",
    "comet_project_name", "use_tensorboard", "include_tokens_per_second", "profiler_steps",
})


def asks_for_nothing(value: Any) -> bool:
    """An empty Axolotl key (`lora_model_dir:`, `load_in_8bit: false`) is the same as leaving it out."""
    return value is None or value is False or (isinstance(value, str | list | dict) and not value)


def close_key(name: str, valid: Iterable[str]) -> str | None:
    """The valid key `name` is most likely a misspelling of (difflib's closest match), if any."""
    close = difflib.get_close_matches(name, sorted(set(valid)), n=1)
    return close[0] if close else None


def did_you_mean(shown: list[str], names: list[str], valid: Iterable[str], where: str, listed: str) -> str:
    """'unknown key 'x' in WHERE (did you mean 'y'?); valid keys are: LISTED' (several keys: a hint after each).

    The hint stands right after the key it corrects, before the (long) list of valid keys.
    """
    hints = [close_key(name, valid) for name in names]
    keys = ", ".join(f"{key!r} (did you mean {hint!r}?)" if hint else repr(key) for key, hint in zip(shown, hints))
    return f"unknown key{'s' if len(shown) > 1 else ''} {keys} {where}; valid keys are: {listed}"


def check_top_level(
    tree: dict[str, Any],
    readable: Iterable[str],
    source: str,
    ignore_unsupported: bool,
    warn: Callable[[str], None],
    refused: Iterable[str] = (),
) -> dict[str, Any]:
    """`tree` without the keys it may drop; every key llm-train cannot honour named in ONE error.

    `readable`: the top-level keys translated elsewhere; `refused`: readable keys whose value is
    not supported (e.g. `optimizer: lion`), named beside the unsupported keys.
    """
    readable = set(readable) | set(SECTIONS)
    unknown = sorted(k for k in tree if k not in readable and k not in UNSUPPORTED)
    unsupported = [k for k in tree if k in UNSUPPORTED and k not in readable and not asks_for_nothing(tree[k])]
    unsupported += list(refused)
    parts = []
    if unsupported and not ignore_unsupported:
        parts.append(f"Axolotl keys llm-train does not support ({', '.join(unsupported)})")
    if unknown:
        listed = f"{', '.join(SECTIONS)} (sections) or Axolotl's keys (docs/sft.md)"
        parts.append(did_you_mean(unknown, unknown, readable | UNSUPPORTED, "at the top level", listed))
    if parts:
        # an unknown key's fix is its hint (or the listing); the Axolotl keys are removed or ignored
        fix = "" if ignore_unsupported or not unsupported else \
            "; remove them, or pass --ignore-unsupported to run without the Axolotl ones"
        rest = {k: v for k, v in tree.items() if k in readable}
        raise KeysError(f"{source}: {'; '.join(parts)}{fix}", rest)
    if unsupported:
        warn(f"{source}: ignoring Axolotl keys llm-train does not support: {', '.join(unsupported)}"
             + _without_base_model(tree, unsupported))
    return {k: v for k, v in tree.items() if k in readable}


def _without_base_model(tree: dict[str, Any], ignored: list[str]) -> str:
    """What an ignored base_model leaves: a new model, tokenized by the byte tokenizer unless one is set."""
    if "base_model" not in ignored:
        return ""
    data = tree.get("data") if isinstance(tree.get("data"), dict) else {}
    tokenizer = tree.get("tokenizer_config") or data.get("tokenizer_path")
    if tokenizer:
        return f"; without base_model this run trains a new model from scratch, with the tokenizer {tokenizer}"
    return ("; without base_model this run trains a new model from scratch with the byte tokenizer "
            "(data.tokenizer_type: simple), not base_model's; set tokenizer_config: PATH (data.tokenizer_path: a "
            "tokenizer.json or its folder) to use that tokenizer")
