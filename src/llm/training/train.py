"""`llm-train` and `python -m llm.training.train` (for torchrun): flags, config, train, one-line errors."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from llm.data.inputs.errors import InputError
from llm.data.inputs.hub_reach import HubUnreachable
from llm.training.cli_help import HelpFormatter, add_version
from llm.training.cli_hints import for_llm_train
from llm.training.core.axolotl import axolotl_task
from llm.training.core.config import TrainConfig
from llm.training.core.loading import ConfigError, build_config, parse_override, read_yaml
from llm.training.core.task_check import check_hub_first, check_task
from llm.training.run_folder import with_run_folder
from llm.training.user_modules import import_user_modules, modules_to_import


def build_parser() -> argparse.ArgumentParser:
    """The `llm-train` argument parser (flags override the YAML)."""
    parser = argparse.ArgumentParser(
        prog="llm-train",
        description="Train a small decoder-only LM; run under torchrun for DDP. "
        "`llm-train plot RUN_DIR` draws a run's loss and throughput curves; `llm-train audit|why|spikes RUN_DIR` "
        "prove and explain a run from its ledger.",
        epilog=EPILOG,
        formatter_class=HelpFormatter,
    )
    add_version(parser)
    parser.add_argument(
        "--task", choices=["stream_lm", "lm", "sft"],
        help="default for an Axolotl YAML: sft when it has datasets:, stream_lm when it has pretraining_dataset:; "
        "stream_lm: text streamed from data.data_source (local files, hf, dedup_*, a data.datasets mixture), "
        "tokenized and packed on the fly, or optimized shards; lm: local text files tokenized once into cached "
        "shards; sft: instruction/chat records streamed and masked (Axolotl-style keys, docs/sft.md)",
    )
    parser.add_argument("--config-path", required=True, help="YAML file with data/model/training/checkpoint sections")
    parser.add_argument("--epochs", type=int, help="overrides training.epochs")
    parser.add_argument("--steps-per-epoch", type=int, help="overrides data.steps_per_epoch")
    parser.add_argument("--batch-size", type=int, help="overrides training.batch_size (per process)")
    parser.add_argument("--lr", type=float, help="overrides training.lr")
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="SECTION.KEY=VALUE",
        help="override any config key, e.g. --set checkpoint.checkpoint_dir=ckpt (repeatable; null sets None)",
    )
    parser.add_argument(
        "--import",
        dest="imports",
        action="append",
        default=[],
        metavar="MODULE",
        help="import this module first, e.g. one that registers a custom data_source with SOURCE_REGISTRY "
        "(repeatable; also the YAML's top-level import_modules: [...])",
    )
    parser.add_argument(
        "--ignore-unsupported",
        action="store_true",
        help="run an Axolotl YAML whose keys llm-train lacks (base_model, adapter, lora_*, ...) without them, "
        "with a warning naming them (unknown keys stay an error)",
    )
    parser.add_argument(
        "--overwrite",
        action="store_true",
        help="start over in a checkpoint_dir that holds another run (its checkpoints are replaced)",
    )
    return parser


EPILOG = """examples:
  llm-train --task stream_lm --config-path configs/streaming_local_demo.yaml --epochs 1 --steps-per-epoch 5
  llm-train --task lm --config-path configs/lm_local_demo.yaml --set checkpoint.checkpoint_dir=runs/a
  llm-train --task sft --config-path configs/sft_local_demo.yaml
  llm-train --config-path configs/axolotl_pretrain_demo.yaml   # an Axolotl YAML: task from its keys
  llm-train --task stream_lm --config-path my.yaml --import my_sources   # a custom data_source it registers
  llm-train plot checkpoints/demo          # loss and throughput curves of a run, as a PNG
  llm-train audit checkpoints/demo         # every sample trained exactly once? (also: why, spikes)
  llm-generate --checkpoint checkpoints/demo/latest --prompt "sample line"

tasks:
  stream_lm  pre-training on a stream: records from data.data_source (local, hf, dedup_local,
             dedup_hf) or a data.datasets mixture, tokenized and packed on the fly;
             data.steps_per_epoch is required
  lm         pre-training on local .txt/.jsonl/.parquet files, tokenized once into a cache
  sft        fine-tuning on instruction / chat / completion records (Axolotl-style keys:
             datasets, sequence_len, micro_batch_size, max_steps); prompts are not trained on
  stream_lm and lm also read `data_source: optimized`: token shards made by `llm-data optimize`
  (fastest, exact resume on any world size); see configs/optimized_demo.yaml.

Each run writes checkpoints and metrics.jsonl to checkpoint.checkpoint_dir; resume with
checkpoint.resume_from_checkpoint: DIR/latest. torchrun -m llm.training.train for DDP."""


def _distributed() -> bool:
    if "torch.distributed" not in sys.modules:
        return False
    import torch.distributed as dist

    return dist.is_available() and dist.is_initialized()


def _fail(message: str, code: int = 2) -> int:
    """One line on stderr; under torchrun, exit this rank at once.

    A failed rank must not wait for peers that may be inside a collective (or tear
    down a process group they still use); torchrun stops them when this rank exits.
    """
    rank = os.environ.get("RANK")
    prefix = f"llm-train (rank {rank})" if rank not in (None, "0") else "llm-train"
    print(f"{prefix}: error: {for_llm_train(message)}", file=sys.stderr)
    if _distributed():
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    return code


def _warn(message: str) -> None:
    print(f"llm-train: warning: {message}", file=sys.stderr)


def _task_of(tree: dict, path: str) -> str:
    """--task when not given: what an Axolotl YAML's keys ask for."""
    task = axolotl_task(tree)
    if task is None:
        raise ConfigError(f"--task is required for {path}: it has neither Axolotl's datasets: (sft) nor "
                          "pretraining_dataset: (stream_lm); pass --task stream_lm, lm or sft")
    return task


def finished_line(config: TrainConfig) -> str | None:
    """The line saying there is nothing to train, when the checkpoint resumed already reached max_steps.

    max_steps is the total, as in Axolotl and Hugging Face (the guide's epochs count from the resume).
    """
    max_steps, resume = config.training.max_steps, config.checkpoint.resume_from_checkpoint
    if not max_steps or not resume:
        return None
    from llm.training.checkpoint import resolve_checkpoint  # torch: imported only when resuming

    try:
        step = int(resolve_checkpoint(resume).name.removeprefix("step_"))  # folders are step_<N>
    except (FileNotFoundError, ValueError):
        return None  # the trainer names the missing or odd checkpoint
    if step < max_steps:
        return None
    return (f"llm-train: nothing to train: checkpoint {resume} is at step {step} and max_steps is {max_steps} "
            "(the total, as in Axolotl and Hugging Face); raise max_steps to train further")


def main(argv: Sequence[str] | None = None) -> int:
    """Parse flags, load the config, train; a user mistake is one line on stderr and exit 2."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["plot"]:  # `llm-train plot RUN_DIR`: a subcommand beside the (flag-only) training command
        from llm.training.plot import main as plot_main

        return plot_main(argv[1:])
    if argv[:1] and argv[0] in ("audit", "why", "spikes"):  # the run ledger's commands (ledger_cli.py)
        from llm.training.ledger_cli import main as ledger_main

        return ledger_main(argv)
    args = build_parser().parse_args(argv)
    flags = {
        "training.epochs": args.epochs,
        "data.steps_per_epoch": args.steps_per_epoch,
        "training.batch_size": args.batch_size,
        "training.lr": args.lr,
    }
    overrides = {key: value for key, value in flags.items() if value is not None}  # None: flag not given
    trainer, tree = None, {}
    try:
        for item in args.set:
            key, value = parse_override(item)
            overrides[key] = value  # None here is the user's `null`
        if os.path.isdir(args.config_path):
            raise ConfigError(f"--config-path {args.config_path} is a folder, not a file; pass a YAML file such as "
                              "configs/streaming_local_demo.yaml")
        tree = read_yaml(args.config_path)
        import_user_modules(modules_to_import(tree, args.imports, args.config_path), args.config_path)
        task = args.task or _task_of(tree, args.config_path)
        config = build_config(tree, overrides, args.config_path, args.ignore_unsupported, _warn)
        config = with_run_folder(config, args.config_path)  # no checkpoint_dir: checkpoints/<config name>
        check_task(config, task, args.config_path)  # the task before its keys; still no torch imported
        check_hub_first(config)  # an unreachable hub dataset is said before the model is built
        done = finished_line(config)
        if done:
            print(done)
            return 0
        from llm.training.trainer import Trainer

        trainer = Trainer(config, task, overwrite=args.overwrite)
        trainer.fit()
        trainer.close()
    except ConfigError as exc:
        return _fail(str(exc))
    except KeyboardInterrupt:
        last = trainer.last_checkpoint if trainer is not None else None
        where = f"; resume from {last}" if last else ""
        step = trainer.step if trainer is not None else 0
        return _fail(f"interrupted at step {step}{where}", code=130)
    except HubUnreachable as exc:  # an Axolotl YAML's user wrote pretraining_dataset, not data_source
        return _fail(exc.sentence("pretraining_dataset") if tree.get("pretraining_dataset") else str(exc))
    except (InputError, OSError, ValueError) as exc:
        # OSError: missing files and unreachable hubs (datasets raises ConnectionError).
        if os.environ.get("LLM_DEBUG"):
            raise
        return _fail(str(exc))
    return 0


if __name__ == "__main__":
    sys.exit(main())
