"""Prompt formats: a record -> segments of text, each marked as prompt (not trained on) or target.

One class per format (`alpaca`, `chat`, `completion`), chosen by name with
`prompter_for`. Segments keep the prompt/response boundary exact, so the
collator can mask prompt tokens whatever the tokenizer does at the seam.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any, Protocol

from llm.data.text.errors import InputError

Segment = tuple[str, bool]  # (text, is_target)
log = logging.getLogger(__name__)

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
    append_eos: bool  # whether the collator ends the sample with EOS (a chat template writes its own)

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
    append_eos = True

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
    append_eos = True

    def __init__(self, field: str | None = None):
        self.field = field

    def segments(self, record: dict[str, Any]) -> list[Segment]:
        field = self.field or ("text" if "text" in record else "content")
        return [(_text(record, field), True)]


class ChatTemplateError(InputError):
    """A chat template that cannot be used (syntax, a sandbox violation, an unreadable config); names its origin."""


class TemplateRefused(Exception):
    """`raise_exception(message)` called by a chat template (Hugging Face defines it for templates)."""


def _raise_exception(message: str) -> None:
    raise TemplateRefused(message)


def compile_template(template: str, origin: str) -> Any:
    """The template compiled in Jinja's immutable sandbox, with HF's `raise_exception`; a syntax error names `origin`."""
    from jinja2 import TemplateSyntaxError
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = _raise_exception
    try:
        return env.from_string(template)
    except TemplateSyntaxError as e:
        raise ChatTemplateError(f"the chat template of {origin} has a Jinja syntax error at line {e.lineno} "
                                f"({e.message}); fix the template") from None


def read_tokenizer_config(tokenizer: Any) -> tuple[dict[str, Any], str]:
    """The `tokenizer_config.json` beside the tokenizer's file ({} when none) and its path, for messages."""
    path = getattr(tokenizer, "path", None)  # the byte tokenizer has no file, so no config
    config = Path(path).parent / "tokenizer_config.json" if path else None
    if config is None or not config.is_file():
        return {}, "the built-in layout"
    try:
        data = json.loads(config.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ChatTemplateError(f"{config} is not valid JSON ({e}); fix the file or remove it") from None
    if not isinstance(data, dict):
        raise ChatTemplateError(f"{config} holds a {type(data).__name__}, expected a JSON object; fix the file")
    return data, str(config)


def pick_template(template: Any, origin: str, name: str = "default") -> str | None:
    """A config's `chat_template`: a string, or HF's named list [{name, template}, ...] (`name` picked, said so)."""
    if template is None or isinstance(template, str):
        return template
    named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)} if isinstance(template, list) else {}
    if name not in named or not isinstance(named[name], str):
        raise ChatTemplateError(f"{origin}: chat_template has no template named {name!r} (it has: "
                                f"{', '.join(map(str, named)) or 'none'}); name one of them in the entry's chat_template")
    if len(named) > 1:
        log.warning("%s: using the chat template named %r of %s", origin, name, ", ".join(map(str, named)))
    return named[name]


class ChatPrompter:
    """`messages: [{role, content}, ...]`; assistant turns (header included) are targets, the rest is prompt.

    With a Jinja chat template (a tokenizer's `tokenizer_config.json` `chat_template`),
    the conversation is rendered by it and each message's span is found by rendering
    the conversation up to it and up to the one before; without one, the built-in
    `CHAT_TEMPLATE` is used.
    """

    name = "chat"
    append_eos = True

    def __init__(self, chat_template: str | None = None, field: str = "messages", origin: str = "the config"):
        self.chat_template = chat_template
        self.field = field
        self.origin = origin
        self.eos_text = ""
        self._compiled = compile_template(chat_template, origin) if chat_template is not None else None

    @classmethod
    def for_tokenizer(cls, tokenizer: Any) -> ChatPrompter:
        """Use the chat template of the `tokenizer_config.json` beside the tokenizer's file, if any."""
        config, origin = read_tokenizer_config(tokenizer)
        return cls(pick_template(config.get("chat_template"), origin), origin=origin)

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
        from jinja2 import TemplateError
        from jinja2.sandbox import SecurityError

        try:
            return self._compiled.render(messages=messages, add_generation_prompt=False, bos_token="",
                                         eos_token=self.eos_text)
        except TemplateRefused as e:
            raise RecordError(f"the chat template of {self.origin} refused this conversation: {e}") from None
        except SecurityError as e:  # the template, not the record, is at fault: stop
            raise ChatTemplateError(f"the chat template of {self.origin} did something the sandbox forbids ({e}); "
                                    "fix the template") from None
        except TemplateError as e:
            raise RecordError(f"the chat template of {self.origin} failed on this conversation ({e})") from None

    def spans(self, messages: list[dict[str, str]]) -> list[str]:
        """Each message's rendered text: the conversation up to it, minus the conversation before it."""
        out, before = [], ""
        for i in range(len(messages)):
            upto = self._render(messages[: i + 1])
            if not upto.startswith(before):
                raise RecordError(f"the chat template of {self.origin} does not render a conversation as a prefix "
                                  "of its continuation, so turns cannot be masked")
            out.append(upto[len(before):])
            before = upto
        return out

    def segments(self, record: dict[str, Any]) -> list[Segment]:
        messages = self._messages(record)
        if self.chat_template is None:
            return [(CHAT_TEMPLATE.format(**m), m["role"] == "assistant") for m in messages]
        return [(span, m["role"] == "assistant") for span, m in zip(self.spans(messages), messages)]


PROMPTERS = {"alpaca": AlpacaPrompter, "chat": ChatPrompter, "completion": CompletionPrompter}


def prompter_for(kind: str, tokenizer: Any = None) -> Prompter:
    """The prompter for a dataset `type` (`alpaca`, `chat`, `completion`); an unknown one lists the valid names."""
    if kind not in PROMPTERS:
        raise ValueError(f"dataset type {kind!r} is not known; use one of: {', '.join(PROMPTERS)}")
    if kind == "chat":
        return ChatPrompter.for_tokenizer(tokenizer) if tokenizer is not None else ChatPrompter()
    return PROMPTERS[kind]()
