"""Streaming fine-tuning data: instruction and chat records -> prompt/response tokens -> padded or packed batches."""

from llm.data.sft.collator import StreamingDataCollator
from llm.data.sft.prompts import (
    ALPACA_TEMPLATE,
    ALPACA_TEMPLATE_NO_INPUT,
    CHAT_TEMPLATE,
    AlpacaPrompter,
    ChatPrompter,
    CompletionPrompter,
    Prompter,
    prompter_for,
)

__all__ = [
    "ALPACA_TEMPLATE",
    "ALPACA_TEMPLATE_NO_INPUT",
    "CHAT_TEMPLATE",
    "AlpacaPrompter",
    "ChatPrompter",
    "CompletionPrompter",
    "Prompter",
    "StreamingDataCollator",
    "prompter_for",
]
