"""Streaming fine-tuning data: instruction and chat records -> prompt/response tokens -> padded or packed batches.

Names are imported lazily, so that reading a config (`llm.data.sft.settings`) does not import torch.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "ALPACA_TEMPLATE": "llm.data.sft.prompts",
    "ALPACA_TEMPLATE_NO_INPUT": "llm.data.sft.prompts",
    "CHAT_TEMPLATE": "llm.data.sft.prompts",
    "AlpacaPrompter": "llm.data.sft.prompts",
    "ChatPrompter": "llm.data.sft.prompts",
    "CompletionPrompter": "llm.data.sft.prompts",
    "Prompter": "llm.data.sft.prompts",
    "StreamingDataCollator": "llm.data.sft.collator",
    "prompter_for": "llm.data.sft.prompts",
}

__all__ = sorted(_EXPORTS)


def __dir__() -> list[str]:
    return sorted({*globals(), *_EXPORTS})


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'llm.data.sft' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
