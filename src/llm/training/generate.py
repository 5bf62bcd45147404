"""`llm-generate`: sample text from a checkpoint written by `llm-train`, with the tokenizer it was trained with.

The checkpoint carries its run's config: the model is rebuilt from `model:` (vocabulary from the
saved weights, context from `data.max_seq_len`) and the tokenizer from `data.tokenizer_type` /
`data.tokenizer_path` (a relative path is looked up from here, then from the folder the run was
started in).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import torch

from llm.training.cli_help import HelpFormatter, add_version

EPILOG = """examples:
  llm-generate --checkpoint checkpoints/demo/latest --prompt "sample line"
  llm-generate --checkpoint checkpoints/demo --prompt "def " --max-new-tokens 200 --temperature 0.8 --top-k 40
  llm-generate --checkpoint checkpoints/demo/step_10 --prompt "sample" --greedy

--checkpoint takes a step_<N> folder, a `latest` file or a checkpoint_dir. The text
(prompt + continuation) goes to stdout; a line about the checkpoint goes to stderr.
Sampling stops at the tokenizer's end-of-text token or after --max-new-tokens."""


def _tokenizer_spec(config: dict[str, Any], step_folder: Path) -> str:
    data = config.get("data", {})
    if data.get("tokenizer_type", "simple") == "simple":
        return "simple"
    spec = Path(str(data.get("tokenizer_path")))
    if spec.is_absolute() or spec.exists():
        return str(spec)
    # The run's cwd: the step folder's parent is checkpoint_dir as the run spelled it (relative to its cwd).
    ckpt_dir = Path(str(config.get("checkpoint", {}).get("checkpoint_dir") or ""))
    run_dir = step_folder.resolve().parent
    parts = ckpt_dir.parts
    if parts and not ckpt_dir.is_absolute() and run_dir.parts[-len(parts):] == parts:
        candidate = run_dir.parents[len(parts) - 1] / spec
        if candidate.exists():
            return str(candidate)
    return str(spec)


def load_for_generation(path: str | Path, device: str = "cpu") -> tuple[Any, Any, dict[str, Any]]:
    """(model in eval mode, tokenizer, checkpoint) from a checkpoint path."""
    from llm.data.tokenize.tokenizers import load_tokenizer
    from llm.training.checkpoint import load_checkpoint, resolve_checkpoint
    from llm.training.model import TransformerLM

    p = Path(path)
    if not p.exists():
        raise ValueError(f"checkpoint {path} does not exist; pass --checkpoint a step_<N> folder, its `latest` "
                         "file or a checkpoint_dir written by llm-train")
    folder = resolve_checkpoint(p, "--checkpoint")
    ckpt = load_checkpoint(folder, map_location=device)
    config = ckpt.get("config") or {}
    model_cfg, data_cfg = config.get("model", {}), config.get("data", {})
    state = ckpt["model_state_dict"]
    vocab, d_model = state["tok_emb.weight"].shape
    model = TransformerLM(
        vocab_size=vocab,
        max_seq_len=state["pos_emb.weight"].shape[0] if "pos_emb.weight" in state else data_cfg.get("max_seq_len", 512),
        d_model=d_model,
        n_layers=model_cfg.get("n_layers", 2),
        n_heads=model_cfg.get("n_heads", 4),
        d_ff=model_cfg.get("d_ff"),
    )
    model.load_state_dict(state)
    model.to(device).eval()
    tokenizer = load_tokenizer(_tokenizer_spec(config, folder))
    if tokenizer.vocab_size > vocab:
        raise ValueError(f"the tokenizer has {tokenizer.vocab_size} tokens but the model only {vocab}; "
                         "is data.tokenizer_path still the file the run was trained with?")
    return model, tokenizer, ckpt


# One sampling default for llm-generate, `generate()` and the demo: sampling from every token of a
# small model mostly picks rare byte tokens that decode to U+FFFD; the 5 likeliest at 0.8 read as text.
DEFAULT_TEMPERATURE = 0.8
DEFAULT_TOP_K = 5


@torch.no_grad()
def generate(model: Any, ids: list[int], max_new_tokens: int, temperature: float = DEFAULT_TEMPERATURE,
             top_k: int | None = DEFAULT_TOP_K,
             greedy: bool = False, eos_id: int | None = None, seed: int = 0) -> list[int]:
    """Continue `ids` by up to `max_new_tokens` tokens (stops after `eos_id`); returns the new ids."""
    device = next(model.parameters()).device
    generator = torch.Generator(device=device).manual_seed(seed)
    context = torch.tensor([ids], dtype=torch.long, device=device)
    new: list[int] = []
    for _ in range(max_new_tokens):
        logits, _ = model(context[:, -model.max_seq_len:])
        logits = logits[0, -1].float()
        if greedy:
            token = int(logits.argmax())
        else:
            logits = logits / temperature
            if top_k is not None and top_k < logits.numel():
                cutoff = torch.topk(logits, top_k).values[-1]
                logits = logits.masked_fill(logits < cutoff, float("-inf"))
            token = int(torch.multinomial(torch.softmax(logits, dim=-1), 1, generator=generator))
        if token == eos_id:
            break
        new.append(token)
        context = torch.cat([context, torch.tensor([[token]], device=device)], dim=1)
    return new


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="llm-generate", description="Sample text from a checkpoint written by llm-train.", epilog=EPILOG,
        formatter_class=HelpFormatter,
    )
    add_version(parser)
    parser.add_argument("--checkpoint", required=True, help="step_<N> folder, `latest` file or checkpoint_dir")
    parser.add_argument("--prompt", default="", help="text to continue (empty: start after an end-of-text token)")
    parser.add_argument("--max-new-tokens", type=int, default=100, help="tokens to add at most")
    parser.add_argument("--temperature", type=float, default=DEFAULT_TEMPERATURE, help="below 1: safer, above 1: more varied")
    parser.add_argument("--top-k", type=int, default=DEFAULT_TOP_K,
                        help="sample among the K likeliest tokens only (0: all tokens)")
    parser.add_argument("--greedy", action="store_true", help="always the likeliest token (ignores temperature, top-k)")
    parser.add_argument("--seed", type=int, default=0, help="sampling seed: the same seed gives the same text")
    parser.add_argument("--device", default="cpu", help="cpu, cuda, cuda:N or mps")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.max_new_tokens < 1:
            raise ValueError(f"--max-new-tokens must be at least 1, got {args.max_new_tokens}")
        if not args.greedy and args.temperature <= 0:
            raise ValueError(f"--temperature must be above 0, got {args.temperature} (use --greedy for the likeliest token)")
        if args.top_k < 0:
            raise ValueError(f"--top-k must be 0 (all tokens) or more, got {args.top_k}")
        model, tokenizer, ckpt = load_for_generation(args.checkpoint, args.device)
        prompt_ids = tokenizer.encode(args.prompt) if args.prompt else [tokenizer.eos_id]
        new = generate(model, prompt_ids, args.max_new_tokens, args.temperature, args.top_k or None, args.greedy,
                       tokenizer.eos_id, args.seed)
    except (ValueError, OSError, RuntimeError) as exc:
        print(f"llm-generate: error: {exc}", file=sys.stderr)
        return 2
    print(f"generate: {len(new)} new tokens from {ckpt['path']} (step {ckpt.get('step')})", file=sys.stderr)
    prompt_part = prompt_ids if args.prompt else []
    print(tokenizer.decode(prompt_part + new))
    return 0


if __name__ == "__main__":
    sys.exit(main())
