"""Prompt formats: a record -> segments of text, each marked as prompt (not trained on) or target.

One class per format (`alpaca`, `chat`, `completion`), chosen by name with
`prompter_for`. Segments keep the prompt/response boundary exact, so the
collator can mask prompt tokens whatever the tokenizer does at the seam.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Protocol

Segment = tuple[str, bool]  # (text, is_target)

ALPACA_TEMPLATE = (
    "Below is an instruction that describes a task, paired with an input that provides further context. "
    "Write a response that appropriately completes the request.\n\n"
    "### Instruction:\n{instruction}\n\n### Input:\n{input}\n\n### Response:\n"
)
ALPACA_TEMPLATE_NO_INPUT = (
    "Below is an instruction that describes a task. Write a response that appropriately completes the request.\n\n"
    "### Instruction:\n{instruction}\n\n### Response:\n"
)
# The built-in chat layout, used when the tokenizer ships no chat template: one block per message.
CHAT_TEMPLATE = "<|{role}|>\n{content}\n"
_ROLES = ("system", "user", "assistant", "tool")


class RecordError(ValueError):
    """A record that does not fit its prompt format; the message names the field."""


class Prompter(Protocol):
    """Turns one raw record into segments; the collator tokenizes them."""

    name: str

    def segments(self, record: dict[str, Any]) -> list[Segment]: ...


def _text(record: dict[str, Any], key: str, required: bool = True) -> str:
    value = record.get(key)
    if value is None and not required:
        return ""
    if not isinstance(value, str):
        got = "missing" if value is None else f"a {type(value).__name__}"
        raise RecordError(f"record field {key!r} is {got}, expected a string (record keys: {', '.join(sorted(record))})")
    return value


class AlpacaPrompter:
    """`instruction`, optional `input`, `output`: the Stanford Alpaca template; the output is the target."""

    name = "alpaca"

    def segments(self, record: dict[str, Any]) -> list[Segment]:
        instruction, extra = _text(record, "instruction"), _text(record, "input", required=False)
        output = _text(record, "output")
        if extra.strip():
            prompt = ALPACA_TEMPLATE.format(instruction=instruction, input=extra)
        else:
            prompt = ALPACA_TEMPLATE_NO_INPUT.format(instruction=instruction)
        return [(prompt, False), (output, True)]


class CompletionPrompter:
    """Plain text (`text`, else `content`): every token is a target."""

    name = "completion"

    def __init__(self, field: str | None = None):
        self.field = field

    def segments(self, record: dict[str, Any]) -> list[Segment]:
        field = self.field or ("text" if "text" in record else "content")
        return [(_text(record, field), True)]


class ChatPrompter:
    """`messages: [{role, content}, ...]`; assistant turns are targets, everything else is prompt.

    With a Jinja chat template (a tokenizer's `tokenizer_config.json` `chat_template`),
    the conversation is rendered by it and each message's span is found by rendering
    the conversation up to it and up to the one before; without one, the built-in
    `CHAT_TEMPLATE` is used.
    """

    name = "chat"

    def __init__(self, chat_template: str | None = None, field: str = "messages"):
        self.chat_template = chat_template
        self.field = field
        self._compiled: Any = None

    @classmethod
    def for_tokenizer(cls, tokenizer: Any) -> ChatPrompter:
        """Use the chat template of the `tokenizer_config.json` beside the tokenizer's file, if any."""
        path = getattr(tokenizer, "path", None)
        config = Path(path).parent / "tokenizer_config.json" if path else None
        template = None
        if config is not None and config.is_file():
            template = json.loads(config.read_text(encoding="utf-8")).get("chat_template")
        return cls(template if isinstance(template, str) else None)

    def _messages(self, record: dict[str, Any]) -> list[dict[str, str]]:
        messages = record.get(self.field)
        if not isinstance(messages, list) or not messages:
            raise RecordError(f"record field {self.field!r} must be a non-empty list of {{role, content}} messages")
        for i, m in enumerate(messages):
            if not isinstance(m, dict) or m.get("role") not in _ROLES or not isinstance(m.get("content"), str):
                raise RecordError(
                    f"message {i} of {self.field!r} must be {{role: one of {', '.join(_ROLES)}, content: string}}, got {m!r}"
                )
        return messages

    def _render(self, messages: list[dict[str, str]]) -> str:
        if self._compiled is None:
            from jinja2.sandbox import ImmutableSandboxedEnvironment

            env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
            self._compiled = env.from_string(self.chat_template)
        return self._compiled.render(messages=messages, add_generation_prompt=False, bos_token="", eos_token="")

    def segments(self, record: dict[str, Any]) -> list[Segment]:
        messages = self._messages(record)
        if self.chat_template is None:
            return [(CHAT_TEMPLATE.format(**m), m["role"] == "assistant") for m in messages]
        out: list[Segment] = []
        before = ""
        for i, m in enumerate(messages):
            upto = self._render(messages[: i + 1])
            if not upto.startswith(before):
                raise RecordError("the chat template does not render a conversation as a prefix of its continuation")
            out.append((upto[len(before):], m["role"] == "assistant"))
            before = upto
        return out


PROMPTERS = {"alpaca": AlpacaPrompter, "chat": ChatPrompter, "completion": CompletionPrompter}


def prompter_for(kind: str, tokenizer: Any = None) -> Prompter:
    """The prompter for a dataset `type` (`alpaca`, `chat`, `completion`); an unknown one lists the valid names."""
    if kind not in PROMPTERS:
        raise ValueError(f"dataset type {kind!r} is not known; use one of: {', '.join(PROMPTERS)}")
    if kind == "chat":
        return ChatPrompter.for_tokenizer(tokenizer) if tokenizer is not None else ChatPrompter()
    return PROMPTERS[kind]()
